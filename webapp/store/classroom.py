"""Classroom mode: a lab per attendee on one server, the instructor's board, per-lab limits.

Classroom mode is on when the instructor sets a class code (``LAB_CLASS_CODE``) or
``LAB_CLASSROOM=1``. An attendee joins with a name (and the code): the attendee's own lab is an
ordinary lab (its own schema, topics and groups, see domain/lab.py) whose name is derived from
theirs, kept in ``lab_control.attendees``. The web layer binds the browser session to it
(webapp/web/classroom.py); this module holds what does not need a request: names, the attendee
rows, the board's cards and the limits every operation checks.

A name is unique in its class whatever its letter case (``name_key``, the name casefolded), and
it is not a secret: joining gives the attendee a short personal rejoin code, and opening the
same lab from another browser needs it (or the instructor issues a new one from the board). The
code is kept as a salted PBKDF2 hash, like a password, and compared in constant time.
"""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import unicodedata
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Mapping

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import IntegrityError, InternalError, OperationalError, ProgrammingError

from ..domain.lab import NAME, Lab
from ..domain.vocabulary import LIVE_STATES
from .connection import CONTROL_SCHEMA
from .schema import all_lab_schemas, quoted

C = CONTROL_SCHEMA
NAME_LENGTH = 40        # an attendee's name as typed (collapsed spaces)
KEY_LENGTH = 64         # attendees.name_key
SLUG_LENGTH = 15        # the name's part of the lab name; the rest is "_" and 4 hex digits
# A rejoin code: 8 characters of an alphabet without look-alikes (no 0/O, 1/I/L), shown as XXXX-XXXX:
# 40 bits, against guesses limited to a handful a minute per browser (web/ratelimit.py).
REJOIN_ALPHABET = "23456789ABCDEFGHJKMNPQRSTUVWXYZ"
REJOIN_LENGTH = 8
# PBKDF2-SHA256 iterations for a rejoin code's hash: about 40 ms a join or rejoin on a laptop core.
REJOIN_HASH_ITERATIONS = 100_000
_ATTENDEE_COLUMNS = ("id, name, lab, class_code, joined_at, seen_at, "
                     "extract(epoch FROM localtimestamp - seen_at)::float8")


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


def name_key(name: str) -> str:
    """What makes two names the same in a class: ``Ana``, ``ANA`` and ``ana`` are one attendee.
    Cut to the column's 64 characters: casefolding can lengthen a name (``ß`` is ``ss``)."""
    return clean_name(name).casefold()[:KEY_LENGTH]


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
    """The attendee of class ``code`` with this name, in any letter case."""
    row = conn.execute(text(f"SELECT {_ATTENDEE_COLUMNS} FROM {C}.attendees "
                            "WHERE class_code = :code AND name_key = :key"),
                       {"code": code, "key": name_key(name)}).first()
    return Attendee(*row) if row else None


def attendee_of_lab(conn: Connection, lab: str) -> Attendee | None:
    row = conn.execute(text(f"SELECT {_ATTENDEE_COLUMNS} FROM {C}.attendees WHERE lab = :lab"), {"lab": lab}).first()
    return Attendee(*row) if row else None


def attendees(conn: Connection, code: str | None = None) -> list[Attendee]:
    """The attendees of one class (every class when ``code`` is None), by name."""
    where, params = ("WHERE class_code = :code", {"code": code}) if code is not None else ("", {})
    rows = conn.execute(text(f"SELECT {_ATTENDEE_COLUMNS} FROM {C}.attendees {where} "
                             "ORDER BY name_key, id"), params).all()
    return [Attendee(*row) for row in rows]


def lab_names(conn: Connection) -> list[str]:
    """Every lab with a schema in this database (lanes counted with their lab)."""
    return sorted({Lab.of_schema(schema).name for schema in all_lab_schemas(conn)})


class NameTaken(ClassroomError):
    """The name is an attendee's of this class already: their rejoin code, or the instructor, opens it."""

    def __init__(self, name: str):
        super().__init__("name", f"{name} has already joined this class. If that is you, type your rejoin code "
                                 "(your lab's page shows it in the browser you joined with), or ask the "
                                 "instructor to hand your lab over from the class board.")


def add_attendee(engine: Engine, code: str, name: str, lab: str) -> tuple[Attendee, str]:
    """Insert the attendee and their first rejoin code: (the attendee, the code to show them once).
    NameTaken when someone joined under the same name first (at the same moment, say)."""
    rejoin = new_rejoin_code()
    try:
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {C}.attendees (class_code, name, name_key, lab, rejoin_hash) "
                              "VALUES (:code, :name, :key, :lab, :hash)"),
                         {"code": code, "name": name, "key": name_key(name), "lab": lab,
                          "hash": hash_rejoin_code(rejoin)})
    except IntegrityError:
        raise NameTaken(name) from None
    with engine.connect() as conn:
        found = find_attendee(conn, code, name)
    if found is None:
        raise ClassroomError("name", "could not register this name; try again")
    return found, rejoin


# --- rejoin codes -----------------------------------------------------------------------------

def new_rejoin_code() -> str:
    """A fresh rejoin code as shown: ``XXXX-XXXX``."""
    raw = "".join(secrets.choice(REJOIN_ALPHABET) for _ in range(REJOIN_LENGTH))
    return f"{raw[:4]}-{raw[4:]}"


def normal_rejoin_code(typed: str | None) -> str:
    """A rejoin code as typed, made comparable: letter case, spaces and dashes do not matter."""
    return re.sub(r"[\s-]+", "", str(typed or "")).upper()


def shown_rejoin_code(typed: str | None) -> str:
    """A rejoin code as the attendee's page shows it: ``XXXX-XXXX``."""
    code = normal_rejoin_code(typed)
    return f"{code[:4]}-{code[4:]}" if len(code) == REJOIN_LENGTH else code


def hash_rejoin_code(code: str) -> str:
    """``pbkdf2_sha256$<iterations>$<salt>$<digest>``: what the table keeps of a rejoin code."""
    salt = secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", normal_rejoin_code(code).encode(), salt, REJOIN_HASH_ITERATIONS)
    return f"pbkdf2_sha256${REJOIN_HASH_ITERATIONS}${salt.hex()}${digest.hex()}"


def rejoin_code_matches(stored: str | None, typed: str | None) -> bool:
    """Whether ``typed`` is the code ``stored`` was made from (constant-time compare)."""
    code = normal_rejoin_code(typed)
    if not stored or not code:
        return False
    try:
        scheme, iterations, salt, digest = stored.split("$")
        if scheme != "pbkdf2_sha256":
            return False
        computed = hashlib.pbkdf2_hmac("sha256", code.encode(), bytes.fromhex(salt), int(iterations))
    except ValueError:
        return False
    return hmac.compare_digest(computed.hex(), digest)


def check_rejoin_code(conn: Connection, attendee: Attendee, typed: str | None) -> bool:
    """Whether ``typed`` is this attendee's current rejoin code."""
    stored = conn.execute(text(f"SELECT rejoin_hash FROM {C}.attendees WHERE id = :id"),
                          {"id": attendee.id}).scalar()
    return rejoin_code_matches(stored, typed)


def issue_rejoin_code(engine: Engine, lab: str) -> tuple[Attendee, str] | None:
    """A new rejoin code for the attendee of ``lab`` (the old one stops working): (attendee, code),
    or None when nobody works in that lab."""
    rejoin = new_rejoin_code()
    with engine.begin() as conn:
        updated = conn.execute(text(f"UPDATE {C}.attendees SET rejoin_hash = :hash, "
                                    "session_generation = session_generation + 1 WHERE lab = :lab RETURNING id"),
                               {"hash": hash_rejoin_code(rejoin), "lab": lab}).first()
        found = attendee_of_lab(conn, lab) if updated else None
    return (found, rejoin) if found else None


def session_generation(conn: Connection, lab: str) -> int | None:
    """The attendee of ``lab``'s current session generation; None when nobody works in it."""
    return conn.execute(text(f"SELECT session_generation FROM {C}.attendees WHERE lab = :lab"), {"lab": lab}).scalar()


def revoke_sessions(engine: Engine, lab: str) -> int | None:
    """Sign out every browser session of the attendee of ``lab``: their new generation, or None."""
    with engine.begin() as conn:
        return conn.execute(text(f"UPDATE {C}.attendees SET session_generation = session_generation + 1 "
                                 "WHERE lab = :lab RETURNING session_generation"), {"lab": lab}).scalar()


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


def idle_seconds(conn: Connection, lab: Lab, lock_timeout: str = "200ms") -> float | None:
    """Seconds since the lab's newest timeline entry (every operation and consumer event writes
    one); None for a lab without a schema, or one being reset or dropped right now. In SQL: the
    column holds the server's local time."""
    exists = conn.execute(text("SELECT 1 FROM pg_tables WHERE schemaname = :s AND tablename = 'timeline'"),
                          {"s": lab.schema}).first()
    if exists is None:
        return None
    try:
        # A savepoint: a reset can drop the table between the check above and this read (or hold it
        # locked while it recreates the schema), and the caller's other reads must go on.
        with conn.begin_nested():
            conn.execute(text(f"SET LOCAL lock_timeout = '{lock_timeout}'"))
            value = conn.execute(text(f"SELECT extract(epoch FROM localtimestamp - max(at)) "
                                      f"FROM {quoted(lab.schema)}.timeline")).scalar()
    except (ProgrammingError, OperationalError, InternalError):
        return None  # dropped or locked by the reset: unknown until the next look
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
