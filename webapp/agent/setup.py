"""Lab setup as plain functions: topics and database state, without an agent.

``flask --app app lab init`` / ``lab reset`` and the launcher call :func:`ensure_lab` and
:func:`reset_lab` with the service addresses; the agent's ``lab.ensure`` and ``lab.reset``
handlers call :func:`ensure` and :func:`recreate` with the clients it already holds (after
stopping the lab's consumers, which only an agent can do).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

from ..domain.lab import Lab
from ..domain.waits import wait_until
from ..kafka.admin import ADMIN_TIMEOUT, admin_client, delete_topics, ensure_topics, partition_count
from ..store import timeline
from ..store.connection import sqlalchemy_url
from ..store.labs import create_database_state, drop_database_state, ensure_control_schema, retrying_deadlocks
from ..store.schema import begin_in


@contextmanager
def _clients(database_url: str, bootstrap_servers: str) -> Iterator[tuple[Engine, AdminClient]]:
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            ensure_control_schema(conn)
        yield engine, admin_client(bootstrap_servers)
    finally:
        engine.dispose()


def ensure_lab(database_url: str, bootstrap_servers: str, lab: Lab, partitions: int) -> dict[str, Any]:
    """Create what the lab lacks (control tables, its schema with seed accounts and default group,
    its topics); keep what exists. ``{"created_topics": [...], "created_schema": bool}``."""
    with _clients(database_url, bootstrap_servers) as (engine, admin):
        return ensure(engine, admin, lab, partitions)


def broker_lost_it(database_url: str, bootstrap_servers: str, lab: Lab) -> bool:
    """PostgreSQL keeps the lab's schema but the broker holds no topic of it. Asked before anything
    is created: a topic whose deletion the broker has not finished (or that another client makes
    meanwhile) would otherwise look like one that was there all along."""
    with _clients(database_url, bootstrap_servers) as (engine, admin):
        with engine.connect() as conn:
            kept = conn.execute(text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                                {"s": lab.schema}).first() is not None
        return kept and lab.topic not in admin.list_topics(timeout=ADMIN_TIMEOUT).topics


def reset_lab(database_url: str, bootstrap_servers: str, lab: Lab, partitions: int) -> dict[str, Any]:
    """Wipe the lab (its schemas, control rows and topics) and create it fresh. For when no agent
    runs: the lab's consumer rows are deleted, not stopped."""
    with _clients(database_url, bootstrap_servers) as (engine, admin):
        return recreate(engine, admin, lab, partitions)


def ensure(engine: Engine, admin: AdminClient, lab: Lab, partitions: int) -> dict[str, Any]:
    with engine.connect() as conn:
        exists = conn.execute(text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                              {"s": lab.schema}).first() is not None
    created = ensure_topics(admin, {lab.topic: partitions, lab.dlq_topic: 1})
    if not exists:
        with engine.begin() as conn:
            create_database_state(conn, lab, partitions)
    return {"created_topics": created, "created_schema": not exists}


def recreate(engine: Engine, admin: AdminClient, lab: Lab, partitions: int) -> dict[str, Any]:
    """Delete the lab's topics and database state, then create them fresh (consumers already stopped)."""
    delete_topics(admin, [lab.topic, lab.dlq_topic])
    retrying_deadlocks(engine, lambda conn: drop_database_state(conn, lab))
    # Deleting a topic completes asynchronously on some brokers: retry creation until it sticks.
    wait_until(lambda: _recreated_topics(admin, lab, partitions), timeout=20, interval=0.2,
               message=f"could not recreate {lab.topic}")
    result = ensure(engine, admin, lab, partitions)
    with begin_in(engine, lab.schema) as conn:
        timeline.record(conn.exec_driver_sql, "lab",
                        f"lab {lab.name} reset: {partitions} partitions, 5 accounts, no consumers")
    return {"lab": lab.name, "partitions": partitions, **result}


def _recreated_topics(admin: AdminClient, lab: Lab, partitions: int) -> bool:
    try:
        ensure_topics(admin, {lab.topic: partitions, lab.dlq_topic: 1})
        return partition_count(admin, lab.topic) == partitions
    except KafkaException:
        return False
