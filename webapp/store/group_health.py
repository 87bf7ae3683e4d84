"""The facts a group's health is judged from (domain/group_health.py), read in one round of a few
index lookups: the lab's groups, its consumers' reports (assignment, and when it and their positions
last moved), the log end per partition (the log reader's mirror) and the committed offsets
(``group_offsets``). And the transitions written once: stalled, recovered.

Read by the read model (readmodel/group_health.py: panels, status bar, ``GET /api/v1/state``) and
by the agent's periodic work (the timeline's transitions, automatic recovery). Both pass their
connection's execute function (psycopg's, or SQLAlchemy's ``exec_driver_sql``): one SQL, ``%(name)s``.
"""
from __future__ import annotations

from typing import Any, Callable

from ..domain.group_health import (
    MAX_POLL_INTERVAL_SETTING,
    RECOVERING,
    STABLE,
    STALLED,
    GroupFacts,
    Health,
    Member,
    classify,
    max_poll_interval_ms,
    stall_after_seconds,
)
from ..domain.lab import Lab
from ..domain.vocabulary import CONSUMER_FRESH_SECONDS, LIVE_STATES
from . import timeline
from .connection import CONTROL_SCHEMA
from .schema import quoted

Execute = Callable[..., Any]

GROUPS_SQL = ('SELECT group_id, created_at::timestamptz, recovery_started_at, health, kafka_group_id, now() '
              'FROM {schema}.consumer_groups ORDER BY created_at')
SETTINGS_SQL = (f"SELECT (SELECT value FROM {{schema}}.settings WHERE key = 'partitions'), "
                f"(SELECT value FROM {{schema}}.settings WHERE key = '{MAX_POLL_INTERVAL_SETTING}')")
# Every consumer row of the lab, ended ones too: a member leaving restarts its group's rebalance clock.
MEMBERS_SQL = (f"SELECT group_id, name, state, heartbeat_at > now() - make_interval(secs => %(fresh)s), "
               f"assigned, assigned_at, progressed_at FROM {CONTROL_SCHEMA}.consumers WHERE lab = %(lab)s ORDER BY id")
# Records past each group's committed offset, by the log reader's log end (never the broker's high
# watermark, docs/concepts/broker.md); a partition never committed counts from offset 0.
PENDING_SQL = """
SELECT g.group_id, coalesce(sum(greatest(0, e.log_end - coalesce(o.committed, 0))), 0)
FROM {schema}.consumer_groups g
CROSS JOIN (SELECT p AS partition, (SELECT max("offset") FROM {schema}.log_records WHERE partition = p) + 1 AS log_end
            FROM generate_series(0, %(partitions)s - 1) AS p) e
LEFT JOIN {schema}.group_offsets o ON o.group_id = g.group_id AND o.partition = e.partition
GROUP BY g.group_id
"""


def health_of_groups(execute: Execute, lab: Lab) -> list[tuple[Health, dict[str, Any]]]:
    """Each group's health, with its row (health last written, kafka_group_id, ...)."""
    schema = lab.schema
    groups = execute(GROUPS_SQL.format(schema=quoted(schema))).fetchall()
    if not groups:
        return []
    partitions, poll_setting = execute(SETTINGS_SQL.format(schema=quoted(schema))).fetchone()
    stall_after = stall_after_seconds(max_poll_interval_ms(poll_setting))
    members: dict[str, list[Member]] = {}
    for group_id, name, state, fresh, assigned, assigned_at, progressed_at in execute(
            MEMBERS_SQL, {"lab": lab.name, "fresh": CONSUMER_FRESH_SECONDS}).fetchall():
        members.setdefault(group_id, []).append(Member(name, state, bool(fresh) and state in LIVE_STATES,
                                                       tuple(assigned or ()), assigned_at, progressed_at))
    partitions = int(partitions or 0) or 1
    pending = dict(execute(PENDING_SQL.format(schema=quoted(schema)), {"partitions": partitions}).fetchall())
    result = []
    for group_id, created_at, recovery_started_at, health, kafka_group_id, now in groups:
        facts = GroupFacts(group_id=group_id, partitions=partitions,
                           members=tuple(members.get(group_id, ())), pending=int(pending.get(group_id) or 0),
                           now=now, stall_after=stall_after, created_at=created_at,
                           recovery_started_at=recovery_started_at, last_health=health)
        result.append((classify(facts), {"health": health, "kafka_group_id": kafka_group_id,
                                         "recovery_started_at": recovery_started_at, "now": now}))
    return result


def write_transitions(execute: Execute, lab: Lab) -> list[tuple[Health, dict[str, Any]]]:
    """Write a timeline entry when a group becomes stalled and when a stalled group is stable again,
    once each (the last one written is kept on the group's row); the groups stalled now, with their rows."""
    stalled = []
    for health, row in health_of_groups(execute, lab):
        if health.state == STALLED:
            stalled.append((health, row))
        last = row["health"]
        if health.state == STALLED and last != STALLED:
            _transition(execute, lab, health, STALLED, "group-stalled", health.sentence)
        elif health.state == STABLE and last in (STALLED, RECOVERING):
            local = lab.local_group(health.group_id)
            _transition(execute, lab, health, STABLE, "group-recovered",
                        f"Group {local} recovered: every partition assigned again"
                        + (f" (Kafka group id {row['kafka_group_id']})" if row["kafka_group_id"] else ""))
    return stalled


def _transition(execute: Execute, lab: Lab, health: Health, state: str, kind: str, summary: str) -> None:
    execute(f'UPDATE {quoted(lab.schema)}.consumer_groups SET health = %(state)s, health_since = now() '
            "WHERE group_id = %(group)s AND health IS DISTINCT FROM %(state)s",
            {"state": state, "group": health.group_id})
    timeline.record_in(execute, lab.schema, kind, summary, group=health.group_id, health=health.as_dict())


def start_recovery(execute: Execute, lab: Lab, group_id: str) -> None:
    """Mark the group recovering (the health shows it until it is stable) and keep that on its row."""
    execute(f'UPDATE {quoted(lab.schema)}.consumer_groups SET recovery_started_at = now(), health = %(state)s, '
            "health_since = now() WHERE group_id = %(group)s", {"state": RECOVERING, "group": group_id})


def move_group(execute: Execute, lab: Lab, group_id: str, kafka_group_id: str) -> None:
    """The group's members join ``kafka_group_id`` from their next start."""
    execute(f'UPDATE {quoted(lab.schema)}.consumer_groups SET kafka_group_id = %(kafka)s WHERE group_id = %(group)s',
            {"kafka": kafka_group_id, "group": group_id})


def kafka_group_id(execute: Execute, lab: Lab, group_id: str) -> str:
    """The Kafka group id the group's members join now."""
    row = execute(f'SELECT kafka_group_id FROM {quoted(lab.schema)}.consumer_groups WHERE group_id = %(group)s',
                  {"group": group_id}).fetchone()
    return (row[0] if row else None) or group_id
