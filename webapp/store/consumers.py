"""``lab_control.consumers``: every statement on it but the consumer process's own report
(consumer/control.py).

The web and the operations find a consumer, arm it and step it; the agent, which owns the
process, writes what only it knows: that it exists (insert), its pid, how it ended, and that it
is gone when its agent died."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select, text, update

from ..domain.lab import Lab
from ..domain.vocabulary import LIVE_STATES as _LIVE
from ..domain.vocabulary import ConsumerState, Outcome
from .schema import quoted
from .tables import consumers


def find(conn: Connection, lab: str, consumer_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(consumers).where(consumers.c.id == consumer_id, consumers.c.lab == lab)).mappings().first()
    return dict(row) if row else None


def arm(conn: Connection, consumer_id: int, point: str | None, action: str | None, always: bool) -> None:
    conn.execute(update(consumers).where(consumers.c.id == consumer_id)
                 .values(armed_point=point, armed_action=action, armed_always=always))


def set_step_mode(conn: Connection, consumer_id: int, on: bool) -> None:
    conn.execute(update(consumers).where(consumers.c.id == consumer_id).values(step_mode=on))


def advance_step(conn: Connection, consumer_id: int) -> int:
    """Let a stepping consumer move past its point; the new advance counter."""
    return conn.execute(update(consumers).where(consumers.c.id == consumer_id)
                        .values(step_advance=consumers.c.step_advance + 1)
                        .returning(consumers.c.step_advance)).scalar_one()


# --- the agent's statements: the rows of the processes it owns ------------------------------

LIVE_STATES = tuple(str(state) for state in _LIVE)
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
    query = select(consumers.c.id, consumers.c.lab, consumers.c.name, consumers.c.group_id, consumers.c.agent_id, consumers.c.state, consumers.c.pid).where(*where)
    return [Row(*r) for r in conn.execute(query.order_by(consumers.c.id))]


def get(conn: Connection, consumer_id: int) -> Row | None:
    rows = _rows(conn, consumers.c.id == consumer_id)
    return rows[0] if rows else None


def live(conn: Connection, lab: str, group_id: str | None = None) -> list[Row]:
    """The lab's (or one group's) consumers whose process should be running."""
    where = [consumers.c.lab == lab, consumers.c.state.in_(LIVE_STATES)]
    if group_id is not None:
        where.append(consumers.c.group_id == group_id)
    return _rows(conn, *where)


def next_name(conn: Connection, lab: str) -> str:
    count = conn.execute(select(func.count()).select_from(consumers).where(consumers.c.lab == lab)).scalar_one()
    return f"c{count + 1}"


def create(conn: Connection, lab: str, name: str, group_id: str, agent_id: str) -> int:
    return conn.execute(consumers.insert().values(lab=lab, name=name, group_id=group_id, agent_id=agent_id,
                                          state=ConsumerState.STARTING.value).returning(consumers.c.id)).scalar_one()


def spawned(conn: Connection, consumer_id: int, pid: int) -> None:
    conn.execute(update(consumers).where(consumers.c.id == consumer_id)
                 .values(pid=pid, state=ConsumerState.STARTING.value, exit_code=None, heartbeat_at=None,
                         assigned=[], assigned_at=func.now()))  # a new member: its group rebalances


def set_state(conn: Connection, consumer_id: int, state: str, exit_code: int | None = None) -> None:
    values = {"state": state, "exit_code": exit_code}
    if state in NO_ASSIGNMENT:
        values["assigned"] = []
        values["assigned_at"] = func.now()  # a member gone: its group rebalances
    conn.execute(update(consumers).where(consumers.c.id == consumer_id).values(**values))


def count_from_the_ledger(conn: Connection, consumer_id: int) -> None:
    """An exited consumer's counts as its group's delivery ledger holds them. A running process
    reports its own every half second; a kill loses what it applied since its last report, so the
    card of a killed consumer would show fewer than the ledger (and its restart would count on from
    there)."""
    row = conn.execute(select(consumers.c.lab, consumers.c.group_id, consumers.c.name)
                       .where(consumers.c.id == consumer_id)).first()
    if row is None:
        return
    journal = quoted(Lab(row.lab).schema)
    effects = conn.execute(text(f"SELECT effects_schema FROM {journal}.consumer_groups WHERE group_id = :g"),
                           {"g": row.group_id}).scalar()
    if effects is None:
        return
    counts = conn.execute(text(
        f"SELECT count(*) FILTER (WHERE outcome = :applied), count(*) FILTER (WHERE outcome = :absorbed), "
        f"count(*) FILTER (WHERE outcome = :dead) FROM {quoted(effects)}.deliveries "
        "WHERE group_id = :g AND consumer = :name"),
        {"applied": str(Outcome.APPLIED), "absorbed": str(Outcome.ABSORBED), "dead": str(Outcome.DEAD_LETTERED),
         "g": row.group_id, "name": row.name}).one()
    conn.execute(update(consumers).where(consumers.c.id == consumer_id)
                 .values(applied=counts[0], absorbed=counts[1], dead_lettered=counts[2]))


def of_agents(conn: Connection, agent_ids: list[str]) -> list[Row]:
    """The consumers of these agents that still look alive."""
    if not agent_ids:
        return []
    return _rows(conn, consumers.c.agent_id.in_(agent_ids), consumers.c.state.in_(LIVE_STATES))


def orphaned(conn: Connection, live_agent_ids: list[str]) -> list[Row]:
    """Consumers that look alive but whose agent is not among the live ones."""
    where = [consumers.c.state.in_(LIVE_STATES)]
    if live_agent_ids:
        where.append(consumers.c.agent_id.not_in(live_agent_ids))
    return _rows(conn, *where)


def mark_gone(conn: Connection, consumer_id: int) -> bool:
    """Gone, unless it ended meanwhile (a consumer that saw its agent die stops itself)."""
    return bool(conn.execute(update(consumers).where(consumers.c.id == consumer_id, consumers.c.state.in_(LIVE_STATES))
                             .values(state=ConsumerState.GONE.value, assigned=[], assigned_at=func.now())).rowcount)
