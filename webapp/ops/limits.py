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


def check_lanes(ctx: Context, lanes: int) -> None:
    """Refuse one more lane for a learner's own consumer when the lab has as many as the class allows."""
    most = classroom.limit(ctx.config, "LAB_MAX_LANES")
    if most is not None and lanes >= most:
        raise LimitReached("lane", f"lab {ctx.lab.name} already has {lanes} lane(s) for your own consumer, the most "
                                   f"one lab may have in this class (LAB_MAX_LANES={most}): use one of them")


def check_burst(ctx: Context, count: int | None) -> None:
    """Refuse a burst larger than the class allows one lab at a time."""
    most = classroom.limit(ctx.config, "LAB_MAX_BURST")
    if most is None or count is None or count <= most:
        return
    raise LimitReached("count", f"at most {most} events per burst in this class (LAB_MAX_BURST), so that every "
                                "attendee's lab keeps up: publish a smaller burst")


def check_ceiling(ctx: Context, field: str, setting: str, value: int) -> None:
    """Refuse ``value`` above the ceiling ``setting`` (unset: only the field's own bounds). A class
    gets its ceilings by default (webapp/settings/model.py); any deployment may set them."""
    ceiling = ctx.config.get(setting)
    if ceiling is not None and value > int(ceiling):
        raise LimitReached(field, f"must be at most {int(ceiling):,} on this lab ({setting})")


def check_raw_record(ctx: Context, value: str | None, headers: dict[str, str] | None) -> None:
    """A raw record within this lab's ceilings: its value's bytes, its headers and each header's bytes."""
    check_ceiling(ctx, "value", "LAB_MAX_RECORD_VALUE_BYTES", len((value or "").encode()))
    check_ceiling(ctx, "headers", "LAB_MAX_RECORD_HEADERS", len(headers or {}))
    for name, header in (headers or {}).items():
        check_ceiling(ctx, "headers", "LAB_MAX_RECORD_HEADER_BYTES", len(name.encode()) + len(header.encode()))
