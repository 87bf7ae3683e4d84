"""Schema changes through Alembic: the control schema and every lab schema, in step.

The control tables live in ``lab_control`` (with Alembic's version table). Lab tables exist once
per lab schema (``lab_<name>``) and per lane schema (``lab_<name>__<lane>``); those schemas come
and go while the lab runs, so a revision that changes lab tables applies its DDL to every lab
schema that exists (:func:`for_each_lab_schema`), and a new lab schema is created from the store's tables,
at the current head (:func:`create_lab_schema`).

:func:`upgrade` runs on start (launcher, ``flask lab init`` and the agent through
``labs.ensure_control_schema``), never on a web request:

- a fresh database: the control tables from the store's tables, stamped at head;
- a database of the release before migrations (control tables, no version table): stamped at
  the baseline, then upgraded;
- otherwise: upgraded to head (nothing to do when it is there already).

Changing a model: add a revision under ``versions/``; ``python -m webapp.store.migrations.check
DATABASE_URL`` prints the DDL the tables have and a migrated database lacks, and
``tests/test_migrations.py`` fails while any difference remains.
"""
from __future__ import annotations

import logging
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.pool import NullPool

from ..connection import CONTROL_SCHEMA, sqlalchemy_url
from ..schema import all_lab_schemas, enter, quoted

HERE = Path(__file__).resolve().parent
# Alembic says at INFO what plugins it loads on every start: noise in the agent's and launcher's output.
logging.getLogger("alembic").setLevel(logging.WARNING)
VERSION_TABLE = "alembic_version"
BASELINE = "0001"
# Any two processes starting at once (launcher, agents, fault proxy, CLI) upgrade one at a time.
LOCK_KEY = 0x1AB_5C4E_3A  # pg_advisory_xact_lock key, arbitrary and constant


def alembic_config(connection: Connection | None = None):
    """Alembic's configuration, built in code (no alembic.ini): env.py migrates ``connection``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("path_separator", "os")  # versions/ under script_location
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def head() -> str:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config()).get_current_head()


@lru_cache(maxsize=1)
def _known() -> frozenset[str]:
    from alembic.script import ScriptDirectory

    return frozenset(script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions())


def current(conn: Connection) -> str | None:
    """The revision the database is at, or None without a version table."""
    # pg_tables, not to_regclass(): a catalog cache can miss a table another process just committed.
    if conn.execute(text("SELECT 1 FROM pg_tables WHERE schemaname = :s AND tablename = :t"),
                    {"s": CONTROL_SCHEMA, "t": VERSION_TABLE}).first() is None:
        return None
    return conn.execute(text(f'SELECT version_num FROM "{CONTROL_SCHEMA}".{VERSION_TABLE}')).scalar()


def _has_control_tables(conn: Connection) -> bool:
    return bool(conn.execute(text("SELECT count(*) FROM information_schema.tables WHERE table_schema = :s"),
                             {"s": CONTROL_SCHEMA}).scalar())


def upgrade_connection(conn: Connection) -> str:
    """Bring the database ``conn`` works on to head, inside the caller's transaction.

    Returns what was done: ``current``, ``created``, ``adopted`` (stamped at the baseline, then
    upgraded) or ``upgraded``.
    """
    if current(conn) == head():
        return "current"
    from alembic import command

    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})
    version = current(conn)  # again: another process may have done it while we waited
    if version == head():
        return "current"
    config = alembic_config(conn)
    if version is not None and version not in _known():
        raise RuntimeError(f"the database is at schema revision {version}, which this release does not know "
                           f"(its newest is {head()}): run the release that upgraded it, or a newer one")
    if version is None and not _has_control_tables(conn) and not all_lab_schemas(conn):
        _create_control_schema(conn)
        command.stamp(config, "head")
        return "created"
    done = "upgraded"
    if version is None:
        command.stamp(config, BASELINE)
        done = "adopted"
    command.upgrade(config, "head")
    return done


def upgrade(database_url: str) -> str:
    """Bring the database at ``database_url`` to head in its own transaction (see the module)."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            return upgrade_connection(conn)
    finally:
        engine.dispose()


def _create_control_schema(conn: Connection) -> None:
    from ..tables import control_tables

    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{CONTROL_SCHEMA}"'))
    for table in control_tables():
        table.create(conn, checkfirst=True)
    from ..settings_changes import control_trigger_ddl

    for statement in control_trigger_ddl():  # every change of what a consumer applies is notified
        conn.exec_driver_sql(statement)
    from ..lab_changes import control_trigger_ddl as change_trigger_ddl

    for statement in change_trigger_ddl():  # the live panels' change feed
        conn.exec_driver_sql(statement)


def create_lab_schema(conn: Connection, schema: str) -> bool:
    """Create ``schema`` with every lab table of the store (the head), if missing.

    True when the schema was created. Leaves the transaction's search_path on ``schema``.
    """
    from ..tables import lab_tables

    exists = conn.execute(text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                          {"s": schema}).first()
    conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}"))
    enter(conn, schema)
    for table in lab_tables():
        table.create(conn, checkfirst=True)
    from ..settings_changes import lab_trigger_ddl
    from ..verdict_changes import trigger_ddl

    for statement in trigger_ddl(schema):  # the running summaries' change triggers
        conn.exec_driver_sql(statement)
    for statement in lab_trigger_ddl(schema):  # changes of the groups' settings are notified
        conn.exec_driver_sql(statement)
    from ..lab_changes import lab_trigger_ddl as change_trigger_ddl

    for statement in change_trigger_ddl(schema):  # the live panels' change feed
        conn.exec_driver_sql(statement)
    return exists is None


def for_each_lab_schema(conn: Connection, statements: Iterable[str]) -> list[str]:
    """Run ``statements`` (unqualified table names) in every lab schema; return the schemas.

    The transaction's search_path is put back afterwards.
    """
    statements = list(statements)
    before = conn.execute(text("SELECT current_setting('search_path')")).scalar()
    schemas = all_lab_schemas(conn)
    try:
        for schema in schemas:
            enter(conn, schema)
            for statement in statements:
                conn.exec_driver_sql(statement)
    finally:
        enter(conn, before)
    return schemas


def run_control(conn: Connection, statements: Iterable[str]) -> None:
    for statement in statements:
        conn.exec_driver_sql(statement)
