"""What the Load and Dedup-at-scale panels show: the load generator's and the dedup warm-up's newest
runs (the lab's heavy jobs, both run by an agent), and per dedup
table its rows, sizes, sampled key-insert latency and last TTL cleanup (``dedup_scale``, written
by the agent's sampler and by the cleanup). Every query reads a handful of rows or catalog
entries: none of them grows with the log or the dedup tables.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.vocabulary import DEDUP_TABLES

# A running run that has not reported for this long has lost its thread (its agent died).
LOAD_STALE_SECONDS = 10.0

LOAD_RUNS_SQL = """
SELECT id, events, accounts, rate_per_second, resend_ratio, source_duplicate_ratio, seed, state, sent, resends,
       source_duplicates, failed, rate, cancel_requested, error, started_at, finished_at,
       extract(epoch FROM now() - updated_at) AS report_age,
       extract(epoch FROM coalesce(finished_at, now()) - started_at) AS elapsed
FROM load_runs ORDER BY id DESC LIMIT :limit
"""

WARMUP_RUNS_SQL = """
SELECT id, keys, days, state, inserted, rate, cancel_requested, error, started_at, finished_at,
       extract(epoch FROM now() - updated_at) AS report_age,
       extract(epoch FROM coalesce(finished_at, now()) - started_at) AS elapsed
FROM warmup_runs ORDER BY id DESC LIMIT :limit
"""

DEDUP_SCALE_SQL = """
SELECT table_name, rows, rows_estimated, table_bytes, index_bytes, insert_p50_ms, insert_p99_ms, insert_samples,
       extract(epoch FROM now() - sampled_at) AS sample_age, cleanup_ms, cleanup_method, cleanup_removed,
       extract(epoch FROM now() - cleanup_at) AS cleanup_age
FROM dedup_scale
"""

# Cheap facts that change when a panel of this module changes: the load runs' newest report, the
# sampler's newest sample and the newest cleanup.
FINGERPRINT_SQL = """
SELECT (SELECT concat_ws(':', max(id), max(updated_at), bool_or(cancel_requested)) FROM load_runs)
       || '/' || (SELECT concat_ws(':', max(id), max(updated_at), bool_or(cancel_requested)) FROM warmup_runs) AS load,
       (SELECT concat_ws(':', max(sampled_at), max(cleanup_at)) FROM dedup_scale) AS dedup_scale
"""


def fingerprint_parts(session: Session) -> dict[str, Any]:
    return dict(session.execute(text(FINGERPRINT_SQL)).mappings().one())


def load_runs(session: Session, limit: int = 3) -> list[dict[str, Any]]:
    """The newest runs, newest first, with their progress as a fraction and whether they stalled."""
    return _runs(session, LOAD_RUNS_SQL, limit, done="sent", asked="events")


def warmup_runs(session: Session, limit: int = 3) -> list[dict[str, Any]]:
    """The newest dedup warm-ups, newest first, with their progress and whether they stalled."""
    return _runs(session, WARMUP_RUNS_SQL, limit, done="inserted", asked="keys")


def _runs(session: Session, sql: str, limit: int, done: str, asked: str) -> list[dict[str, Any]]:
    """A heavy job's newest rows: progress is ``done`` of ``asked``; active and not reporting for
    LOAD_STALE_SECONDS is stalled."""
    runs = []
    for row in session.execute(text(sql), {"limit": limit}).mappings():
        run = dict(row)
        run["progress"] = run[done] / run[asked] if run[asked] else 0.0
        run["active"] = run["state"] in ("starting", "running")
        run["stalled"] = run["active"] and float(run["report_age"] or 0) > LOAD_STALE_SECONDS
        runs.append(run)
    return runs


def dedup_scale(session: Session) -> list[dict[str, Any]]:
    """One entry per dedup table, in the vocabulary's order; a table never sampled shows empty."""
    sampled = {row["table_name"]: dict(row) for row in session.execute(text(DEDUP_SCALE_SQL)).mappings()}
    return [sampled.get(table, {"table_name": table}) for table in DEDUP_TABLES]


def layout_of(session: Session) -> str:
    """The layout of the current schema's ``processed_events``, as the catalog has it."""
    kind = session.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass('processed_events')")).scalar()
    return "partitioned-by-day" if kind == "p" else "plain"


def day_partitions(session: Session) -> list[dict[str, Any]]:
    """The partitions of a partitioned ``processed_events``, oldest first (empty when plain)."""
    return [dict(row) for row in session.execute(text(
        "SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound, "
        "       c.reltuples::bigint AS rows_estimate, pg_total_relation_size(c.oid) AS bytes "
        "FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('processed_events') ORDER BY c.relname")).mappings()]
