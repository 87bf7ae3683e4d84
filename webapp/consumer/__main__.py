"""``python -m webapp.consumer --lab NAME --consumer-id N``: one consumer process.

Started by the lab agent; reads DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS from the environment.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys

import psycopg

from ..domain.lab import Lab
from ..store.connection import CONTROL_SCHEMA, connect, with_reconnect_backoff
from .loop import ConsumerProcess, handling_signals

# A consumer (re)started while PostgreSQL restarts (chaos does that) waits for it, as a running
# one does, rather than die at its first statement; past this, it fails with the reason.
STARTUP_DATABASE_WAIT = 60.0


def connect_when_up(database_url: str, wait: float = STARTUP_DATABASE_WAIT) -> psycopg.Connection:
    """A connection to PostgreSQL, retried with a backoff for up to ``wait`` seconds."""
    return with_reconnect_backoff(lambda: connect(database_url), wait=wait)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.consumer")
    parser.add_argument("--lab", required=True)
    parser.add_argument("--consumer-id", type=int, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s consumer[{os.getpid()}] %(message)s")

    # The agent puts both settings in the consumer's environment, resolved by the settings model
    # (webapp/settings): read here as they are, since loading the model (pydantic) would be paid
    # again at every consumer start (tests/test_architecture.py keeps pydantic out).
    database_url = os.environ["DATABASE_URL"]
    with connect_when_up(database_url) as conn:
        row = conn.execute(f"SELECT name, group_id FROM {CONTROL_SCHEMA}.consumers WHERE id = %s",
                           [args.consumer_id]).fetchone()
    if row is None:
        print(f"no consumer {args.consumer_id}", file=sys.stderr)
        return 2
    process = ConsumerProcess(lab=Lab(args.lab), consumer_id=args.consumer_id, name=row[0], group_id=row[1],
                              database_url=database_url,
                              bootstrap_servers=os.environ["KAFKA_BOOTSTRAP_SERVERS"])
    with handling_signals(process):
        return process.run()


if __name__ == "__main__":
    sys.exit(main())
