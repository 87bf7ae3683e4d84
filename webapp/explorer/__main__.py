"""``python -m webapp.explorer --exploration-id N``: run one queued exploration (job.py), started by a lab agent."""
from __future__ import annotations

import argparse
import logging
import os
import sys

from sqlalchemy import create_engine

from ..settings import load_config
from ..store.connection import sqlalchemy_url
from .job import run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.explorer", description=__doc__)
    parser.add_argument("--exploration-id", type=int, required=True, help="the queued exploration's row id")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s explorer[{os.getpid()}] %(levelname)s %(name)s %(message)s")
    config = load_config()
    if not config["DATABASE_URL"]:
        print("DATABASE_URL must be set", file=sys.stderr)
        return 2
    engine = create_engine(sqlalchemy_url(config["DATABASE_URL"]), pool_size=2, max_overflow=2, pool_pre_ping=True)
    try:
        state = run(engine, dict(config), args.exploration_id)
    finally:
        engine.dispose()
    logging.getLogger("idempotency_lab.explorer").info("exploration %s ended: %s", args.exploration_id, state)
    return 0


if __name__ == "__main__":
    sys.exit(main())
