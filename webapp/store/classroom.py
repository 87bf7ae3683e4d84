"""Classroom mode: a lab per attendee on one server, the instructor's board, per-lab limits.

Classroom mode is on when the instructor sets a class code (``LAB_CLASS_CODE``) or
``LAB_CLASSROOM=1``. An attendee joins with a name (and the code): the attendee's own lab is an
ordinary lab (its own schema, topics and groups, see domain/lab.py) whose name is derived from
theirs, kept in ``lab_control.attendees``. The web layer binds the browser session to it
(webapp/web/classroom.py); this module holds what does not need a request: names, the attendee
rows, the board's cards and the limits every operation checks.
"""
from __future__ import annotations

import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError

from .connection import CONTROL_SCHEMA
from ..domain.lab import NAME, Lab
from ..domain.vocabulary import LIVE_STATES
from .schema import all_lab_schemas

C = CONTROL_SCHEMA
NAME_LENGTH = 40        # an attendee's name as typed (collapsed spaces)
SLUG_LENGTH = 15        # the name's part of the lab name; the rest is "_" and 4 hex digits


class ClassroomError(ValueError):
    """A join that cannot happen: ``field`` names what to fix, the message says how."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def enabled(config: Mapping[str, Any]) -> bool:
    """Whether this server runs a class: a class code or LAB_CLASSROOM=1."""
    return bool(config.get("LAB_CLASS_CODE")) or bool(config.get("LAB_CLASSROOM"))


def class_code(config: Mapping[str, Any]) -> str:
    return str(config.get("LAB_CLASS_CODE") or "")


# --- names ------------------------------------------------------------------------------------

def clean_name(raw: str | None) -> str:
    """An attendee's name as shown: spaces collapsed, control characters refused."""
    name = " ".join(str(raw or "").split())
    if not name:
        raise ClassroomError("name", "type your name (it names your lab)")
    if len(name) > NAME_LENGTH:
        raise ClassroomError("name", f"at most {NAME_LENGTH} characters")
    if any(unicodedata.category(ch).startswith("C") for ch in name):
        raise ClassroomError("name", "letters, digits, spaces and punctuation only")
    return name


def lab_slug(name: str) -> str:
    """``Ana Souza`` → ``ana_souza``: ASCII letters and digits of the name, starting with a letter."""
    ascii_name = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode().lower()
    slug = re.sub(r"[^a-z0-9]+", "_", ascii_name).strip("_")
    if not slug or not slug[0].isalpha():
        slug = "a" + slug
    return slug[:SLUG_LENGTH].rstrip("_")


def new_lab_name(name: str) -> str:
    """A lab name for a new attendee: the name's slug and a random suffix (unique checked on insert)."""
    lab = f"{lab_slug(name)}_{secrets.token_hex(2)}"
    assert NAME.match(lab), lab  # the slug rules above keep it inside Lab's rules
    return lab


# --- attendees --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Attendee:
    id: int
    name: str
    lab: str
    class_code: str
    joined_at: datetime
    seen_at: datetime
    seen_seconds_ago: float


def find_attendee(conn: Connection, code: str, name: str) -> Attendee | None:
    row = conn.execute(text(f"SELECT id, name, lab, class_code, joined_at, seen_at, extract(epoch FROM localtimestamp - seen_at)::float8 FROM {C}.attendees "
                            "WHERE class_code = :code AND lower(name) = lower(:name)"),
                       {"code": code, "name": name}).first()
    return Attendee(*row) if row else None


def attendee_of_lab(conn: Connection, lab: str) -> Attendee | None:
    row = conn.execute(text(f"SELECT id, name, lab, class_code, joined_at, seen_at, extract(epoch FROM localtimestamp - seen_at)::float8 FROM {C}.attendees "
                            "WHERE lab = :lab"), {"lab": lab}).first()
    return Attendee(*row) if row else None


def attendees(conn: Connection, code: str | None = None) -> list[Attendee]:
    """The attendees of one class (every class when ``code`` is None), by name."""
    where, params = ("WHERE class_code = :code", {"code": code}) if code is not None else ("", {})
    rows = conn.execute(text(f"SELECT id, name, lab, class_code, joined_at, seen_at, extract(epoch FROM localtimestamp - seen_at)::float8 FROM {C}.attendees {where} "
                             "ORDER BY lower(name), id"), params).all()
    return [Attendee(*row) for row in rows]


def lab_names(conn: Connection) -> list[str]:
    """Every lab with a schema in this database (lanes counted with their lab)."""
    return sorted({Lab.of_schema(schema).name for schema in all_lab_schemas(conn)})


def add_attendee(engine: Engine, code: str, name: str, lab: str) -> Attendee:
    """Insert the attendee; the one already there when two joined under the same name at once."""
    try:
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {C}.attendees (class_code, name, lab) VALUES (:code, :name, :lab)"),
                         {"code": code, "name": name, "lab": lab})
    except IntegrityError:
        pass
    with engine.connect() as conn:
        found = find_attendee(conn, code, name)
    if found is None:
        raise ClassroomError("name", "could not register this name; try again")
    return found


def touch(engine: Engine, lab: str) -> None:
    """The attendee of ``lab`` was seen now (their last activity on the board)."""
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {C}.attendees SET seen_at = now() WHERE lab = :lab "
                          "AND seen_at < now() - interval '5 seconds'"), {"lab": lab})


def forget_labs(conn: Connection, labs: list[str]) -> None:
    """Remove the attendee rows and guided runs of labs that were dropped."""
    conn.execute(text(f"DELETE FROM {C}.attendees WHERE lab = ANY(:labs)"), {"labs": labs})
    conn.execute(text(f"DELETE FROM {C}.scenario_runs WHERE lab = ANY(:labs)"), {"labs": labs})


# --- what the board shows ---------------------------------------------------------------------

def latest_runs(conn: Connection, labs: list[str]) -> dict[str, dict[str, Any]]:
    """The newest guided run of each lab: scenario, status, progress."""
    rows = conn.execute(text(f"SELECT DISTINCT ON (lab) id, lab, scenario, status, progress, busy, updated_at "
                             f"FROM {C}.scenario_runs WHERE lab = ANY(:labs) ORDER BY lab, id DESC"),
                        {"labs": labs}).mappings().all()
    return {row["lab"]: dict(row) for row in rows}


def live_consumers(conn: Connection, labs: list[str]) -> dict[str, int]:
    rows = conn.execute(text(f"SELECT lab, count(*) FROM {C}.consumers WHERE lab = ANY(:labs) "
                             "AND state = ANY(:live) GROUP BY lab"), {"labs": labs, "live": [str(s) for s in LIVE_STATES]}).all()
    return {lab: count for lab, count in rows}


def idle_seconds(conn: Connection, lab: Lab) -> float | None:
    """Seconds since the lab's newest timeline entry (every operation and consumer event writes
    one); None for a lab without a schema. In SQL: the column holds the server's local time."""
    exists = conn.execute(text("SELECT 1 FROM pg_tables WHERE schemaname = :s AND tablename = 'timeline'"),
                          {"s": lab.schema}).first()
    if exists is None:
        return None
    value = conn.execute(text(f'SELECT extract(epoch FROM localtimestamp - max(at)) FROM "{lab.schema}".timeline')
                         ).scalar()
    return max(0.0, float(value)) if value is not None else None


# --- per-lab limits ---------------------------------------------------------------------------

def limit(config: Mapping[str, Any], key: str) -> int | None:
    """A per-lab limit when classroom mode is on; None (no limit) otherwise."""
    if not enabled(config):
        return None
    value = config.get(key)
    return int(value) if value not in (None, "") else None


def live_consumer_count(conn: Connection, lab: str) -> int:
    return conn.execute(text(f"SELECT count(*) FROM {C}.consumers WHERE lab = :lab AND state = ANY(:live)"),
                        {"lab": lab, "live": [str(s) for s in LIVE_STATES]}).scalar_one()


def lab_count_limit_reached(conn: Connection, config: Mapping[str, Any]) -> str | None:
    """Why no new lab may be created on this server, or None."""
    most = int(config.get("LAB_MAX_LABS") or 0)
    if most and len(lab_names(conn)) >= most:
        return (f"this server already holds {most} labs, the most it allows (LAB_MAX_LABS): ask the instructor to "
                "prune idle labs (`flask --app app lab prune --idle 12h`) or raise the limit")
    return None
