"""What a consumer applies, in one round trip: its control row (armed fault, step mode) and its
group's settings (strategy, database settings, batch and commit mode, notification).

Read when the consumer starts, on its heartbeat, and before a record whenever a change was
notified (webapp/store/settings_changes.py), without a read per record. The read is also the
consumer's acknowledgement: it stamps ``settings_seen_at`` with the statement's time, which the
operation that made the change waits for, so a fault armed, a strategy switched or a mode changed
by an operation applies to every record polled after the operation returned.

A change made by hand (an UPDATE in psql) has no one waiting: PostgreSQL queues its notification at
the commit and the listening session's backend forwards it to this consumer when it gets to it,
usually within milliseconds, but not before the commit returns. So it applies to the first record
polled after the consumer has read it: at the latest, after its next heartbeat.
"""
from __future__ import annotations

from dataclasses import dataclass

import psycopg

from ..domain.group_health import DEFAULT_MAX_POLL_INTERVAL_MS, max_poll_interval_ms
from ..store.connection import CONTROL_SCHEMA
from ..store.schema import quoted
from .control import Desired

# The acknowledgement never waits: a control row locked by someone else's open transaction (a
# person in psql) is read as committed and stamped on the next read.
READ = (
    "WITH seen AS (\n"
    f"    UPDATE {CONTROL_SCHEMA}.consumers SET settings_seen_at = statement_timestamp()\n"
    f"    WHERE id = (SELECT id FROM {CONTROL_SCHEMA}.consumers WHERE id = %(consumer_id)s FOR UPDATE SKIP LOCKED))\n"
    "SELECT c.id, c.armed_point, c.armed_action, c.armed_always, c.step_mode, c.step_advance,\n"
    "       g.strategy, g.effects_schema, g.batch_size, g.batch_max_wait_ms, g.commit_mode, g.static_membership,\n"
    "       g.notify, g.notify_idempotency_key,\n"
    "       (SELECT value FROM {schema}.settings WHERE key = 'lock_timeout_ms'),\n"
    "       (SELECT value FROM {schema}.settings WHERE key = 'idle_in_transaction_session_timeout_ms'),\n"
    "       (SELECT value FROM {schema}.settings WHERE key = 'max_poll_interval_ms'),\n"
    "       g.kafka_group_id\n"
    "FROM {schema}.consumer_groups g\n"
    f"LEFT JOIN {CONTROL_SCHEMA}.consumers c ON c.id = %(consumer_id)s\n"
    "WHERE g.group_id = %(group_id)s")


@dataclass(frozen=True)
class GroupSettings:
    """A group's settings as the consumer applies them."""
    strategy: str
    effects_schema: str
    batch_size: int = 1
    batch_max_wait_ms: int = 100
    commit_mode: str = "sync"
    static_membership: bool = False
    notify: str = "off"
    notify_idempotency_key: bool = False
    lock_timeout_ms: int = 0
    idle_in_transaction_session_timeout_ms: int = 0
    # The lab's max.poll.interval.ms (domain/group_health.py): read when the process starts.
    max_poll_interval_ms: int = DEFAULT_MAX_POLL_INTERVAL_MS
    # The Kafka group id the members join: the group's own, or a fresh one after a recovery moved it.
    kafka_group_id: str | None = None

    @property
    def batch_mode(self) -> bool:
        """More than one record per batch: consume(n), one transaction and one offset commit each."""
        return self.batch_size > 1

    @property
    def asynchronous_commits(self) -> bool:
        return self.commit_mode == "async"

    @property
    def transactional_commits(self) -> bool:
        """The offsets committed in a Kafka transaction of the consumer's own (commit.py)."""
        return self.commit_mode == "transactional"


def read(conn: psycopg.Connection, schema: str, group_id: str, consumer_id: int) -> tuple[Desired, GroupSettings]:
    """The consumer's desired state and its group's settings; RuntimeError when the group is gone."""
    row = conn.execute(READ.format(schema=quoted(schema)), {"consumer_id": consumer_id, "group_id": group_id}).fetchone()
    if row is None:
        raise RuntimeError(f"group {group_id} is not defined in schema {schema}")
    desired = Desired(*row[1:6]) if row[0] is not None else Desired(exists=False)
    group = GroupSettings(strategy=row[6], effects_schema=row[7], batch_size=row[8], batch_max_wait_ms=row[9],
                          commit_mode=row[10], static_membership=row[11], notify=row[12],
                          notify_idempotency_key=bool(row[13]), lock_timeout_ms=int(row[14] or 0),
                          idle_in_transaction_session_timeout_ms=int(row[15] or 0),
                          max_poll_interval_ms=max_poll_interval_ms(row[16]), kafka_group_id=row[17])
    return desired, group


def client_settings(group: GroupSettings, group_id: str, name: str) -> dict:
    """What the group's settings add to the Kafka consumer's configuration.

    Static membership: a ``group.instance.id`` that survives a restart. A member that comes back
    under the same id takes its old place (and partitions) at once instead of joining as a new
    member, which waits for the dead one's session to time out and then a rebalance. Read when
    the process starts: changing it needs a restart.
    """
    if group.static_membership:
        return {"group.instance.id": f"{group_id}.{name}"}
    return {}
