"""The lab's timeline: published, delivered, applied, skipped, crashed, rebalanced, offsets reset.

Written from the agent and the consumers (psycopg) and from the web (SQLAlchemy's
``exec_driver_sql``): both take the same SQL with ``%(name)s`` parameters, so callers pass
their connection's execute function.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .schema import quoted

KINDS = ("published", "delivered", "applied", "absorbed", "dead-lettered", "crashed", "frozen", "thawed",
         "killed", "started", "stopped", "rebalanced", "offsets-reset", "strategy", "fault", "ttl", "lab",
         "commit-failed", "error", "scenario", "outbox", "chaos", "group-stalled", "group-recovered", "recovery",
         "transactions")

INSERT = "INSERT INTO timeline (kind, summary, detail) VALUES (%(kind)s, %(summary)s, %(detail)s::jsonb)"


def record(execute: Callable[..., Any], kind: str, summary: str, **detail: Any) -> None:
    """Append one entry in the connection's current lab schema."""
    if kind not in KINDS:
        raise ValueError(f"unknown timeline kind {kind!r}")
    execute(INSERT, {"kind": kind, "summary": summary, "detail": json.dumps(detail, default=str)})


def record_in(execute: Callable[..., Any], schema: str, kind: str, summary: str, **detail: Any) -> None:
    """Append one entry to the timeline of lab schema ``schema``, whatever the connection's search_path."""
    record(lambda statement, params: execute(statement.replace("INTO timeline", f'INTO {quoted(schema)}.timeline', 1),
                                             params), kind, summary, **detail)
