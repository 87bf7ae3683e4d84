"""The agent's statements on ``lab_control.consumers``: the rows of the processes it owns.

The web's statements on the same table are in store/consumers.py; the consumer process writes
its own report (consumer/control.py). The agent writes what only the owner of the process knows:
that it exists (insert), its pid, how it ended, and that it is gone when its agent died.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, select, update

from ..domain.vocabulary import LIVE_STATES as _LIVE, ConsumerState
from ..models import Consumer

T = Consumer.__table__
LIVE_STATES = [str(state) for state in _LIVE]
# Ending in one of these drops the partitions a consumer last reported.
NO_ASSIGNMENT = (ConsumerState.KILLED, ConsumerState.STOPPED, ConsumerState.CRASHED, ConsumerState.FAILED,
                 ConsumerState.GONE)


@dataclass(frozen=True)
class Row:
    id: int
    lab: str
    name: str
    group_id: str
    agent_id: str | None
    state: str
    pid: int | None


def _rows(conn: Connection, *where) -> list[Row]:
    query = select(T.c.id, T.c.lab, T.c.name, T.c.group_id, T.c.agent_id, T.c.state, T.c.pid).where(*where)
    return [Row(*r) for r in conn.execute(query.order_by(T.c.id))]


def get(conn: Connection, consumer_id: int) -> Row | None:
    rows = _rows(conn, T.c.id == consumer_id)
    return rows[0] if rows else None


def live(conn: Connection, lab: str, group_id: str | None = None) -> list[Row]:
    """The lab's (or one group's) consumers whose process should be running."""
    where = [T.c.lab == lab, T.c.state.in_(LIVE_STATES)]
    if group_id is not None:
        where.append(T.c.group_id == group_id)
    return _rows(conn, *where)


def next_name(conn: Connection, lab: str) -> str:
    count = conn.execute(select(func.count()).select_from(T).where(T.c.lab == lab)).scalar_one()
    return f"c{count + 1}"


def create(conn: Connection, lab: str, name: str, group_id: str, agent_id: str) -> int:
    return conn.execute(T.insert().values(lab=lab, name=name, group_id=group_id, agent_id=agent_id,
                                          state=ConsumerState.STARTING.value).returning(T.c.id)).scalar_one()


def spawned(conn: Connection, consumer_id: int, pid: int) -> None:
    conn.execute(update(T).where(T.c.id == consumer_id)
                 .values(pid=pid, state=ConsumerState.STARTING.value, exit_code=None, heartbeat_at=None))


def set_state(conn: Connection, consumer_id: int, state: str, exit_code: int | None = None) -> None:
    values = {"state": state, "exit_code": exit_code}
    if state in NO_ASSIGNMENT:
        values["assigned"] = []
    conn.execute(update(T).where(T.c.id == consumer_id).values(**values))


def of_agents(conn: Connection, agent_ids: list[str]) -> list[Row]:
    """The consumers of these agents that still look alive."""
    if not agent_ids:
        return []
    return _rows(conn, T.c.agent_id.in_(agent_ids), T.c.state.in_(LIVE_STATES))


def orphaned(conn: Connection, live_agent_ids: list[str]) -> list[Row]:
    """Consumers that look alive but whose agent is not among the live ones."""
    where = [T.c.state.in_(LIVE_STATES)]
    if live_agent_ids:
        where.append(T.c.agent_id.not_in(live_agent_ids))
    return _rows(conn, *where)


def mark_gone(conn: Connection, consumer_id: int) -> bool:
    """Gone, unless it ended meanwhile (a consumer that saw its agent die stops itself)."""
    return bool(conn.execute(update(T).where(T.c.id == consumer_id, T.c.state.in_(LIVE_STATES))
                             .values(state=ConsumerState.GONE.value, assigned=[])).rowcount)
