"""``lab_control.chaos_sessions``: the chaos sessions of every lab, and the agent running each."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, insert, select, update

from .tables import chaos_sessions as sessions

RUNNING = "running"
STOPPING = "stopping"
STOPPED = "stopped"


def create(conn: Connection, lab: str, group_id: str, seed: int, every_seconds: float, actions: list[str],
           down_seconds: float, max_actions: int | None, agent_id: str) -> dict[str, Any]:
    return dict(conn.execute(insert(sessions).values(
        lab=lab, group_id=group_id, seed=seed, every_seconds=every_seconds, actions=list(actions),
        down_seconds=down_seconds, max_actions=max_actions, agent_id=agent_id, status=RUNNING)
        .returning(*sessions.c)).mappings().one())


def get(conn: Connection, session_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(sessions).where(sessions.c.id == session_id)).mappings().first()
    return dict(row) if row else None


def of_lab(conn: Connection, lab: str, limit: int = 10) -> list[dict[str, Any]]:
    """The lab's sessions, newest first."""
    return [dict(row) for row in conn.execute(select(sessions).where(sessions.c.lab == lab)
                                              .order_by(sessions.c.id.desc()).limit(limit)).mappings()]


def active(conn: Connection, lab: str, group_id: str | None = None) -> list[dict[str, Any]]:
    """Sessions not stopped yet (running, or asked to stop), of the lab or of one of its groups."""
    query = select(sessions).where(sessions.c.lab == lab, sessions.c.status != STOPPED)
    if group_id is not None:
        query = query.where(sessions.c.group_id == group_id)
    return [dict(row) for row in conn.execute(query.order_by(sessions.c.id)).mappings()]


def request_stop(conn: Connection, session_id: int, reason: str) -> bool:
    """Ask the running agent to stop the session (it undoes what it left frozen or killed)."""
    return conn.execute(update(sessions).where(sessions.c.id == session_id, sessions.c.status == RUNNING)
                        .values(status=STOPPING, stop_reason=reason).returning(sessions.c.id)).first() is not None


def stopped(conn: Connection, session_id: int, reason: str | None = None) -> None:
    values: dict[str, Any] = {"status": STOPPED, "stopped_at": func.now()}
    if reason is not None:
        values["stop_reason"] = func.coalesce(sessions.c.stop_reason, reason)
    conn.execute(update(sessions).where(sessions.c.id == session_id, sessions.c.status != STOPPED).values(**values))


def status(conn: Connection, session_id: int) -> str | None:
    return conn.execute(select(sessions.c.status).where(sessions.c.id == session_id)).scalar()


def acted(conn: Connection, session_id: int, summary: str) -> None:
    conn.execute(update(sessions).where(sessions.c.id == session_id)
                 .values(actions_done=sessions.c.actions_done + 1, last_action=summary))


def of_dead_agents(conn: Connection, lab: str, live_agents: list[str]) -> list[dict[str, Any]]:
    """The lab's unfinished sessions whose agent no longer beats: nothing carries them on."""
    return [row for row in active(conn, lab) if row["agent_id"] not in live_agents]
