"""Statements on ``lab_control.agents``: who serves the lab, and whether it still beats.

An agent's id is unique per process start (``host:pid:<6 hex>``); its row is written by its own
heartbeat thread every second and deleted when it stops gracefully. An agent whose heartbeat is
older than ``AGENT_FRESH_SECONDS`` is dead: its rows are reconciled by the others (agent/queue.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection, delete, func, literal, select
from sqlalchemy.dialects.postgresql import insert

from ..domain.vocabulary import AGENT_FRESH_SECONDS
from .tables import agents as T


def _ago(seconds: float):
    return func.now() - literal(timedelta(seconds=seconds))


def _age():
    return func.extract("epoch", func.now() - T.c.heartbeat_at)


@dataclass(frozen=True)
class AgentRow:
    id: str
    host: str
    pid: int
    age: float  # seconds since its last heartbeat


def beat(conn: Connection, agent_id: str, host: str, pid: int, kafka_error: str | None) -> None:
    """Insert the agent's row or refresh its heartbeat, with what its last look at the broker said
    (``kafka_error`` None: the broker answered)."""
    statement = insert(T).values(id=agent_id, host=host, pid=pid, kafka_ok=kafka_error is None, kafka_error=kafka_error)
    conn.execute(statement.on_conflict_do_update(index_elements=[T.c.id], set_={
        "heartbeat_at": func.now(), "kafka_ok": statement.excluded.kafka_ok,
        "kafka_error": statement.excluded.kafka_error}))


def remove(conn: Connection, agent_id: str) -> None:
    conn.execute(delete(T).where(T.c.id == agent_id))


def live_ids(conn: Connection, fresh: float = AGENT_FRESH_SECONDS) -> list[str]:
    """Agents that reported within ``fresh`` seconds, oldest first."""
    return list(conn.execute(select(T.c.id).where(T.c.heartbeat_at > _ago(fresh)).order_by(T.c.started_at))
                .scalars())


def ages(conn: Connection, agent_ids: list[str]) -> dict[str, float]:
    """Seconds since each known agent's last heartbeat (agents without a row are left out)."""
    if not agent_ids:
        return {}
    rows = conn.execute(select(T.c.id, _age()).where(T.c.id.in_(agent_ids)))
    return {agent_id: float(age) for agent_id, age in rows}


def same_host_and_pid(conn: Connection, host: str, pid: int, but: str) -> list[AgentRow]:
    """Rows of other agents with this host and pid: an earlier process, certainly dead (we have its pid)."""
    rows = conn.execute(select(T.c.id, T.c.host, T.c.pid, _age())
                        .where(T.c.host == host, T.c.pid == pid, T.c.id != but))
    return [AgentRow(r[0], r[1], r[2], float(r[3])) for r in rows]


def dead(conn: Connection, fresh: float = AGENT_FRESH_SECONDS) -> list[AgentRow]:
    """Agents whose heartbeat is older than ``fresh`` seconds."""
    rows = conn.execute(select(T.c.id, T.c.host, T.c.pid, _age()).where(T.c.heartbeat_at <= _ago(fresh)))
    return [AgentRow(r[0], r[1], r[2], float(r[3])) for r in rows]


def prune(conn: Connection, older_than: float) -> int:
    """Forget agents silent for ``older_than`` seconds (their rows were reconciled long before)."""
    return conn.execute(delete(T).where(T.c.heartbeat_at <= _ago(older_than))).rowcount
