"""The lab's consumer groups as its schema records them (strategy, effects schema, throughput
settings), and the copies of the accounts they apply to (effects_schemas): what most panels start from.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab


def groups_list(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(text("SELECT group_id, strategy, effects_schema FROM consumer_groups ORDER BY created_at"))
    return [dict(row._mapping) for row in rows]


def groups_kafka_settings(session: Session) -> list[dict[str, Any]]:
    """Each group's throughput settings (ops/throughput.py): batch size, commit mode, static membership."""
    rows = session.execute(text("SELECT group_id, strategy, batch_size, commit_mode, static_membership "
                                "FROM consumer_groups ORDER BY created_at"))
    return [dict(row._mapping) for row in rows]


def effects_schemas(session: Session, lab: Lab) -> list[str]:
    """The lab's own schema first, then each strategy lane's copy of the accounts."""
    rows = session.execute(text("SELECT DISTINCT effects_schema FROM consumer_groups")).scalars()
    return [lab.schema] + sorted(s for s in rows if s != lab.schema and lab.owns_schema(s))
