"""``python -m webapp.logreader``: mirror every lab topic until SIGTERM or SIGINT.

Started by the lab agent (webapp/agent/processes.py, ``Sidecar``), which passes DATABASE_URL and
KAFKA_BOOTSTRAP_SERVERS. Around a lab's drop or reset the agent holds the reader off Kafka
instead of stopping the process (a restart costs a second of imports and a new client), by the
hold protocol of domain/vocabulary.py: SIGUSR1 closes the Kafka consumer and answers HOLD_DONE;
SIGUSR2 lets it read again, each lab from its table.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

from .. import settings
from ..domain.vocabulary import HOLD_ACK_FD, HOLD_DONE, HOLD_READY
from ..store.service_heartbeats import LOG_READER, Beater
from .reader import LogReader


def main() -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s logreader[{os.getpid()}] %(levelname)s %(message)s")
    database_url, bootstrap_servers = settings.database_url(), settings.environment_settings().KAFKA_BOOTSTRAP_SERVERS
    if not database_url or not bootstrap_servers:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set", file=sys.stderr)
        return 2
    stop = threading.Event()
    reader = LogReader(database_url, bootstrap_servers)
    ack_fd = int(os.environ[HOLD_ACK_FD]) if os.environ.get(HOLD_ACK_FD) else None
    if ack_fd is not None:
        reader.on_held = lambda: os.write(ack_fd, HOLD_DONE)

    def on_term(signum, frame):
        stop.set()
        reader.release()  # a held reader must get out of its wait to stop
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    signal.signal(signal.SIGUSR1, lambda signum, frame: reader.hold())
    signal.signal(signal.SIGUSR2, lambda signum, frame: reader.release())
    if ack_fd is not None:
        os.write(ack_fd, HOLD_READY)  # from now on SIGUSR1 holds rather than kills
    # Beats while its reading loop turns: the dashboard shows it down within 5 s of its last beat.
    beater = Beater(database_url, LOG_READER, alive=reader.turning).start()
    try:
        reader.run(stop)
    finally:
        beater.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
