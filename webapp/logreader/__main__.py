"""``python -m webapp.logreader``: mirror every lab topic until SIGTERM or SIGINT."""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from ..settings import load_config
from .reader import LogReader


def main() -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s logreader[{os.getpid()}] %(levelname)s %(message)s")
    config = load_config()
    if not config["DATABASE_URL"] or not config["KAFKA_BOOTSTRAP_SERVERS"]:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_term(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    LogReader(config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"]).run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
