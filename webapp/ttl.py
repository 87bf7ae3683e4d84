"""TTL cleanup of the dedup tables, as the seed text's periodic job does it.

No TTL: the tables grow without bound. A TTL shorter than the redelivery window: an old
event comes back after its key was deleted and is applied twice. The lab shows both.
"""
from __future__ import annotations

from typing import Any, Callable

from .domain.vocabulary import DEDUP_TABLES, Limits

# Every key table with processed_at: the unique ones and check-then-act's seen_events (no constraint).
CLEANUP_SQL = {table: f"DELETE FROM {table} WHERE processed_at < now() - make_interval(secs => %(seconds)s)"
               for table in DEDUP_TABLES}
MAX_TTL_SECONDS = Limits.TTL_SECONDS[1]


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
    """Delete keys older than ``seconds`` in the connection's current schema; rows deleted per table."""
    seconds = check_seconds(seconds)
    return {table: execute(statement, {"seconds": seconds}).rowcount for table, statement in CLEANUP_SQL.items()}
