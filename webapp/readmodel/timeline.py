"""The timeline panel: what happened in the lab (the timeline's entries) and every delivery's
outcome, newest first.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

TIMELINE_SQL = """
SELECT at, kind, summary FROM (
    SELECT at, kind, summary FROM timeline
    UNION ALL
    SELECT delivered_at, outcome,
           consumer || ' ' || outcome || ' p' || partition || '@' || "offset"
           || CASE WHEN attempt > 1 THEN ' (delivery #' || attempt || ')' ELSE '' END
           || coalesce(': ' || reason, '')
    FROM deliveries
) t ORDER BY at DESC LIMIT :limit
"""


def timeline(session: Session, limit: int = 30) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in session.execute(text(TIMELINE_SQL), {"limit": limit})]
