"""TTL cleanup of the dedup tables, as the seed text's periodic job does it.

No TTL: the tables grow without bound. A TTL shorter than the redelivery window: an old
event comes back after its key was deleted and is applied twice. The lab shows both.
"""
from __future__ import annotations

import time
from typing import Any, Callable

from ..domain.vocabulary import DEDUP_TABLES, Limits
from . import dedup_layout

# Every key table with processed_at: the unique ones and check-then-act's seen_events (no constraint).
CLEANUP_SQL = {table: f"DELETE FROM {table} WHERE processed_at < now() - make_interval(secs => %(seconds)s)"
               for table in DEDUP_TABLES}
MAX_TTL_SECONDS = Limits.TTL_SECONDS[1]
CLEANUP_REPORT_SQL = """
INSERT INTO dedup_scale (table_name, cleanup_ms, cleanup_method, cleanup_removed, cleanup_at)
VALUES (%(table)s, %(ms)s, %(method)s, %(removed)s, now())
ON CONFLICT (table_name) DO UPDATE SET cleanup_ms = EXCLUDED.cleanup_ms, cleanup_method = EXCLUDED.cleanup_method,
    cleanup_removed = EXCLUDED.cleanup_removed, cleanup_at = EXCLUDED.cleanup_at
"""


class InvalidTtl(ValueError):
    pass


def check_seconds(value: Any) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise InvalidTtl("ttl_seconds must be a number of seconds") from None
    if not 0 <= seconds <= MAX_TTL_SECONDS:
        raise InvalidTtl(f"ttl_seconds must be between 0 and {MAX_TTL_SECONDS}")
    return seconds


def cleanup(execute: Callable[..., Any], seconds: float) -> dict[str, int]:
    """Delete keys older than ``seconds`` in the connection's current schema; rows deleted per table.

    A ``processed_events`` partitioned by day (webapp/strategies/dedup_layout.py) drops its expired days'
    partitions instead. Each table's cleanup is timed and kept in ``dedup_scale`` (the Dedup at
    scale panel)."""
    seconds = check_seconds(seconds)
    partitioned = dedup_layout.layout(execute) == dedup_layout.PARTITIONED
    removed = {}
    for table, statement in CLEANUP_SQL.items():
        started = time.perf_counter()
        if table == "processed_events" and partitioned:
            removed[table], method = dedup_layout.drop_expired(execute, seconds), "drop-partitions"
        else:
            removed[table], method = execute(statement, {"seconds": seconds}).rowcount, "delete"
        execute(CLEANUP_REPORT_SQL, {"table": table, "ms": (time.perf_counter() - started) * 1000, "method": method,
                                     "removed": removed[table]})
    return removed
