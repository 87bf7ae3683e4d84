"""Dropping a lab for good: its topics, its consumer groups, its schemas and its control rows.

``flask --app app lab prune`` asks an agent (command ``lab.drop``: only an agent can stop the
lab's consumers and hold its log reader off the topics being deleted), or, with no agent running,
calls :func:`drop` itself with an admin client of its own.
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient
from sqlalchemy import Engine

from ..domain.lab import Lab
from ..domain.vocabulary import SCRAM_LEARNERS
from ..kafka.admin import ADMIN_TIMEOUT, delete_topics, drop_lane_principal
from ..settings import load_config
from ..store import classroom, consumer_groups, outside
from ..store.labs import drop_database_state, lab_schemas, retrying_deadlocks


def lab_topics(admin: AdminClient, lab: Lab) -> list[str]:
    """Every topic named under the lab's prefix (``<lab>.payments``, its DLQ, and any other)."""
    return sorted(name for name in admin.list_topics(timeout=ADMIN_TIMEOUT).topics
                  if name.startswith(f"{lab.name}."))


def lab_group_ids(engine: Engine, lab: Lab) -> list[str]:
    """The Kafka group ids of the lab's groups, as its schemas list them."""
    ids: set[str] = set()
    with engine.connect() as conn:
        for schema in lab_schemas(conn, lab):
            ids.update(consumer_groups.group_ids(conn.exec_driver_sql, schema))
            # and every fresh Kafka id a recovery or an expiry moved a group to, the current one
            # and those it left behind (``.r1`` … ``.rN``)
            for group_id, kafka_group_id in consumer_groups.moved(conn.exec_driver_sql, schema):
                moves = Lab.moves_of(kafka_group_id, group_id)
                ids.update(lab.moved_group_id(group_id, n) for n in range(1, moves + 1))
                ids.add(kafka_group_id)
    return sorted(ids)


def delete_groups(admin: AdminClient, group_ids: list[str]) -> tuple[list[str], dict[str, str]]:
    """Delete the groups the broker knows; (deleted, {group: why not}) — a broker that cannot
    delete a group leaves its committed offsets behind, and the caller says so."""
    if not group_ids:
        return [], {}
    deleted, failed = [], {}
    try:
        futures = admin.delete_consumer_groups(group_ids, request_timeout=ADMIN_TIMEOUT)
    except (KafkaException, ValueError) as error:
        return [], {group: str(error) for group in group_ids}
    for group, future in futures.items():
        try:
            future.result()
            deleted.append(group)
        except KafkaException as error:
            failed[group] = str(error.args[0] if error.args else error)
    return deleted, failed


def drop(engine: Engine, admin: AdminClient, lab: Lab) -> dict[str, Any]:
    """Drop the lab's topics, groups, schemas and control rows (its consumers already stopped)."""
    groups = lab_group_ids(engine, lab)
    if load_config().get("KAFKA_LEARNER_SASL_MECHANISM") == SCRAM_LEARNERS:
        with engine.connect() as conn:
            for role in outside.lab_roles(conn, lab):
                drop_lane_principal(admin, role)  # its SCRAM user and ACLs on Apache Kafka
    topics = delete_topics(admin, lab_topics(admin, lab))
    deleted, failed = delete_groups(admin, groups)

    def drop_state(conn) -> list[str]:
        schemas = lab_schemas(conn, lab)
        drop_database_state(conn, lab)
        outside.forget_passwords(conn, lab)
        classroom.forget_labs(conn, [lab.name])
        return schemas
    schemas = retrying_deadlocks(engine, drop_state)
    return {"lab": lab.name, "topics": topics, "schemas": schemas, "groups": deleted, "groups_kept": failed}
