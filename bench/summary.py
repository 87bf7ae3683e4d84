"""The running summaries' price and payoff (webapp/summary/), in one run.

    .venv/bin/python bench/summary.py [--events 5000] [--rounds 4] [--records 100000,1000000]

Starts a private embedded PostgreSQL (no broker: nothing here needs one) and prints:

1. The price, on the consumer's path: the ``eventid-atomic`` transaction (claim, credit, payment
   row, delivery row; one transaction per event, as a per-message consumer runs it) with the change
   triggers on and with them disabled (``ALTER TABLE ... DISABLE TRIGGER USER``: the reference),
   in alternating rounds on the same schema; and the same for a batch of 500 (the batch statements).
   Printed: events/s each way and the ratio with/without.
2. The payoff, on the reader's path: at each size in ``--records`` (bench/panels.py's fill: every
   record mirrored, delivered and applied), the agent's first build, then the verdict and the
   accounts read from the summaries and computed whole (``exact``: VERDICT_SQL, the reference),
   each right after a change (one new payment row: one queued key), p50 / p95 and the ratio; and
   one fold of that change.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from webapp.dev.stack import Stack
from webapp.domain.lab import Lab
from webapp.readmodel import verdict
from webapp.store.connection import psycopg_conninfo, sqlalchemy_url
from webapp.store.labs import create_database_state, ensure_control_schema
from webapp.strategies.base import CREDIT_BALANCE, INSERT_PAYMENT, RECORD_DELIVERY
from webapp.strategies.batching import CREDIT_BATCH, INSERT_PAYMENTS_BATCH, RECORD_DELIVERIES_BATCH
from webapp.strategies.eventid_atomic import BATCH_CLAIM, CLAIM
from webapp.summary.fold import fold_lab

WRITE_LAB = Lab("summarywrites")
TABLES = ("log_records", "deliveries", "payments", "ledger")


def percentile(timings: list[float], share: float) -> float:
    timings = sorted(timings)
    return timings[min(len(timings) - 1, round(share * (len(timings) - 1)))]


def event_params(n: int) -> dict:
    return {"event_id": str(uuid.uuid4()), "transaction_id": f"tx-{uuid.uuid4().hex[:16]}", "account_id": "acc-1",
            "amount_cents": 100 + n % 900, "group_id": WRITE_LAB.group_id("payments"), "consumer": "c1",
            "partition": 0, "offset": n, "generation": 1, "strategy": "eventid-atomic", "outcome": "applied",
            "reason": None}


def per_event(conn: psycopg.Connection, events: int, start: int) -> float:
    """events/s of one eventid-atomic transaction per event."""
    began = time.perf_counter()
    for n in range(start, start + events):
        p = event_params(n)
        with conn.transaction():
            if conn.execute(CLAIM, p).rowcount == 1:
                conn.execute(CREDIT_BALANCE, p)
                conn.execute(INSERT_PAYMENT, p)
            conn.execute(RECORD_DELIVERY, p)
    return events / (time.perf_counter() - began)


def batched(conn: psycopg.Connection, events: int, start: int, size: int = 500) -> float:
    """events/s of the batch statements, ``size`` events a transaction."""
    began = time.perf_counter()
    for first in range(start, start + events, size):
        batch = [event_params(n) for n in range(first, min(first + size, start + events))]
        with conn.transaction():
            claimed = {str(row[0]) for row in conn.execute(BATCH_CLAIM, {"keys": [p["event_id"] for p in batch]})}
            chosen = [p for p in batch if p["event_id"] in claimed]
            effects = {"event_ids": [p["event_id"] for p in chosen],
                       "transaction_ids": [p["transaction_id"] for p in chosen],
                       "account_ids": [p["account_id"] for p in chosen],
                       "amounts_cents": [p["amount_cents"] for p in chosen]}
            conn.execute(CREDIT_BATCH, effects)
            conn.execute(INSERT_PAYMENTS_BATCH, effects)
            conn.execute(RECORD_DELIVERIES_BATCH, {
                **{k: batch[0][k] for k in ("group_id", "consumer", "generation", "strategy")},
                "partitions": [p["partition"] for p in batch], "offsets": [p["offset"] for p in batch],
                "event_ids": [p["event_id"] for p in batch], "transaction_ids": [p["transaction_id"] for p in batch],
                "outcomes": ["applied"] * len(batch), "reasons": [None] * len(batch)})
    return events / (time.perf_counter() - began)


def set_triggers(conn: psycopg.Connection, on: bool) -> None:
    for table in TABLES:
        conn.execute(f'ALTER TABLE "{WRITE_LAB.schema}".{table} {"ENABLE" if on else "DISABLE"} TRIGGER USER')


def bench_writes(url: str, events: int, rounds: int) -> None:
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with engine.begin() as conn:
        ensure_control_schema(conn)
        create_database_state(conn, WRITE_LAB, 1)
    engine.dispose()
    print(f"\n1. the consumer's transaction, with the change triggers and without (the reference), "
          f"{rounds} alternating rounds of {events:,} events")
    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{WRITE_LAB.schema}"')
        start = 0
        for name, run in (("one transaction per event", per_event), ("batches of 500", batched)):
            figures: dict[bool, list[float]] = {True: [], False: []}
            for _ in range(rounds):
                for on in (False, True):
                    set_triggers(conn, on)
                    figures[on].append(run(conn, events, start))
                    start += events
            with_, without = statistics.median(figures[True]), statistics.median(figures[False])
            print(f"   {name:28} without {without:9,.0f} ev/s   with {with_:9,.0f} ev/s   ratio {with_ / without:.2f}x")
        queued = conn.execute("SELECT count(*) FROM verdict_changes").fetchone()[0]
        print(f"   (queued changes left for the folder: {queued:,})")


def timed(fn, requests: int) -> list[float]:
    timings = []
    for _ in range(requests):
        began = time.perf_counter()
        fn()
        timings.append((time.perf_counter() - began) * 1000)
    return timings


CHANGE_SQL = """
INSERT INTO payments (event_id, transaction_id, account_id, amount_cents)
SELECT event_id, transaction_id, account_id, amount_cents FROM published_events ORDER BY id DESC LIMIT 1
"""


def bench_reads(url: str, sizes: list[int], requests: int) -> None:
    import panels  # bench/panels.py: the fill

    print(f"\n2. the verdict and the accounts, from the summaries and whole (VERDICT_SQL, the reference), "
          f"right after a change, {requests} reads each (p50 / p95 ms)")
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    for size in sizes:
        panels.wipe(url)
        began = time.perf_counter()
        built = panels.fill(url, size)
        filled = time.perf_counter() - began
        with psycopg.connect(psycopg_conninfo(url), autocommit=True) as folder:
            print(f"\n   {size:,} records: filled in {filled:.0f} s, of which the summaries' first build {built:.1f} s")
            folder.execute(f'SET search_path TO "{panels.LAB.schema}"')

            def read(exact: bool):
                def run():
                    folder.execute(CHANGE_SQL)
                    with Session(engine) as session:
                        session.execute(text("SELECT set_config('search_path', :s, true)"), {"s": panels.LAB.schema})
                        verdict.verdict(session, panels.LAB.schema, explain=False, exact=exact)
                        verdict.accounts(session, panels.LAB.schema, exact=exact)
                return run

            summary_ms = timed(read(False), requests)
            exact_ms = timed(read(True), max(3, requests // 10))
            began = time.perf_counter()
            fold_lab(folder, panels.LAB.schema)
            fold_ms = (time.perf_counter() - began) * 1000
            ratio = statistics.median(summary_ms) / statistics.median(exact_ms)
            print(f"   verdict + accounts, summaries  {statistics.median(summary_ms):9.1f} / {percentile(summary_ms, 0.95):8.1f}"
                  f"\n   verdict + accounts, whole      {statistics.median(exact_ms):9.1f} / {percentile(exact_ms, 0.95):8.1f}"
                  f"\n   ratio (p50)                    {ratio:9.4f}x"
                  f"\n   one fold of {requests + max(3, requests // 10)} queued payments: {fold_ms:.1f} ms")
    engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--records", default="100000,1000000")
    parser.add_argument("--requests", type=int, default=40)
    args = parser.parse_args()
    # A private PostgreSQL, the control schema at head; no broker, no agent (webapp/dev/stack.py).
    with tempfile.TemporaryDirectory(prefix="lab-bench-") as tmp, \
            Stack(Path(tmp), broker=False, agent=False) as stack:
        if args.events:  # --events 0: the reads alone
            bench_writes(stack.database_url, args.events, args.rounds)
        bench_reads(stack.database_url, [int(n) for n in args.records.split(",") if n], args.requests)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
