"""``python -m webapp.outbox [--lab NAME]``: relay one lab's outbox until SIGTERM or SIGINT.

The lab is ``--lab``, else ``LAB_NAME``; ``LAB_AGENT_ID`` names the agent that started it. Exit 0
when stopped or when the lab no longer asks for a relay (reset or removed): the agent does not
start it again until the lab asks.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from ..domain.lab import Lab
from ..settings import load_config
from .relay import Relay


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s relay[{os.getpid()}] %(levelname)s %(message)s")
    config = load_config()
    parser = argparse.ArgumentParser(prog="python -m webapp.outbox", description=__doc__.splitlines()[0])
    parser.add_argument("--lab", default=config["LAB_NAME"], help="the lab whose outbox to relay")
    args = parser.parse_args(argv)
    if not config["DATABASE_URL"] or not config["KAFKA_BOOTSTRAP_SERVERS"]:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_term(signum, frame):
        stop.set()
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    relay = Relay(config["DATABASE_URL"], config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"], Lab(args.lab),
                  agent_id=os.environ.get("LAB_AGENT_ID"))
    return relay.run(stop)


if __name__ == "__main__":
    sys.exit(main())
