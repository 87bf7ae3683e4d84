"""How fast each dashboard panel answers on a big lab: 100,000 journal rows (``make bench``).

Starts a private embedded PostgreSQL in a temp dir, fills one lab with a journal of 100,000
published events, one delivery and one effect for each (plus some redeliveries and doubles),
their dedup keys and a timeline (and builds its running summaries, as the agent would), then asks every panel endpoint N times through the Flask test
client and prints the median and 95th percentile. The panels read PostgreSQL only, so no
broker is needed. Target: every panel under 100 ms.

    .venv/bin/python bench/panels.py [--rows 100000] [--requests 40]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from webapp import create_app
from webapp.dev.stack import Stack
from webapp.domain.lab import Lab
from webapp.store.connection import connect, sqlalchemy_url
from webapp.store.labs import create_database_state, ensure_control_schema
from webapp.summary.fold import fold_lab
from webapp.web.db import db
from webapp.web.panels import PANELS

LAB = Lab("bench")
GROUP = LAB.group_id("payments")

# Bulk fill, in the lab's schema. Three partitions; every record delivered and applied once,
# 1 in 100 redelivered and absorbed, 1 in 200 applied twice (a second payment row).
FILL = """
INSERT INTO published_events (event_id, transaction_id, type, account_id, amount_cents, mode, idempotent_producer,
                              partition, "offset", payload, published_at)
SELECT gen_random_uuid(), 'tx-' || i, 'credit', 'acc-' || (i % 5 + 1), 100 + i % 900, 'normal', true,
       i % 3, i / 3, '{{}}', now() - make_interval(secs => ({rows} - i) * 0.01)
FROM generate_series(0, {rows} - 1) AS i;

-- the log reader's mirror of the same records (the truth the verdict reads)
INSERT INTO log_records (partition, "offset", "timestamp", key, value, event_id, transaction_id, type, account_id,
                         amount_cents, occurred_at, first_of_transaction, read_at)
SELECT partition, "offset", published_at, account_id, payload, event_id, transaction_id, type, account_id,
       amount_cents, published_at::text, true, published_at + interval '1 ms'
FROM published_events;

INSERT INTO deliveries (group_id, consumer, partition, "offset", generation, attempt, event_id, transaction_id,
                        strategy, outcome, delivered_at)
SELECT '{group}', 'c' || (partition + 1), partition, "offset", 1, 1, event_id, transaction_id, 'eventid-atomic',
       'applied', published_at + interval '5 ms'
FROM published_events;
INSERT INTO deliveries (group_id, consumer, partition, "offset", generation, attempt, event_id, transaction_id,
                        strategy, outcome, delivered_at)
SELECT '{group}', 'c' || (partition + 1), partition, "offset", 2, 2, event_id, transaction_id, 'eventid-atomic',
       'absorbed', published_at + interval '1 s'
FROM published_events WHERE id % 100 = 0;

INSERT INTO payments (event_id, transaction_id, account_id, amount_cents, applied_at)
SELECT event_id, transaction_id, account_id, amount_cents, published_at + interval '5 ms' FROM published_events;
INSERT INTO payments (event_id, transaction_id, account_id, amount_cents, applied_at)
SELECT event_id, transaction_id, account_id, amount_cents, published_at + interval '1 s'
FROM published_events WHERE id % 200 = 0;

INSERT INTO processed_events (event_id, processed_at) SELECT event_id, published_at FROM published_events;

UPDATE accounts a SET balance = s.cents FROM (
    SELECT account_id, sum(amount_cents) AS cents FROM payments GROUP BY account_id) s WHERE s.account_id = a.id;

INSERT INTO timeline (kind, summary, at)
SELECT 'published', 'bench event ' || i, now() - make_interval(secs => i) FROM generate_series(1, 2000) AS i;

INSERT INTO group_offsets (group_id, partition, committed)
SELECT '{group}', partition, max("offset") + 1 FROM published_events GROUP BY partition;
"""


def wipe(database_url: str) -> None:
    """Drop the bench lab (its schema and consumer rows), for a fill at another size."""
    with connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{LAB.schema}" CASCADE')
        if conn.execute("SELECT to_regclass('lab_control.consumers')").fetchone()[0]:
            conn.execute("DELETE FROM lab_control.consumers WHERE lab = %s", [LAB.name])


def fill(database_url: str, rows: int) -> float:
    """Fill the lab; returns the seconds its summaries took to build (included in the fill)."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            ensure_control_schema(conn)
            create_database_state(conn, LAB, 3)
            conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": LAB.schema})
            for statement in FILL.format(rows=rows, group=GROUP).split(";\n"):
                if statement.strip():
                    conn.execute(text(statement))
            for n in range(3):
                conn.execute(text(
                    "INSERT INTO lab_control.consumers (lab, name, group_id, state, assigned, positions, "
                    "applied_positions, heartbeat_at) VALUES (:lab, :name, :group, 'running', CAST(:assigned AS jsonb), "
                    "'{}', '{}', now())"), {"lab": LAB.name, "name": f"c{n + 1}", "group": GROUP,
                                             "assigned": f"[{n}]"})
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    finally:
        engine.dispose()
    return summarize(database_url)


def summarize(database_url: str) -> float:
    """Build the lab's running summaries, as the agent's folder does (there is no agent here):
    the seconds it took."""
    started = time.perf_counter()
    with connect(database_url, autocommit=True) as conn:
        fold_lab(conn, LAB.schema)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def make_app(database_url: str, data_dir: str, cache: bool):
    return create_app({"DATABASE_URL": database_url, "LAB_NAME": LAB.name, "LAB_DATA_DIR": data_dir,
                       "SECRET_KEY": "bench", "KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "PANEL_CACHE": cache})


def measure(client, path: str, requests: int) -> tuple[float, float]:
    for _ in range(3):  # warm-up: connection pool, template cache
        response = client.get(path)
        if response.status_code != 200:
            raise SystemExit(f"GET {path} answered {response.status_code}: {response.get_data(as_text=True)[:500]}")
    timings = []
    for _ in range(requests):
        start = time.perf_counter()
        client.get(path)
        timings.append((time.perf_counter() - start) * 1000)
    timings.sort()
    return statistics.median(timings), timings[min(len(timings) - 1, round(0.95 * (len(timings) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="journal rows (default 100,000)")
    parser.add_argument("--requests", type=int, default=40, help="requests per endpoint (default 40)")
    args = parser.parse_args()

    # A private PostgreSQL, the control schema at head; no broker, no agent (webapp/dev/stack.py).
    with tempfile.TemporaryDirectory(prefix="lab-bench-") as tmp, \
            Stack(Path(tmp), broker=False, agent=False) as stack:
        started = time.perf_counter()
        fill(stack.database_url, args.rows)
        print(f"filled lab {LAB.name}: {args.rows:,} journal rows in {time.perf_counter() - started:.1f}s")
        # "changed": the panel cache is off, so every request loads its data as it does after
        # a change; "unchanged": what a second browser, or a page reload, pays meanwhile.
        cold = make_app(stack.database_url, tmp, cache=False)
        warm = make_app(stack.database_url, tmp, cache=True)
        paths = ["/live", "/panels/chart.json"] + [f"/panels/{name}" for name in PANELS] + ["/"]
        print(f"{'':32} {'after a change':>22} {'unchanged (cached)':>22}")
        print(f"{'endpoint':32} {'median ms':>10} {'p95 ms':>11} {'median ms':>10} {'p95 ms':>11}")
        slow = []
        for path in paths:
            numbers = []
            for app in (cold, warm):
                with app.app_context():
                    numbers += measure(app.test_client(), path, args.requests)
            flag = "" if numbers[1] < 100 or path == "/" else "  over 100 ms"
            if flag:
                slow.append(path)
            print(f"{path:32} {numbers[0]:10.1f} {numbers[1]:11.1f} {numbers[2]:10.1f} {numbers[3]:11.1f}{flag}")
        for app in (cold, warm):
            with app.app_context():
                db.engine.dispose()
        print("every panel under 100 ms (p95, after a change)" if not slow else
              f"over 100 ms (p95, after a change): {', '.join(slow)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
