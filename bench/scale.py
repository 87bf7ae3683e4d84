"""The lab at scale: dedup key inserts and TTL at millions of keys, and the dashboard
with millions of records in the log.

Starts a private embedded PostgreSQL in a temp dir (no broker: nothing here needs one) and
measures, printing a table for each:

1. Key insert, plain vs partitioned by day (webapp/strategies/dedup_layout.py): ``processed_events`` grown
   set-based to each size in ``--keys`` (keys spread over ``--days`` days of event time), then
   ``--probes`` single-row inserts of the ``eventid-atomic`` claim with a random new key and
   today's time, each timed, committed in groups of 100 (as a consumer's transactions land):
   p50 and p99. Goal: p99 at the largest size within 1.5x of p99 at 0, partitioned.
2. The TTL at the largest size: one day's keys removed by ``DELETE`` (plain) and by dropping that
   day's partition (partitioned). Goal: the drop under 100 ms.
3. The dashboard at each size in ``--records``: bench/panels.py's fill (every record mirrored,
   delivered and applied) and every panel, ``/live`` and ``GET /api/v1/state``, p50 and p95 after a
   change (no panel cache): what one load costs. Goal: each under 100 ms (p95).
4. The same panels as a viewer gets them (panel cache on, the default LIVE_STALE_AFTER_SECONDS):
   each round adds one effect row (a change every panel that reads effects sees), then polls the
   panel every 0.1 s until it shows the new state. Printed: the requests' p50 and p95 (a slow
   panel answers from its last load, marked stale, while it loads again in the background) and how
   long after the change the panel showed it (median and worst): the price of the size, paid in
   freshness instead of in a blocked page. ``GET /api/v1/state`` stays exact (computed per request).
5. The same paths while a load runs (``--load-rate`` records a second, 2,000 by default: about
   four times one per-message consumer, the rate of a batch consumer): a writer process adds
   records as the log reader and a consumer would (each mirrored, delivered, applied, its key
   claimed, the committed offsets moved), in one transaction every 0.1 s, and the agent's own
   summary folder (``agent.periodic.SummaryFolder``) folds in a process of its own, as in the lab's
   agent. After ten seconds of it, every path with the panel cache off (one load each): p50 and
   p95, the rate the writer kept, how many changes were still queued at the end (the folder
   keeping up, or not) and how many folds it took.

    .venv/bin/python bench/scale.py [--keys 0,1000000,10000000] [--records 1000000,10000000]
        [--days 10] [--probes 2000] [--requests 20] [--load-rate 2000] [--skip-keys] [--skip-panels]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import psycopg

from webapp.dev.stack import Stack
from webapp.domain.waits import wait_until
from webapp.store.connection import psycopg_conninfo
from webapp.strategies import dedup_layout, eventid_atomic, partitioned

BENCH_SCHEMA = "scale_keys"


def percentile(timings: list[float], share: float) -> float:
    ordered = sorted(timings)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def fresh_table(conn: psycopg.Connection, layout: str) -> None:
    conn.execute(f"DROP SCHEMA IF EXISTS {BENCH_SCHEMA} CASCADE")
    conn.execute(f"CREATE SCHEMA {BENCH_SCHEMA}")
    conn.execute(f"SET search_path = {BENCH_SCHEMA}")
    for statement in (dedup_layout.PLAIN_DDL if layout == dedup_layout.PLAIN else dedup_layout.PARTITIONED_DDL):
        conn.execute(statement)
    if layout == dedup_layout.PARTITIONED:
        dedup_layout.ensure_partitions(conn.execute)


def grow(conn: psycopg.Connection, to_keys: int, days: int) -> float:
    """Insert keys until the table holds ``to_keys``, in chunks of a million; seconds taken."""
    have = conn.execute("SELECT count(*) FROM processed_events").fetchone()[0]
    started = time.perf_counter()
    while have < to_keys:
        chunk = min(1_000_000, to_keys - have)
        dedup_layout.warm_up(conn.execute, chunk, days)
        have += chunk
    conn.execute("VACUUM ANALYZE processed_events")
    return time.perf_counter() - started


def probe_inserts(conn: psycopg.Connection, layout: str, probes: int) -> tuple[float, float]:
    """p50 and p99 (ms) of the eventid-atomic claim with new random keys, committed every 100."""
    claim = partitioned.CLAIM if layout == dedup_layout.PARTITIONED else eventid_atomic.CLAIM
    now = datetime.now(timezone.utc).isoformat()
    timings = []
    for batch in range(0, probes, 100):
        with conn.transaction():
            for _ in range(min(100, probes - batch)):
                params = {"event_id": uuid.uuid4(), "occurred_at": now}
                started = time.perf_counter()
                conn.execute(claim, params)
                timings.append((time.perf_counter() - started) * 1000)
    return statistics.median(timings), percentile(timings, 0.99)


def ttl_one_day(conn: psycopg.Connection, layout: str, days: int) -> tuple[float, int]:
    """Remove the oldest full day's keys: (ms, keys removed)."""
    day = datetime.now(timezone.utc).date() - timedelta(days=days - 1)
    started_at = datetime.combine(day, datetime.min.time(), timezone.utc)
    with conn.transaction():
        if layout == dedup_layout.PARTITIONED:
            name = dedup_layout.partition_name(day)
            rows = conn.execute(f"SELECT count(*) FROM {name}").fetchone()[0]
            started = time.perf_counter()
            conn.execute(dedup_layout.DROP_PARTITION_SQL.format(name=name))
        else:
            started = time.perf_counter()
            rows = conn.execute("DELETE FROM processed_events WHERE processed_at >= %s::timestamptz::timestamp "
                                "AND processed_at < %s::timestamptz::timestamp",
                                [started_at, started_at + timedelta(days=1)]).rowcount
    return (time.perf_counter() - started) * 1000, rows


def bench_keys(url: str, sizes: list[int], days: int, probes: int) -> None:
    print(f"\n1. key insert (eventid-atomic claim, random new key), {probes:,} probes per size, keys over {days} days")
    print(f"{'layout':22} {'keys':>12} {'grow s':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99 / p99 at first':>19}")
    ttl = {}
    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        for layout in (dedup_layout.PLAIN, dedup_layout.PARTITIONED):
            fresh_table(conn, layout)
            first_p99 = None
            for size in sizes:
                grown = grow(conn, size, days)
                p50, p99 = probe_inserts(conn, layout, probes)
                first_p99 = first_p99 or p99
                print(f"{layout:22} {size:>12,} {grown:8.1f} {p50:8.3f} {p99:8.3f} {p99 / first_p99:19.2f}", flush=True)
            ttl[layout] = ttl_one_day(conn, layout, days)
        conn.execute(f"DROP SCHEMA {BENCH_SCHEMA} CASCADE")
    print(f"\n2. TTL at {sizes[-1]:,} keys: one day's keys")
    for layout, (ms, rows) in ttl.items():
        how = "DROP TABLE partition" if layout == dedup_layout.PARTITIONED else "DELETE ... WHERE processed_at"
        print(f"{layout:22} {how:32} {rows:>10,} keys {ms:10.1f} ms")


def bench_panels(url: str, tmp: str, sizes: list[int], requests: int, one_load: bool = True,
                 load_rate: int = 2000) -> None:
    import panels  # bench/panels.py: the fill and the measurement

    from webapp.web.panels import PANELS

    print(f"\n3. dashboard: p50 / p95 ms after a change (no panel cache), {requests} requests each")
    paths = ["/live", "/api/v1/state", "/panels/chart.json"] + [f"/panels/{name}" for name in PANELS]
    for size in sizes:
        panels.wipe(url)
        started = time.perf_counter()
        built = panels.fill(url, size)
        print(f"\n   {size:,} records (mirrored, delivered, applied), filled in {time.perf_counter() - started:.0f} s "
              f"(the running summaries' first build: {built:.0f} s)")
        if one_load:
            measure_one_load(url, tmp, paths, requests)
        else:
            print("   one load per request: skipped (--skip-one-load)")
        bench_live(url, tmp, paths, requests)
        bench_under_load(url, tmp, paths, requests, size, load_rate)


# One tick of the load: records ``start`` to ``end`` - 1 (numbered as the fill numbers its own, so
# partition and offset follow on), each mirrored, delivered, applied and its key claimed, and the
# group's committed offsets moved past them, in one transaction (the log reader's and a batch
# consumer's writes, and the agent's offset snapshot). (%% is psycopg's literal %.)
LOAD_SQL = """
WITH new AS (
    SELECT i %% 3 AS partition, i / 3 AS "offset", gen_random_uuid() AS event_id, 'load-' || i AS transaction_id,
           'acc-' || (i %% 5 + 1) AS account_id, 100 + i %% 900 AS cents
    FROM generate_series(%(start)s::bigint, %(end)s::bigint - 1) AS i
),
mirrored AS (
    INSERT INTO log_records (partition, "offset", "timestamp", key, value, event_id, transaction_id, type, account_id,
                             amount_cents, occurred_at, first_of_transaction, read_at)
    SELECT partition, "offset", now(), account_id, '{}', event_id, transaction_id, 'credit', account_id, cents,
           now()::text, true, clock_timestamp() FROM new
),
delivered AS (
    INSERT INTO deliveries (group_id, consumer, partition, "offset", generation, attempt, event_id, transaction_id,
                            strategy, outcome)
    SELECT %(group)s, 'c' || (partition + 1), partition, "offset", 1, 1, event_id, transaction_id, 'eventid-atomic',
           'applied' FROM new
),
paid AS (
    INSERT INTO payments (event_id, transaction_id, account_id, amount_cents)
    SELECT event_id, transaction_id, account_id, cents FROM new
),
claimed AS (INSERT INTO processed_events (event_id, processed_at) SELECT event_id, now() FROM new)
UPDATE group_offsets g SET committed = n.upto
FROM (SELECT partition, max("offset") + 1 AS upto FROM new GROUP BY partition) n
WHERE g.group_id = %(group)s AND g.partition = n.partition
"""


WARM_UP_SECONDS = 10


def write_load(url: str, schema: str, group: str, filled: int, rate: int, written, stop) -> None:
    """The load's writer, in a process of its own (as the log reader and the consumers are):
    ``rate`` records a second, one transaction every 0.1 s; ``written`` counts them."""
    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        per_tick, started = max(1, rate // 10), time.monotonic()
        while not stop.is_set():
            start = filled + written.value
            conn.execute(LOAD_SQL, {"start": start, "end": start + per_tick, "group": group})
            written.value += per_tick
            # Paced to the rate over the whole run: a slow tick is made up by the next ones.
            stop.wait(max(0.0, started + written.value / rate - time.monotonic()))


def fold_until_stopped(url: str, folds, stop) -> None:
    """The agent's own summary folder, in a process of its own (as in the lab's agent)."""
    from webapp.agent.periodic import SummaryFolder

    folder = SummaryFolder(url)
    folder.start()
    try:
        stop.wait()
    finally:
        folder.stop()
        folds.value = folder.folds


def bench_under_load(url: str, tmp: str, paths: list[str], requests: int, filled: int, rate: int) -> None:
    """Every path, one load each (no panel cache), while a writer adds ``rate`` records a second
    and the agent's summary folder (its own class and pace) folds the summaries. The writer, the
    folder and the web app each run in their own process, as the lab deploys them: threads of one
    process would also contend for one interpreter lock, which the lab never does."""
    import multiprocessing

    import panels

    from webapp.agent.periodic import SummaryFolder
    from webapp.web.db import db

    spawn = multiprocessing.get_context("spawn")
    stop, written, folds = spawn.Event(), spawn.Value("q", 0), spawn.Value("q", 0)
    writer = spawn.Process(target=write_load, name="load writer",
                           args=(url, panels.LAB.schema, panels.GROUP, filled, rate, written, stop))
    folder = spawn.Process(target=fold_until_stopped, name="summary folder", args=(url, folds, stop))
    app = panels.make_app(url, tmp, cache=False)
    print(f"   while a load adds {rate:,} records a second (mirrored, delivered, applied; folded by the agent's "
          f"folder: every {SummaryFolder.BUSY_EVERY} s while there is something to fold), one load each:")
    writer.start()
    folder.start()
    try:
        wait_until(lambda: written.value > 0 or not writer.is_alive(), timeout=60,
                   message="the load's writer never wrote")
        started, first = time.monotonic(), written.value  # the rate from here: a process takes a while to start
        # Ten seconds of load before the first request: the folder at its steady pace, not at rest.
        wait_until(lambda: written.value >= rate * WARM_UP_SECONDS or not writer.is_alive(),
                   timeout=WARM_UP_SECONDS * 10, message="the load never got going")
        with app.app_context():
            client = app.test_client()
            for path in paths:
                if not writer.is_alive() or not folder.is_alive():
                    raise SystemExit(f"the load stopped (writer exit {writer.exitcode}, folder exit {folder.exitcode})")
                p50, p95 = panels.measure(client, path, requests)
                print(f"   {path:28} {p50:10.1f} / {p95:8.1f}" + ("   over 100 ms" if p95 >= 100 else ""), flush=True)
            db.engine.dispose()
    finally:
        stop.set()
        for process in (writer, folder):
            process.join(timeout=60)
            if process.is_alive():  # ours to stop, by its PID
                process.kill()
                process.join()
    elapsed = time.monotonic() - started
    with psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        queued = conn.execute(f'SELECT count(*) FROM "{panels.LAB.schema}".verdict_changes').fetchone()[0]
    print(f"   the load: {written.value:,} records in {elapsed:.0f} s ({(written.value - first) / elapsed:,.0f} a second); "
          f"{queued:,} changes still queued at the end; {folds.value:,} folds")


def measure_one_load(url: str, tmp: str, paths: list[str], requests: int) -> None:
    """Each path with the panel cache off: what one load costs, as right after a change."""
    import panels

    from webapp.web.db import db

    app = panels.make_app(url, tmp, cache=False)
    with app.app_context():
        client = app.test_client()
        for path in paths:  # printed as measured: a long run is readable while it goes
            p50, p95 = panels.measure(client, path, requests)
            print(f"   {path:28} {p50:10.1f} / {p95:8.1f}" + ("   over 100 ms" if p95 >= 100 else ""), flush=True)
        db.engine.dispose()


CHANGE_SQL = """
INSERT INTO payments (event_id, transaction_id, account_id, amount_cents, applied_at)
SELECT event_id, transaction_id, account_id, amount_cents, now() FROM published_events
ORDER BY id DESC LIMIT 1
"""


def bench_live(url: str, tmp: str, paths: list[str], rounds: int) -> None:
    import re

    import panels

    from webapp.web.db import db
    from webapp.web.panels import PANELS

    app = panels.make_app(url, tmp, cache=True)
    print(f"   as a viewer sees them (stale after {app.config['LIVE_STALE_AFTER_SECONDS']:g} s), {rounds} changes each:"
          f"\n   {'':28} {'request p50 / p95 ms':>22} {'fresh after median / worst s':>30}")
    with app.app_context(), psycopg.connect(psycopg_conninfo(url), autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{panels.LAB.schema}"')
        client = app.test_client()
        for path in paths:
            if path in ("/live", "/api/v1/state", "/panels/chart"):
                continue  # the fingerprints (above); the exact state API; the chart's frame (its data: chart.json)
            name = "chart" if path.endswith(".json") else path.rsplit("/", 1)[1]
            reads_effects = "effects" in PANELS[name].depends
            client.get(path)  # the first load: kept, and timed, for the next
            timings, lags = [], []

            def live() -> str:
                return client.get("/live").get_json()["fingerprints"][name]
            for _ in range(rounds):
                before = live()
                conn.execute(CHANGE_SQL)
                changed = time.perf_counter()
                # The fingerprints are computed once per LIVE_CACHE_SECONDS: wait until they show it.
                current = live()
                while reads_effects and current == before and time.perf_counter() - changed < 5:
                    time.sleep(0.05)
                    current = live()
                while True:
                    start = time.perf_counter()
                    response = client.get(path)
                    timings.append((time.perf_counter() - start) * 1000)
                    if path.endswith(".json"):
                        body = response.get_json()
                        shown, stale = body["fingerprint"], body["stale_for"] is not None
                    else:
                        html = response.get_data(as_text=True)
                        shown, stale = re.search(r'data-fingerprint="([^"]*)"', html).group(1), "data-stale" in html
                    if not stale and shown == current:
                        if current != before:  # a panel that does not read effects: no lag to speak of
                            lags.append(time.perf_counter() - changed)
                        break
                    if time.perf_counter() - changed > 120:
                        raise SystemExit(f"{path} did not show a change within 120 s")
                    time.sleep(0.1)  # a viewer's next poll
                    current = live()
            lag = f"{statistics.median(lags):14.2f} / {max(lags):6.2f}" if lags else f"{'(does not read effects)':>23}"
            print(f"   {path:28} {statistics.median(timings):10.1f} / {percentile(timings, 0.95):8.1f}"
                  f" {lag}"
                  + ("   over 100 ms" if percentile(timings, 0.95) >= 100 else ""), flush=True)
        db.engine.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", default="0,1000000,10000000", help="dedup table sizes (comma-separated)")
    parser.add_argument("--records", default="1000000,10000000", help="log sizes for the panels (comma-separated)")
    parser.add_argument("--days", type=int, default=10, help="days of event time the keys span")
    parser.add_argument("--probes", type=int, default=2000, help="timed inserts per size")
    parser.add_argument("--requests", type=int, default=20, help="requests per endpoint and size")
    parser.add_argument("--load-rate", type=int, default=2000,
                        help="records a second the load adds while the panels are timed under load (default 2,000)")
    parser.add_argument("--skip-keys", action="store_true")
    parser.add_argument("--skip-panels", action="store_true")
    parser.add_argument("--skip-one-load", action="store_true",
                        help="panels: only as a viewer gets them (at 10,000,000 one load of the state API is a minute)")
    args = parser.parse_args()
    # A private PostgreSQL, the control schema at head; no broker, no agent (webapp/dev/stack.py).
    with tempfile.TemporaryDirectory(prefix="lab-scale-") as tmp, \
            Stack(Path(tmp), broker=False, agent=False) as stack:
        if not args.skip_keys:
            bench_keys(stack.database_url, [int(n) for n in args.keys.split(",")], args.days, args.probes)
        if not args.skip_panels:
            bench_panels(stack.database_url, tmp, [int(n) for n in args.records.split(",")], args.requests,
                         one_load=not args.skip_one_load, load_rate=args.load_rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
