"""The consumers panel: each consumer process of the lab (its control row), its redelivery window,
what it waits on (a lock, and who holds it) and whether the fault proxy keeps its offset commits
from the broker.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..store import faultproxies
from ..store.connection import CONTROL_SCHEMA
from ..store.consumers import LIVE_STATES

C = CONTROL_SCHEMA


# Consumers blocked on a lock, and who holds it: backends of this lab's consumers (their effects
# connections are named "lab <lab> <consumer> effects") waiting on a lock, each with the backends
# that block it and how long it has waited (pg_locks.waitstart).
LOCK_WAITS_SQL = """
SELECT split_part(w.application_name, ' ', 3) AS consumer, w.pid,
       extract(epoch FROM now() - (SELECT min(l.waitstart) FROM pg_locks l WHERE l.pid = w.pid AND NOT l.granted))
           AS seconds,
       h.pid AS holder_pid, h.application_name AS holder_application, h.state AS holder_state,
       extract(epoch FROM now() - h.xact_start) AS holder_transaction_seconds
FROM pg_stat_activity w
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocker(pid)
JOIN pg_stat_activity h ON h.pid = blocker.pid
WHERE w.application_name LIKE :prefix AND w.wait_event_type = 'Lock'
ORDER BY w.pid, h.pid
"""


def lock_waits(session: Session, lab: Lab, states: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Per consumer name: what it waits on, e.g. "waiting on a lock held by c1 (frozen) for 12 s"."""
    prefix = f"lab {lab.name} "
    result: dict[str, dict[str, Any]] = {}
    for row in session.execute(text(LOCK_WAITS_SQL), {"prefix": prefix.replace("_", "\\_") + "%"}).mappings():
        holder_app = row["holder_application"] or ""
        holder = holder_app.split(" ")[2] if holder_app.startswith(prefix) and holder_app.count(" ") >= 2 else None
        holder_state = (states or {}).get(holder) if holder else None
        seconds = float(row["seconds"]) if row["seconds"] is not None else None
        who = (f"{holder} ({holder_state})" if holder and holder_state else holder) or \
            f"another session (pid {row['holder_pid']}, {row['holder_state']})"
        text_ = f"waiting on a lock held by {who}" + (f" for {int(seconds)} s" if seconds is not None else "")
        result.setdefault(row["consumer"], {"holder": holder, "holder_pid": row["holder_pid"],
                                            "holder_state": holder_state, "seconds": seconds, "text": text_})
    return result


def consumers(session: Session, lab: Lab) -> list[dict[str, Any]]:
    rows = session.execute(text(
        f"SELECT c.*, extract(epoch FROM now() - c.heartbeat_at) AS heartbeat_age, g.strategy "
        f"FROM {C}.consumers c LEFT JOIN consumer_groups g USING (group_id) WHERE c.lab = :lab ORDER BY c.id"),
        {"lab": lab.name}).mappings().all()
    committed = {(g, p): o for g, p, o in session.execute(text("SELECT group_id, partition, committed FROM group_offsets"))}
    blocked = commit_blocks(session, lab)
    result = []
    for row in rows:
        item = dict(row)
        # Redelivery window: already-applied records that come back if this consumer dies now.
        item["redelivery_window"] = sum(
            max(0, int(applied) - (committed.get((row["group_id"], int(p))) or 0))
            for p, applied in (row["applied_positions"] or {}).items() if int(p) in (row["assigned"] or []))
        item["heartbeat_age"] = float(row["heartbeat_age"]) if row["heartbeat_age"] is not None else None
        item["commits_blocked_for"] = blocked.get(row["name"])  # seconds left, or None
        result.append(item)
    if any(item["state"] in LIVE_STATES for item in result):
        waits = lock_waits(session, lab, {item["name"]: item["state"] for item in result})
        for item in result:
            item["waiting_on"] = waits.get(item["name"])
    return result


def commit_blocks(session: Session, lab: Lab) -> dict[str, float]:
    """The lab's consumers whose offset commits the fault proxy keeps from the broker, with the
    seconds left (webapp/faultproxy/control.py); across every proxy row, the default one in practice."""
    return faultproxies.blocked_commits_of(session.connection(), None, lab.name, lab.client_id(""))
