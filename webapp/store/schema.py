"""The one way to enter a lab schema.

Lab tables carry no schema name: a transaction that enters a lab sets ``search_path`` locally
(``set_config(..., true)`` is ``SET LOCAL``), so the ORM, Core statements and the strategies' literal
SQL all name plain tables and land in the lab they work in, and a pooled connection never carries
one lab's path into another's transaction.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from ..domain.lab import LANE_SEPARATOR
from ..domain.vocabulary import READ_LOCK_TIMEOUT, READ_STATEMENT_TIMEOUT
from .connection import CONTROL_SCHEMA

if TYPE_CHECKING:
    from sqlalchemy import Connection, Engine
    from sqlalchemy.orm import Session
# SQLAlchemy is imported inside the functions that use it: a consumer process enters its lab with
# ``enter_psycopg`` and never loads SQLAlchemy (tests/test_architecture.py checks it).

SET_PATH = "SELECT set_config('search_path', :schema, true)"
# The same statement for plain psycopg connections (the agent, the consumers, the fault proxy).
SET_PATH_PSYCOPG = "SELECT set_config('search_path', %s, true)"
# A read of a lab (a panel, the state, an operation's look): in the lab's schema, and bounded, so a
# lock a learner's own code holds on their lane makes that lab's read fail fast and say so
# (LockNotAvailable), instead of holding a connection another lab's reader waits for.
ENTER_TO_READ = ("SELECT set_config('search_path', %(schema)s, true), set_config('lock_timeout', %(lock)s, true), "
                 "set_config('statement_timeout', %(statement)s, true)")


def quoted(name: str) -> str:
    """``name`` as a double-quoted PostgreSQL identifier, for the literal SQL that names a schema."""
    return '"' + name.replace('"', '""') + '"'


# Which schemas are one lab's: its own and its lanes' (``<lab schema>__<lane>``) that exist now, the
# lab's own first. psycopg's placeholders: a psycopg connection runs it as is, and so does
# SQLAlchemy's ``exec_driver_sql``.
LAB_SCHEMAS_SQL = ("SELECT schema_name FROM information_schema.schemata "
                   "WHERE schema_name = %(schema)s OR schema_name LIKE %(lanes)s ORDER BY schema_name")


def like_escaped(text: str) -> str:
    """``text`` matched literally by LIKE (its ``_``, ``%`` and backslashes escaped)."""
    return text.replace("\\", "\\\\").replace("_", "\\_").replace("%", "\\%")


def lab_and_lane_schemas(execute: Callable[..., Any], lab_schema: str) -> list[str]:
    """The schemas of the lab whose own schema is ``lab_schema``: that one (when it exists) and its
    lanes', sorted (the lab's own first). ``execute`` is a psycopg connection's ``execute`` or a
    SQLAlchemy connection's ``exec_driver_sql``."""
    lanes = like_escaped(lab_schema + LANE_SEPARATOR) + "%"
    return [name for (name,) in execute(LAB_SCHEMAS_SQL, {"schema": lab_schema, "lanes": lanes})]


def enter(conn: Connection, schema: str) -> Connection:
    """Make the rest of ``conn``'s current transaction work in ``schema``."""
    from sqlalchemy import text
    conn.execute(text(SET_PATH), {"schema": schema})
    return conn


def enter_psycopg(conn: Any, schema: str) -> None:
    """The same for a psycopg connection (sync or async: the caller awaits an async one)."""
    return conn.execute(SET_PATH_PSYCOPG, [schema])


@contextmanager
def begin_in(engine: Engine, schema: str) -> Iterator[Connection]:
    """A transaction in ``schema``: committed on success, rolled back on error."""
    with engine.begin() as conn:
        yield enter(conn, schema)


def _read_limits(schema: str) -> dict[str, str]:
    return {"schema": schema, "lock": READ_LOCK_TIMEOUT, "statement": READ_STATEMENT_TIMEOUT}


@contextmanager
def connect_in(engine: Engine, schema: str) -> Iterator[Connection]:
    """A read-only use of ``schema`` (one transaction, rolled back at the end), under the lab's read
    lock and statement timeouts."""
    with engine.connect() as conn:
        conn.exec_driver_sql(ENTER_TO_READ, _read_limits(schema))
        yield conn


@contextmanager
def session_in(engine: Engine, schema: str) -> Iterator[Session]:
    """An ORM session whose every transaction works in ``schema``, under the lab's read lock and
    statement timeouts (it reads: the lab's changes go through ``begin_in``)."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session
    session = Session(engine, expire_on_commit=False)

    def after_begin(session, transaction, connection):
        connection.exec_driver_sql(ENTER_TO_READ, _read_limits(schema))

    event.listen(session, "after_begin", after_begin)
    try:
        yield session
    finally:
        session.close()


def notify_lab_function(function: str, channel: str) -> str:
    """``CREATE OR REPLACE FUNCTION``: a row trigger's function that NOTIFYs ``channel`` with the lab
    its row names (its ``lab`` column), for a table of the control schema."""
    return f"""CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM pg_notify('{channel}', CASE WHEN TG_OP = 'DELETE' THEN OLD.lab ELSE NEW.lab END);
    RETURN NULL;
END $fn$"""


# Which schemas are labs: every ``lab_*`` schema but the control one that holds lab tables (a lab's
# own and its lanes'). psycopg's placeholders, as LAB_SCHEMAS_SQL.
ALL_LAB_SCHEMAS_SQL = ("SELECT schemaname FROM pg_tables WHERE tablename = 'accounts' AND schemaname LIKE 'lab\\_%%' "
                       "AND schemaname <> %(control)s ORDER BY schemaname")


def every_lab_schema(execute: Callable[..., Any]) -> list[str]:
    """Every lab and lane schema of the database, sorted. ``execute`` is a psycopg connection's
    ``execute`` or a SQLAlchemy connection's ``exec_driver_sql``."""
    return [name for (name,) in execute(ALL_LAB_SCHEMAS_SQL, {"control": CONTROL_SCHEMA})]


def all_lab_schemas(conn: Connection) -> list[str]:
    """Every lab and lane schema of the database, on a SQLAlchemy connection."""
    return every_lab_schema(conn.exec_driver_sql)
