"""Dedup tables at scale, measured from the agent (never inside a consumer, whose timings it
would disturb): every few seconds, per dedup table of an active lab, its rows, table and index
size, and the latency of a probe key insert. On a thread of its own with its own database
connection, so a slow round never delays the agent's commands.

The probe is honest about what it measures: the INSERT a consumer's claim runs (the
``eventid-atomic`` claim itself for ``processed_events``, in the table's current layout), with a
random new key, timed one by one inside a transaction that is then rolled back, so no key is
left behind; the commit (its WAL flush) is not in the figure. p50 and p99 are over the last
``WINDOW`` probes of the table. A lab is active while a consumer of it reported in the last 30
seconds or a load runs on this agent: idle labs cost nothing.

Also here: the partitioned layout's day partitions are created ahead, for every schema that
has one (dedup_layout.ensure_partitions).
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
import uuid
from collections import defaultdict, deque
from typing import Callable

import psycopg

from ..domain.lab import Lab
from ..domain.vocabulary import DEDUP_TABLES, EXACT_COUNT_BELOW
from ..store import schema
from ..store.connection import CONTROL_SCHEMA, connect
from ..store.schema import quoted
from ..strategies import dedup_layout, eventid_atomic, partitioned

log = logging.getLogger("idempotency_lab.agent.dedup")

SAMPLE_EVERY = 5.0          # seconds between samples of one lab
PROBES = 10                 # probe inserts per table per sample
WINDOW = 300                # probes the percentiles are over
PARTITIONS_EVERY = 600.0    # seconds between rounds that create day partitions ahead
ROUND_EVERY = 1.0           # seconds between rounds
MAX_LABS_PER_ROUND = 3      # a bound on one round's work, however many labs are active
# The labs whose consumers reported lately.
ACTIVE_LABS_SQL = f"""
SELECT DISTINCT lab FROM {CONTROL_SCHEMA}.consumers WHERE heartbeat_at > now() - interval '30 seconds'
"""
SIZES_SQL = """
SELECT greatest(c.reltuples, 0)::bigint, pg_table_size(c.oid), pg_indexes_size(c.oid), c.relkind
FROM pg_class c WHERE c.oid = to_regclass(%(table)s)
"""
# A partitioned table's own pg_class row has no storage: add its partitions'.
PARTITIONED_SIZES_SQL = """
SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint, coalesce(sum(pg_table_size(c.oid)), 0),
       coalesce(sum(pg_indexes_size(c.oid)), 0)
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass(%(table)s)
"""
SAMPLE_SQL = """
INSERT INTO dedup_scale (table_name, rows, rows_estimated, table_bytes, index_bytes, insert_p50_ms, insert_p99_ms,
                         insert_samples, sampled_at)
VALUES (%(table)s, %(rows)s, %(estimated)s, %(table_bytes)s, %(index_bytes)s, %(p50)s, %(p99)s, %(samples)s, now())
ON CONFLICT (table_name) DO UPDATE SET rows = EXCLUDED.rows, rows_estimated = EXCLUDED.rows_estimated,
    table_bytes = EXCLUDED.table_bytes, index_bytes = EXCLUDED.index_bytes, insert_p50_ms = EXCLUDED.insert_p50_ms,
    insert_p99_ms = EXCLUDED.insert_p99_ms, insert_samples = EXCLUDED.insert_samples, sampled_at = EXCLUDED.sampled_at
"""
# The probe per table: the claim a consumer runs on it.
PROBE_SQL = {
    "processed_transactions": "INSERT INTO processed_transactions (transaction_id, processed_at) "
                              "VALUES (%(key)s, now()) ON CONFLICT (transaction_id) DO NOTHING",
    "seen_events": "INSERT INTO seen_events (event_id, processed_at) VALUES (%(event_id)s, now())",
    "processed_payloads": "INSERT INTO processed_payloads (payload_hash, processed_at) "
                          "VALUES (%(key)s, now()) ON CONFLICT (payload_hash) DO NOTHING",
}


def percentile(values: list[float], share: float) -> float:
    """The nearest-rank percentile (``share`` 0-1) of ``values`` (not empty)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


class DedupSampler(threading.Thread):
    def __init__(self, database_url: str, loading: Callable[[], list[str]] = lambda: []):
        super().__init__(name="dedup sampler", daemon=True)
        self.database_url = database_url
        self.loading = loading              # the labs a load runs in on this agent
        self.stop_requested = threading.Event()
        self._last: dict[str, float] = {}
        self._timings: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=WINDOW))
        self._partitions_round = 0.0

    def run(self) -> None:
        conn: psycopg.Connection | None = None
        while not self.stop_requested.wait(ROUND_EVERY):
            try:
                if conn is None or conn.closed:
                    conn = connect(self.database_url, autocommit=True, application_name="lab agent dedup sampler")
                self.round(conn)
            except psycopg.Error as error:  # PostgreSQL restarting: reconnect next round
                log.warning("dedup sampler: %s", str(error).splitlines()[0])
                if conn is not None:
                    conn.close()
                conn = None
            except Exception:  # never let the sampler die silently
                log.exception("dedup sampler")
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.stop_requested.set()
        if self.is_alive():
            self.join(timeout=5)

    def round(self, conn: psycopg.Connection) -> None:
        """Sample the active labs that are due, and create day partitions ahead when due."""
        now = time.monotonic()
        if now - self._partitions_round >= PARTITIONS_EVERY:
            self._partitions_round = now
            self.create_partitions_ahead(conn)
        active = {name for (name,) in conn.execute(ACTIVE_LABS_SQL)} | set(self.loading())
        due = sorted((name for name in active if now - self._last.get(name, 0.0) >= SAMPLE_EVERY),
                     key=lambda name: self._last.get(name, 0.0))[:MAX_LABS_PER_ROUND]
        for name in due:
            self._last[name] = now
            lab = Lab(name)
            exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [f'{quoted(lab.schema)}.dedup_scale']).fetchone()[0]
            if exists:
                self.sample(conn, lab.schema)

    def sample(self, conn: psycopg.Connection, lab_schema: str) -> None:
        """Measure every dedup table of ``lab_schema`` and write the figures to its ``dedup_scale``."""
        for table in DEDUP_TABLES:
            timings = self._timings[(lab_schema, table)]
            timings.extend(self.probe(conn, lab_schema, table))
            rows, estimated, table_bytes, index_bytes = self.size(conn, lab_schema, table)
            with conn.transaction():
                schema.enter_psycopg(conn, lab_schema)
                conn.execute(SAMPLE_SQL, {
                    "table": table, "rows": rows, "estimated": estimated, "table_bytes": table_bytes,
                    "index_bytes": index_bytes, "samples": len(timings),
                    "p50": round(statistics.median(timings), 4) if timings else None,
                    "p99": round(percentile(list(timings), 0.99), 4) if timings else None})

    def probe(self, conn: psycopg.Connection, lab_schema: str, table: str) -> list[float]:
        """PROBES timed inserts of new random keys, rolled back; milliseconds each."""
        timings = []
        try:
            with conn.transaction(force_rollback=True):
                schema.enter_psycopg(conn, lab_schema)
                statement = PROBE_SQL.get(table)
                if table == "processed_events":
                    layout = dedup_layout.layout(conn.execute)
                    statement = partitioned.CLAIM if layout == dedup_layout.PARTITIONED else eventid_atomic.CLAIM
                for _ in range(PROBES):
                    key = uuid.uuid4()
                    params = {"event_id": key, "key": key.hex, "occurred_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())}
                    started = time.perf_counter()
                    conn.execute(statement, params)
                    timings.append((time.perf_counter() - started) * 1000)
        except psycopg.Error as error:  # a table being rebuilt or dropped: skip this round
            log.warning("dedup probe of %s.%s: %s", lab_schema, table, str(error).splitlines()[0])
            return []
        return timings

    def size(self, conn: psycopg.Connection, lab_schema: str, table: str) -> tuple[int, bool, int, int]:
        """(rows, estimated?, table bytes, index bytes): rows counted exactly while the table is small."""
        with conn.transaction():
            schema.enter_psycopg(conn, lab_schema)
            found = conn.execute(SIZES_SQL, {"table": table}).fetchone()
            if found is None:
                return 0, False, 0, 0
            estimate, table_bytes, index_bytes, kind = found
            if kind == "p":
                estimate, table_bytes, index_bytes = conn.execute(PARTITIONED_SIZES_SQL, {"table": table}).fetchone()
            if estimate < EXACT_COUNT_BELOW:
                return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0], False, table_bytes, index_bytes
            return int(estimate), True, int(table_bytes), int(index_bytes)

    def create_partitions_ahead(self, conn: psycopg.Connection) -> None:
        """Day partitions ahead in every schema whose processed_events is partitioned."""
        schemas = [name for (name,) in conn.execute(
            "SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relname = 'processed_events' AND c.relkind = 'p'")]
        for name in schemas:
            try:
                with conn.transaction():
                    schema.enter_psycopg(conn, name)
                    created = dedup_layout.ensure_partitions(conn.execute)
                if created:
                    log.info("%s: day partitions created ahead: %s", name, ", ".join(created))
            except psycopg.Error as error:
                log.warning("%s: day partitions: %s", name, str(error).splitlines()[0])
