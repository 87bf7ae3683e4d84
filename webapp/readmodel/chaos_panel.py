"""What the chaos panel shows: the lab's chaos sessions, the actions so far (from the timeline,
where the agent writes each one with its seed and index), and whether the verdict of the copy of
the accounts the group applies to still holds."""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..store.schema import enter
from . import verdict

RECENT_SQL = """
SELECT at, summary, detail->>'action' AS action, detail->>'outcome' AS outcome
FROM timeline WHERE kind = 'chaos' ORDER BY id DESC LIMIT :limit
"""
COUNTS_SQL = """
SELECT detail->>'action' AS action, coalesce(detail->>'outcome', 'done') AS outcome, count(*) AS n
FROM timeline WHERE kind = 'chaos' AND detail->>'session' = :session
  AND detail->>'action' NOT IN ('start', 'stop', 'undo')
GROUP BY 1, 2 ORDER BY 1, 2
"""
EFFECTS_SCHEMA_SQL = "SELECT effects_schema FROM consumer_groups WHERE group_id = :group_id"


def holds(judged: verdict.Verdict) -> bool:
    """The verdict holds while nothing was applied twice or lost (pending records are fine)."""
    return judged.status != "anomalies"


def panel_data(session: Session, lab: Lab, sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """The chaos panel's data; ``session`` works in the lab's schema and is left there. ``sessions``:
    what the ``get_chaos`` operation answers (the caller asks ops; a read model does not call up)."""
    shown = sessions[0] if sessions else None
    counts: list[dict[str, Any]] = []
    judged = None
    if shown is not None:
        counts = [dict(row) for row in session.execute(text(COUNTS_SQL), {"session": str(shown["id"])}).mappings()]
        effects_schema = session.execute(text(EFFECTS_SCHEMA_SQL), {"group_id": shown["group_id"]}).scalar()
        if effects_schema:
            enter(session.connection(), effects_schema)
            try:
                judged = verdict.verdict(session, lab.schema, explain=False)
            finally:
                enter(session.connection(), lab.schema)
    recent = [dict(row) for row in session.execute(text(RECENT_SQL), {"limit": 8}).mappings()]
    return {"sessions": sessions, "shown": shown, "counts": counts, "recent": recent, "verdict": judged,
            "holds": holds(judged) if judged is not None else None}
