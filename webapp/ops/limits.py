"""Per-lab limits in classroom mode: one attendee's lab must not starve the class.

Checked by the operations that add load (a consumer process, a burst of events) before they act;
a limit reached is bad input for this lab (400 naming the field, the form shows it), never a 500.
Outside classroom mode nothing is limited here (the fields' own bounds still hold).
"""
from __future__ import annotations

from ..store import classroom
from .registry import Context, InvalidRequest


class LimitReached(InvalidRequest):
    """A per-lab limit of the class: the message says which, how many, and what to do."""


def check_consumers(ctx: Context) -> None:
    """Refuse one more consumer process when the lab runs as many as the class allows."""
    most = classroom.limit(ctx.config, "LAB_MAX_CONSUMERS")
    if most is None:
        return
    with ctx.engine.connect() as conn:
        running = classroom.live_consumer_count(conn, ctx.lab.name)
    if running >= most:
        raise LimitReached("consumers", f"lab {ctx.lab.name} already runs {running} consumer(s), the most one lab may "
                                        f"run in this class (LAB_MAX_CONSUMERS={most}): stop one first")


def check_burst(ctx: Context, count: int | None) -> None:
    """Refuse a burst larger than the class allows one lab at a time."""
    most = classroom.limit(ctx.config, "LAB_MAX_BURST")
    if most is None or count is None or count <= most:
        return
    raise LimitReached("count", f"at most {most} events per burst in this class (LAB_MAX_BURST), so that every "
                                "attendee's lab keeps up: publish a smaller burst")
