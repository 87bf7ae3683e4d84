"""``lab_control.consumers``, as the web and the operations see it: find one, arm it, step it.

The agent and the consumer process write the rest of the row (state, pid, positions, counts)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update

from ..models import Consumer

consumers = Consumer.__table__


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
