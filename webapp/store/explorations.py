"""``lab_control.explorations``: the explorer's runs of every lab, and every statement on them.

Written by three hands: the ``explore`` operation queues a row; the exploration's own process
(``python -m webapp.explorer``) marks it running, reports its progress and its result, and reads
its cancel flag; the agent that started the process says how it ended when it dies without saying
so itself. A lab has at most one queued or running exploration (a partial unique index).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, insert, literal_column, select, text, update
from sqlalchemy.exc import IntegrityError

from .tables import explorations

QUEUED, RUNNING = "queued", "running"
ACTIVE_STATES = (QUEUED, RUNNING)
FOUND, NOTHING_FOUND, CANCELLED, FAILED = "found", "nothing-found", "cancelled", "failed"
END_STATES = (FOUND, NOTHING_FOUND, CANCELLED, FAILED)
# An active exploration's row is refreshed at least every HEARTBEAT_SECONDS, by its process and by the
# agent watching that process; a row no one refreshed for STALE_SECONDS lost its agent (and the process
# with it: nobody was left to say so): it no longer holds the lab.
HEARTBEAT_SECONDS = 1.0
STALE_SECONDS = 30


class AlreadyExploring(Exception):
    """The lab has a queued or running exploration: ``row`` is it."""

    def __init__(self, row: dict[str, Any]):
        super().__init__(f"exploration {row['id']} is {row['state']} in lab {row['lab']}")
        self.row = row


def create(conn: Connection, lab: str, *, strategy: str | None, lane: str | None, budget_runs: int | None,
           budget_minutes: float | None, seed: int, faults: list[str] | None = None) -> dict[str, Any]:
    """Queue an exploration of ``lab`` (``faults``: the fault kinds it may use, None for every kind);
    AlreadyExploring when one is queued or running there."""
    try:
        with conn.begin_nested():
            return dict(conn.execute(insert(explorations).values(
                lab=lab, strategy=strategy, lane=lane, budget_runs=budget_runs, budget_minutes=budget_minutes,
                seed=seed, faults=faults, state=QUEUED).returning(*explorations.c)).mappings().one())
    except IntegrityError:
        row = active(conn, lab)
        if row is None:  # it ended between the insert and this read: the caller may try again
            raise
        raise AlreadyExploring(row) from None


def get(conn: Connection, exploration_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(explorations).where(explorations.c.id == exploration_id)).mappings().first()
    return dict(row) if row else None


def active(conn: Connection, lab: str) -> dict[str, Any] | None:
    """The lab's queued or running exploration, if any."""
    row = conn.execute(select(explorations).where(explorations.c.lab == lab,
                                                  explorations.c.state.in_(ACTIVE_STATES))).mappings().first()
    return dict(row) if row else None


def of_lab(conn: Connection, lab: str, limit: int = 5) -> list[dict[str, Any]]:
    """The lab's explorations, newest first."""
    return [dict(row) for row in conn.execute(select(explorations).where(explorations.c.lab == lab)
                                              .order_by(explorations.c.id.desc()).limit(limit)).mappings()]


def end_stale(conn: Connection, lab: str) -> list[int]:
    """Fail the lab's active explorations that stopped reporting (their agent died with their process)."""
    return list(conn.execute(
        update(explorations)
        .where(explorations.c.lab == lab, explorations.c.state.in_(ACTIVE_STATES),
               explorations.c.updated_at < func.now() - text(f"interval '{STALE_SECONDS} seconds'"))
        .values(state=FAILED, finished_at=func.now(), updated_at=func.now(),
                error=f"nothing reported on it for {STALE_SECONDS} s: its agent is gone, and its process "
                      "with it")
        .returning(explorations.c.id)).scalars())


def started_by(conn: Connection, exploration_id: int, agent_id: str, pid: int) -> None:
    """The agent that started the exploration's process, and its pid."""
    conn.execute(update(explorations).where(explorations.c.id == exploration_id)
                 .values(agent_id=agent_id, pid=pid, updated_at=func.now()))


def begin_running(conn: Connection, exploration_id: int) -> dict[str, Any] | None:
    """Mark a queued exploration running (its process starts the search); None when it is no longer
    queued or was cancelled before it started."""
    row = conn.execute(update(explorations)
                       .where(explorations.c.id == exploration_id, explorations.c.state == QUEUED,
                              explorations.c.cancel_requested.is_(False))
                       .values(state=RUNNING, started_at=func.now(), updated_at=func.now())
                       .returning(*explorations.c)).mappings().first()
    return dict(row) if row else None


def report(conn: Connection, exploration_id: int, *, phase: str | None = None, runs_done: int | None = None,
           schedule_length: int | None = None) -> bool:
    """Write progress (what is given; nothing given: a heartbeat); True when the lab asked it to stop."""
    values: dict[str, Any] = {"updated_at": func.now()}
    if phase is not None:
        values.update(phase=phase, runs_done=runs_done or 0, schedule_length=schedule_length)
    row = conn.execute(update(explorations)
                       .where(explorations.c.id == exploration_id, explorations.c.state.in_(ACTIVE_STATES))
                       .values(**values).returning(explorations.c.cancel_requested)).first()
    return bool(row[0]) if row else True  # gone or ended elsewhere: nothing more to do


def finish(conn: Connection, exploration_id: int, state: str, *, result: dict[str, Any] | None = None,
           error: str | None = None) -> bool:
    """Say how an active exploration ended; False when it had ended already (the first word stands)."""
    if state not in END_STATES:
        raise ValueError(f"{state!r} is not an end state: one of {', '.join(END_STATES)}")
    values: dict[str, Any] = {"state": state, "finished_at": func.now(), "updated_at": func.now(),
                              # a cancel's reason, written when it was asked, stands
                              "error": func.coalesce(explorations.c.error, error) if state == CANCELLED else error}
    if result is not None:
        values["result"] = result
        values["runs_done"] = result.get("runs", literal_column("runs_done"))
        values["schedule_length"] = result.get("schedule_length")
    return conn.execute(update(explorations)
                        .where(explorations.c.id == exploration_id, explorations.c.state.in_(ACTIVE_STATES))
                        .values(**values).returning(explorations.c.id)).first() is not None


def request_cancel(conn: Connection, lab: str, reason: str) -> list[int]:
    """Ask the lab's active exploration to stop, saying why (its process reads the flag, its agent
    enforces it); the ids asked."""
    return list(conn.execute(update(explorations)
                             .where(explorations.c.lab == lab, explorations.c.state.in_(ACTIVE_STATES))
                             .values(cancel_requested=True, error=func.coalesce(explorations.c.error, reason))
                             .returning(explorations.c.id)).scalars())


def cancel_requested(conn: Connection, exploration_id: int) -> bool:
    return bool(conn.execute(select(explorations.c.cancel_requested)
                             .where(explorations.c.id == exploration_id)).scalar())


def fingerprint(conn: Connection, lab: str) -> str:
    """Changes whenever what the Explorer panel shows of the lab changes (its newest rows)."""
    newest = select(explorations.c.id, explorations.c.state, explorations.c.phase, explorations.c.runs_done,
                    explorations.c.schedule_length, explorations.c.cancel_requested) \
        .where(explorations.c.lab == lab).order_by(explorations.c.id.desc()).limit(5).subquery()
    row = conn.execute(select(func.md5(func.coalesce(func.string_agg(
        func.concat_ws(":", *newest.c), literal_column("','")), "")))).scalar()
    return str(row)
