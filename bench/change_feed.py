"""What the live panels' change feed costs writers that commit at once (``make``-less: run it by hand).

    .venv/bin/python bench/change_feed.py [--writers 4] [--listeners 8] [--events 1500] [--rounds 2]

One embedded PostgreSQL (webapp/dev/stack.py, no broker work beyond the labs' topics); per round,
``--writers`` labs, each written by one connection of its own running eventid-atomic's
per-message transaction (claim, credit, payment row, ledger row; bench/throughput.py's
``one_transaction``) ``--events`` times, all at once, while ``--listeners`` idle connections
LISTEN (as every lab consumer's control connection does). Each round runs twice, in alternating
order: writers that announce their lab on the change feed (a plain session: a NOTIFY per
transaction), and writers in a quiet session (store/lab_changes.py QUIET_SESSION, as the lab's
consumers write). Printed: transactions per second over all writers, and how often a sample of
pg_locks (every 5 ms) found a transaction waiting for the notify queue's lock (object 0 of
pg_database, taken at the commit of every transaction that notified).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from itertools import count
from pathlib import Path
from statistics import median

from webapp.agent.setup import ensure_lab
from webapp.dev.stack import Stack
from webapp.domain import events
from webapp.domain.lab import Lab
from webapp.store.connection import connect
from webapp.store.lab_changes import QUIET_SESSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import one_transaction  # noqa: E402  (the bench's own statements, as the consumer runs them)

_labs = count(1)
NOTIFY_LOCK_WAITERS = ("SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype = 'object' "
                       "AND classid = 'pg_database'::regclass AND objid = 0")


def one_round(url: str, labs: list[Lab], quiet: bool, events_each: int, listeners: int) -> tuple[float, float]:
    """All writers at once; (transactions per second, mean waiters on the notify lock per sample)."""
    samples, waiters, stop = [0], [0], threading.Event()

    def sample() -> None:
        with connect(url, autocommit=True) as conn:
            while not stop.wait(0.005):
                waiters[0] += conn.execute(NOTIFY_LOCK_WAITERS).fetchone()[0]
                samples[0] += 1

    idle = [connect(url, autocommit=True) for _ in range(listeners)]
    for conn in idle:
        conn.execute("LISTEN lab_settings")

    def write(lab: Lab) -> None:
        work = [events.credit(f"acc-{n % 5 + 1}", 100 + n % 900) for n in range(events_each)]
        with connect(url, schema=lab.schema, autocommit=True) as conn:
            if quiet:
                conn.execute(QUIET_SESSION)
            for offset, event in enumerate(work):
                one_transaction(conn, event, offset)

    sampler = threading.Thread(target=sample)
    writers = [threading.Thread(target=write, args=(lab,)) for lab in labs]
    sampler.start()
    started = time.perf_counter()
    try:
        for thread in writers:
            thread.start()
        for thread in writers:
            thread.join()
        seconds = time.perf_counter() - started
    finally:
        stop.set()
        sampler.join()
        for conn in idle:
            conn.close()
    return len(labs) * events_each / seconds, waiters[0] / max(samples[0], 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--listeners", type=int, default=8)
    parser.add_argument("--events", type=int, default=1500, help="transactions per writer per round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-change-feed-") as tmp, Stack(Path(tmp), agent=False) as stack:
        def fresh_labs() -> list[Lab]:
            labs = [Lab(f"f{os.getpid() % 1000}_{next(_labs)}") for _ in range(args.writers)]
            for lab in labs:
                ensure_lab(stack.database_url, stack.bootstrap_servers, lab, partitions=1)
            return labs
        figures: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
        for round_ in range(args.rounds):
            for quiet in ((False, True) if round_ % 2 == 0 else (True, False)):
                figures[quiet].append(one_round(stack.database_url, fresh_labs(), quiet, args.events, args.listeners))
        print(f"{args.writers} writers at once, {args.events:,} transactions each, {args.listeners} idle listeners, "
              f"{args.rounds} rounds")
        for quiet, title in ((False, "announcing (a NOTIFY per transaction)"), (True, "quiet session")):
            rates = [rate for rate, _ in figures[quiet]]
            waits = [waiting for _, waiting in figures[quiet]]
            print(f"{title:40} {median(rates):>8,.0f} tx/s  (each: {' '.join(f'{r:,.0f}' for r in rates)}); "
                  f"waiters on the notify lock per sample {median(waits):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
