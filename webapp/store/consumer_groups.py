"""A lab's ``consumer_groups`` rows as the processes outside Flask read and write them (the agent,
the consumers): psycopg statements naming the lab's schema, run by the caller's ``execute`` (a
psycopg connection's ``execute``, or a SQLAlchemy connection's ``exec_driver_sql``).

It imports nothing but the schema quoter, so a consumer process reads its group here without
loading SQLAlchemy (tests/test_architecture.py checks that it never does).
"""
from __future__ import annotations

from typing import Any, Callable

from ..domain.vocabulary import OUTSIDE_STRATEGY
from .connection import CONTROL_SCHEMA
from .schema import quoted

Execute = Callable[..., Any]


def _has_table(execute: Execute, schema: str) -> bool:
    return execute("SELECT to_regclass(%s) IS NOT NULL", (f"{quoted(schema)}.consumer_groups",)).fetchone()[0]


def strategy_of(execute: Execute, schema: str, group_id: str) -> str | None:
    """The group's strategy; None when the lab has no such group."""
    row = execute(f"SELECT strategy FROM {quoted(schema)}.consumer_groups WHERE group_id = %s", (group_id,)).fetchone()
    return row[0] if row else None


def exists(execute: Execute, schema: str, group_id: str) -> bool:
    """Whether the lab has the group."""
    return strategy_of(execute, schema, group_id) is not None


def strategy_and_effects_schema(execute: Execute, schema: str, group_id: str) -> tuple[str, str] | None:
    """The group's strategy and the schema its effects go to; None when the lab has no such group."""
    row = execute(f"SELECT strategy, effects_schema FROM {quoted(schema)}.consumer_groups WHERE group_id = %s",
                  (group_id,)).fetchone()
    return (row[0], row[1]) if row else None


def on_unique_violation(execute: Execute, schema: str, group_id: str) -> str | None:
    """What a unique violation means to the group (vocabulary's ON_UNIQUE_VIOLATION); None when the
    lab has no such group."""
    row = execute(f"SELECT on_unique_violation FROM {quoted(schema)}.consumer_groups WHERE group_id = %s",
                  (group_id,)).fetchone()
    return row[0] if row else None


def create(execute: Execute, schema: str, group_id: str, strategy: str, effects_schema: str) -> None:
    """A new group of the lab, its effects in ``effects_schema``."""
    execute(f"INSERT INTO {quoted(schema)}.consumer_groups (group_id, strategy, effects_schema) VALUES (%s, %s, %s)",
            (group_id, strategy, effects_schema))


def with_strategy(execute: Execute, schema: str, strategy: str) -> list[str]:
    """The ids of the groups using ``strategy``; none when the schema has no groups' table (yet)."""
    if not _has_table(execute, schema):
        return []
    return [group_id for (group_id,) in execute(
        f"SELECT group_id FROM {quoted(schema)}.consumer_groups WHERE strategy = %s ORDER BY group_id", (strategy,))]


def kafka_group_ids(execute: Execute, schema: str) -> list[tuple[str, str]]:
    """Each group's id and the Kafka group id its members join now (its own, or the one a recovery
    moved it to)."""
    return [(group_id, kafka_group_id) for group_id, kafka_group_id in execute(
        f"SELECT group_id, coalesce(kafka_group_id, group_id) FROM {quoted(schema)}.consumer_groups")]


def moved(execute: Execute, schema: str) -> list[tuple[str, str]]:
    """The groups a recovery or an expiry moved to a fresh Kafka group id: (group id, Kafka group id);
    none when the schema has no groups' table (yet)."""
    if not _has_table(execute, schema):
        return []
    return [(group_id, kafka_group_id) for group_id, kafka_group_id in execute(
        f"SELECT group_id, kafka_group_id FROM {quoted(schema)}.consumer_groups WHERE kafka_group_id IS NOT NULL")]


def group_ids(execute: Execute, schema: str) -> list[str]:
    """The ids of the lab's groups; none when the schema has no groups' table (yet)."""
    if not _has_table(execute, schema):
        return []
    return [group_id for (group_id,) in execute(f"SELECT group_id FROM {quoted(schema)}.consumer_groups")]


def offsets_may_have_moved(execute: Execute, lab_name: str, schema: str) -> bool:
    """Whether a group's committed offsets may have moved since their last snapshot: one of the
    lab's consumers reported in the last 30 s, a group was never snapshotted, or a group is a
    learner's own consumer's (it sends the lab no heartbeats: its offsets may move any time)."""
    return execute(
        f"SELECT EXISTS (SELECT 1 FROM {CONTROL_SCHEMA}.consumers WHERE lab = %s "
        "AND heartbeat_at > now() - interval '30 seconds')"
        f" OR EXISTS (SELECT 1 FROM {quoted(schema)}.consumer_groups g WHERE NOT EXISTS ("
        f"   SELECT 1 FROM {quoted(schema)}.group_offsets o WHERE o.group_id = g.group_id))"
        f" OR EXISTS (SELECT 1 FROM {quoted(schema)}.consumer_groups WHERE strategy = %s)",
        (lab_name, OUTSIDE_STRATEGY)).fetchone()[0]
