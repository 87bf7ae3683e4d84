"""The lab namespace: one PostgreSQL schema and one topic prefix.

The default lab, each scenario run and each strategy lane is a Lab. Nothing else names a
schema or a topic: everything takes the Lab it works in.
"""
from __future__ import annotations

import logging
from typing import Callable, TypeVar

import psycopg
from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError

from ..domain.lab import Lab
from ..domain.vocabulary import DEFAULT_GROUP, DEFAULT_STRATEGY
from . import faultproxies, outside
from .connection import CONTROL_SCHEMA
from .migrations import create_lab_schema, upgrade_connection
from .schema import enter, lab_and_lane_schemas, quoted

log = logging.getLogger(__name__)
T = TypeVar("T")

DROP_ATTEMPTS = 5

SEED_ACCOUNTS = [
    ("acc-1", "Ana"), ("acc-2", "Bruno"), ("acc-3", "Carla"), ("acc-4", "Diego"), ("acc-5", "Elisa"),
]


def ensure_control_schema(conn: Connection) -> None:
    """Bring the database to the migrations' head: the control schema and every lab schema.

    For processes that start (launcher, ``flask lab init``, the agent, the fault proxy), never a
    web request; inside the caller's transaction, a no-op when the database is at head.
    """
    upgrade_connection(conn)


def ensure_schema(conn: Connection, schema: str) -> bool:
    """Create ``schema`` with every lab table (at the migrations' head) if missing. True when it
    was created. Leaves the transaction's search_path on ``schema``."""
    return create_lab_schema(conn, schema)


def seed_accounts(conn: Connection, schema: str) -> None:
    enter(conn, schema)
    for account_id, owner in SEED_ACCOUNTS:
        conn.execute(text("INSERT INTO accounts (id, owner, balance, status) VALUES (:id, :owner, 0, 'ACTIVE') "
                          "ON CONFLICT (id) DO NOTHING"), {"id": account_id, "owner": owner})


def lab_schemas(conn: Connection, lab: Lab) -> list[str]:
    """The lab's schema and its lanes' schemas that exist now."""
    return lab_and_lane_schemas(conn.exec_driver_sql, lab.schema)


def retrying_deadlocks(engine: Engine, work: Callable[[Connection], T], attempts: int = DROP_ATTEMPTS) -> T:
    """``work`` in a transaction of its own, run again when PostgreSQL aborts it to break a deadlock.

    A DROP SCHEMA ... CASCADE locks the lab's tables one by one; a reader of the same lab (a panel,
    the summaries' fold, a pushed look) holding one of them while it waits for another the drop
    already holds makes a cycle, and PostgreSQL rolls one side back. When that side is the drop,
    nothing of it happened: it is run again once the reader is through."""
    for attempt in range(1, attempts + 1):
        try:
            with engine.begin() as conn:
                return work(conn)
        except DBAPIError as error:
            if not isinstance(error.orig, psycopg.errors.DeadlockDetected) or attempt == attempts:
                raise
            log.warning("deadlock with a reader of the lab (attempt %d of %d): running it again", attempt, attempts)
    raise AssertionError("unreachable")


def drop_database_state(conn: Connection, lab: Lab) -> None:
    """Drop every schema of the lab, its outside consumers' roles (their sessions ended) and its
    control rows (its fault proxy faults end with them). Kafka topics are kafka/admin.py's."""
    for role in outside.lab_roles(conn, lab):
        # An outside consumer's open transaction would hold locks the DROP SCHEMA waits for.
        outside.terminate_sessions(conn, role)
    for schema in lab_schemas(conn, lab):
        conn.execute(text(f'DROP SCHEMA {quoted(schema)} CASCADE'))
    outside.drop_roles(conn, lab)
    conn.execute(text(f'DELETE FROM {quoted(CONTROL_SCHEMA)}.consumers WHERE lab = :lab'), {"lab": lab.name})
    # A command that ended a moment ago may still be read by its waiter (command_channel.wait_for):
    # a guided step's click hands over and its thread then resets this very lab.
    conn.execute(text(f"DELETE FROM {quoted(CONTROL_SCHEMA)}.commands WHERE lab = :lab AND status IN ('done', 'failed') "
                      "AND finished_at < now() - interval '1 minute'"), {"lab": lab.name})
    faultproxies.forget_lab(conn, lab.name)


def create_database_state(conn: Connection, lab: Lab, partitions: int) -> None:
    """A fresh lab schema: seed accounts, the partition count, the default group."""
    ensure_schema(conn, lab.schema)
    seed_accounts(conn, lab.schema)
    conn.execute(text("INSERT INTO settings (key, value) VALUES ('partitions', CAST(:p AS jsonb)) "
                      "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"), {"p": str(partitions)})
    conn.execute(text("INSERT INTO consumer_groups (group_id, strategy, effects_schema) VALUES (:g, :s, :e) "
                      "ON CONFLICT (group_id) DO NOTHING"),
                 {"g": lab.group_id(DEFAULT_GROUP), "s": DEFAULT_STRATEGY, "e": lab.schema})
