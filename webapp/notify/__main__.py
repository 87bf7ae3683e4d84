"""``python -m webapp.notify [--listen HOST:PORT]``: the notification service, in the foreground.

DATABASE_URL from the environment; the listen address from ``--listen``, else LAB_NOTIFY_LISTEN,
else 127.0.0.1:8025. Werkzeug's threaded server: one thread per request, so two concurrent
requests with one key really race (and the key's primary key decides). SIGTERM stops it.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from werkzeug.serving import make_server

from ..settings import database_url, environment_settings
from ..store.service_heartbeats import NOTIFICATION_SERVICE, Beater
from .protocol import DEFAULT_LISTEN
from .service import create_service


def parse_listen(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"give HOST:PORT, like {DEFAULT_LISTEN} (got {value!r})")
    return host, int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.notify")
    parser.add_argument("--listen", type=parse_listen,
                        default=parse_listen(environment_settings().LAB_NOTIFY_LISTEN or DEFAULT_LISTEN))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s notify[{os.getpid()}] %(message)s")
    url = database_url()
    if not url:
        print("DATABASE_URL must be set", file=sys.stderr)
        return 2
    host, port = args.listen
    server = make_server(host, port, create_service(url), threaded=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    serving = threading.Thread(target=server.serve_forever, name="notify http", daemon=True)
    serving.start()
    logging.info("notification service listening on http://%s:%d", host, port)
    # Beats while its HTTP server runs: the dashboard shows it down within 5 s of its last beat.
    beater = Beater(url, NOTIFICATION_SERVICE, alive=serving.is_alive).start()
    stop.wait()
    beater.stop()
    server.shutdown()
    server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
