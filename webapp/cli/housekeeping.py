"""Old labs: ``flask --app app lab list`` and ``flask --app app lab prune --idle 12h``.

Every scenario run, guided run and attendee leaves a lab behind (schemas, topics, groups). ``list``
shows them all with their last activity; ``prune`` drops those idle for longer than a duration,
never the configured lab (LAB_NAME) nor a lab with a guided step running.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

import click
from flask import current_app
from flask.cli import with_appcontext
from sqlalchemy import Connection, text

from ..domain import commands, verbs
from ..domain.lab import Lab
from ..store import classroom, command_channel, scenario_runs
from ..store.labs import lab_schemas
from ..store.schema import quoted
from ..web.db import db

DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*$")
UNITS = {"s": 1, None: 1, "m": 60, "min": 60, "h": 3600, "d": 86400}
DROP_TIMEOUT = 120.0


@dataclass
class LabInfo:
    name: str
    created: str | None          # the lab's first timeline entry
    last_activity: str | None    # its newest timeline entry, or its attendee's last page view
    idle_seconds: float | None
    consumers: int               # live consumer processes
    size_bytes: int              # every table and index of its schemas (the lab's and its lanes')
    schemas: int
    attendee: str | None
    busy: bool                   # a guided step is running in it


def parse_duration(value: str) -> float:
    """``12h``, ``30m``, ``2d``, ``45s`` or plain seconds → seconds."""
    match = DURATION.match(value or "")
    if not match:
        raise ValueError(f"{value!r} is not a duration: give a number and s, m, h or d, like 12h")
    return float(match.group(1)) * UNITS[match.group(2)]


def lab_info(conn: Connection, lab: Lab) -> LabInfo:
    schemas = lab_schemas(conn, lab)
    size = conn.execute(text("SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                             "JOIN pg_namespace n ON n.oid = c.relnamespace "
                             "WHERE n.nspname = ANY(:s) AND c.relkind IN ('r', 'p', 'm')"), {"s": schemas}).scalar()
    created = last = idle = None
    if lab.schema in schemas and conn.execute(text("SELECT 1 FROM pg_tables WHERE schemaname = :s "
                                                   "AND tablename = 'timeline'"), {"s": lab.schema}).first():
        created, last, idle = conn.execute(text(
            f'SELECT min(at), max(at), extract(epoch FROM localtimestamp - max(at))::float8 '
            f'FROM {quoted(lab.schema)}.timeline')).one()
    attendee = classroom.attendee_of_lab(conn, lab.name)
    if attendee is not None and (idle is None or attendee.seen_seconds_ago < idle):
        last, idle = attendee.seen_at, attendee.seen_seconds_ago
    busy = scenario_runs.busy_in(conn, lab.name)
    return LabInfo(name=lab.name, created=created.isoformat(timespec="seconds") if created else None,
                   last_activity=last.isoformat(timespec="seconds") if last else None,
                   idle_seconds=round(max(0.0, idle), 1) if idle is not None else None,
                   consumers=classroom.live_consumer_count(conn, lab.name), size_bytes=int(size or 0),
                   schemas=len(schemas), attendee=attendee.name if attendee else None, busy=bool(busy))


def all_labs(conn: Connection) -> list[LabInfo]:
    return [lab_info(conn, Lab(name)) for name in classroom.lab_names(conn)]


def prunable(labs: list[LabInfo], idle_seconds: float, keep: set[str]) -> list[LabInfo]:
    """Labs idle longer than ``idle_seconds``, but never one in ``keep``, one with a guided step
    running, nor one with no recorded activity at all (nothing says how old it is)."""
    return [info for info in labs if info.name not in keep and not info.busy
            and info.idle_seconds is not None and info.idle_seconds > idle_seconds]


def drop_lab(lab: Lab) -> dict[str, Any]:
    """Drop one lab through an agent, or here when none runs."""
    config = current_app.config
    if command_channel.live_agents(db.engine):
        return command_channel.run(db.engine, lab.name, verbs.LAB_DROP,
                                   commands.encode(verbs.LAB_DROP, commands.NoArguments()), timeout=DROP_TIMEOUT)
    if not config.get("KAFKA_BOOTSTRAP_SERVERS"):
        raise click.UsageError("KAFKA_BOOTSTRAP_SERVERS is not set and no lab agent runs: the topics cannot be deleted")
    from ..agent.prune import drop
    from ..kafka.admin import admin_client
    return drop(db.engine, admin_client(config["KAFKA_BOOTSTRAP_SERVERS"]), lab)


def _size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    for unit, length in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= length:
            return f"{seconds / length:.1f} {unit}"
    return f"{seconds:.0f} s"


def _no_database() -> None:
    if current_app.config.get("NO_DATABASE"):
        raise click.ClickException(current_app.config["NO_DATABASE"])


@click.command("list")
@click.option("--json", "as_json", is_flag=True, help="one JSON document instead of a table")
@with_appcontext
def list_labs(as_json: bool) -> None:
    """Every lab on this database: created, last activity, consumers, size."""
    _no_database()
    with db.engine.connect() as conn:
        labs = all_labs(conn)
    if as_json:
        click.echo(json.dumps([asdict(info) for info in labs], indent=2))
        return
    click.echo(f"{'lab':<25} {'created':<20} {'last activity':<20} {'idle':>9} {'consumers':>9} {'size':>9}  attendee")
    for info in labs:
        click.echo(f"{info.name:<25} {info.created or '-':<20} {info.last_activity or '-':<20} "
                   f"{_age(info.idle_seconds):>9} {info.consumers:>9} {_size(info.size_bytes):>9}  "
                   f"{info.attendee or ''}")
    click.echo(f"{len(labs)} lab(s), {_size(sum(info.size_bytes for info in labs))}")


@click.command("prune")
@click.option("--idle", "idle", required=True, help="drop labs with no activity for longer than this (12h, 30m, 2d)")
@click.option("--dry-run", is_flag=True, help="list what would be dropped, drop nothing")
@with_appcontext
def prune(idle: str, dry_run: bool) -> None:
    """Drop labs idle for longer than --idle: their topics, groups, schemas and control rows.

    The configured lab (LAB_NAME) and labs with a guided step running are kept."""
    _no_database()
    try:
        idle_seconds = parse_duration(idle)
    except ValueError as error:
        raise click.BadParameter(str(error), param_hint="--idle") from None
    with db.engine.connect() as conn:
        doomed = prunable(all_labs(conn), idle_seconds, keep={current_app.config["LAB_NAME"]})
    if dry_run or not doomed:
        click.echo(json.dumps({"dry_run": dry_run, "would_drop" if dry_run else "dropped": [i.name for i in doomed]},
                              indent=2))
        return
    dropped, failed = [], {}
    for info in doomed:
        try:
            result = drop_lab(Lab(info.name))
            dropped.append(result)
            click.echo(f"dropped {info.name}: {len(result['topics'])} topic(s), {len(result['schemas'])} schema(s), "
                       f"{len(result['groups'])} group(s)"
                       + (f"; groups the broker kept: {', '.join(result['groups_kept'])}" if result["groups_kept"] else ""),
                       err=True)
        except command_channel.CommandError as error:
            failed[info.name] = str(error)
            click.echo(f"could not drop {info.name}: {error}", err=True)
    click.echo(json.dumps({"dropped": [d["lab"] for d in dropped], "failed": failed,
                           "groups_deleted": sorted(g for d in dropped for g in d["groups"]),
                           "groups_kept": {g: why for d in dropped for g, why in d["groups_kept"].items()}}, indent=2))
    if failed:
        sys.exit(1)


def register(group: click.Group) -> None:
    group.add_command(list_labs)
    group.add_command(prune)
