"""Typed models. Lab tables carry no schema (the session's search_path picks the lab);
control tables, shared by every lab on one database, live in ``lab_control``.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import Mapped, mapped_column

from .db import CONTROL_SCHEMA, db

def _now():
    return mapped_column(server_default=func.now())


# --- the lab's business state (one copy per lab schema) -------------------------------

class Account(db.Model):
    __tablename__ = "accounts"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(80))
    balance: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # cents
    status: Mapped[str] = mapped_column(String(32), default="ACTIVE", server_default="ACTIVE")
    # Event time of the set that wrote status / balance (set_status, set_balance): the guard of
    # the natural strategy compares against it, so an older set re-sent later cannot regress state.
    status_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    balance_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


class Score(db.Model):
    """A customer's latest credit score (the seed's risco-service): written by an upsert by primary key."""
    __tablename__ = "scores"
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    score: Mapped[int] = mapped_column(Integer)
    score_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # event time of the set_score


# check-then-act's key table: deliberately no primary key and no unique constraint (the developer
# trusted the SELECT); the index makes the lookup fast and guarantees nothing.
seen_events = db.Table(
    "seen_events",
    db.Column("event_id", UUID, nullable=False, index=True),
    db.Column("processed_at", DateTime, nullable=False, server_default=func.now(), index=True),
)


class Payment(db.Model):
    """One row per applied credit: the effect. Never unique, so a duplicate shows as a second row."""
    __tablename__ = "payments"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, index=True)
    transaction_id: Mapped[str] = mapped_column(String(64), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    applied_at: Mapped[datetime] = _now()


class ProcessedEvent(db.Model):
    __tablename__ = "processed_events"
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    # indexed: the TTL cleanup, the oldest key's age and the newest keys all range over it
    processed_at: Mapped[datetime] = mapped_column(server_default=func.now(), index=True)


class ProcessedTransaction(db.Model):
    __tablename__ = "processed_transactions"
    transaction_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    processed_at: Mapped[datetime] = mapped_column(server_default=func.now(), index=True)


class ProcessedPayload(db.Model):
    """payload-hash's key table: sha256 of the event's content without its ids (see the strategy)."""
    __tablename__ = "processed_payloads"
    payload_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    processed_at: Mapped[datetime] = mapped_column(server_default=func.now(), index=True)


class LedgerEntry(db.Model):
    """Natural idempotency: a credit is a fact keyed by its event; the balance is derived."""
    __tablename__ = "ledger"
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = _now()


# --- what the lab produced and observed ------------------------------------------------

class PublishedEvent(db.Model):
    """The journal: every record the lab produced, with partition/offset from its delivery report."""
    __tablename__ = "published_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event_id: Mapped[Optional[uuid.UUID]] = mapped_column(UUID, index=True)
    transaction_id: Mapped[Optional[str]] = mapped_column(String(64), index=True)
    type: Mapped[Optional[str]] = mapped_column(String(16))
    account_id: Mapped[Optional[str]] = mapped_column(String(32))
    amount_cents: Mapped[Optional[int]] = mapped_column(BigInteger)
    status: Mapped[Optional[str]] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(24))  # normal | resend | source-duplicate | poison | burst
    idempotent_producer: Mapped[bool]
    partition: Mapped[Optional[int]] = mapped_column(Integer)
    offset: Mapped[Optional[int]] = mapped_column(BigInteger)
    error: Mapped[Optional[str]] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    published_at: Mapped[datetime] = _now()
    __table_args__ = (
        Index("published_events_partition_offset", "partition", "offset"),
        # Ground truth (verdict.TRUTH: the first credit of each transaction) read in index order,
        # without sorting the journal: the verdict, the accounts and the chart all start from it.
        Index("published_events_truth", "transaction_id", "id",
              postgresql_include=["account_id", "amount_cents", "published_at"],
              postgresql_where=text("type = 'credit' AND error IS NULL")),
    )


class LogRecord(db.Model):
    """The log mirror: one row per record of the lab's topic, whoever produced it (the truth).

    Written only by the log reader (webapp/logreader), which reads every partition from the start
    without a group; (partition, offset) is the record's identity, so a re-read inserts nothing.
    """
    __tablename__ = "log_records"
    partition: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    offset: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    timestamp: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))  # the record's Kafka timestamp (create or log-append time)
    key: Mapped[Optional[str]] = mapped_column(Text)
    headers: Mapped[list[Any]] = mapped_column(JSONB, default=list, server_default="[]")  # [[name, value], ...]
    # As text (undecodable bytes and NUL backslash-escaped); for a valid event, the event's whole
    # JSON object (``value::jsonb``), whatever its type's fields.
    value: Mapped[Optional[str]] = mapped_column(Text)
    # The decoded event's fields (NULL when the record is invalid).
    event_id: Mapped[Optional[uuid.UUID]] = mapped_column(UUID)
    transaction_id: Mapped[Optional[str]] = mapped_column(String(64))
    type: Mapped[Optional[str]] = mapped_column(String(16))
    account_id: Mapped[Optional[str]] = mapped_column(String(32))
    amount_cents: Mapped[Optional[int]] = mapped_column(BigInteger)
    status: Mapped[Optional[str]] = mapped_column(String(32))
    balance_cents: Mapped[Optional[int]] = mapped_column(BigInteger)
    score: Mapped[Optional[int]] = mapped_column(BigInteger)
    occurred_at: Mapped[Optional[str]] = mapped_column(Text)
    invalid_reason: Mapped[Optional[str]] = mapped_column(Text)  # why it is not a valid event
    # The first valid record of its transaction in log order (set by the reader as it inserts):
    # the one exactly-once applies. Later records of the same transaction are duplicates.
    first_of_transaction: Mapped[bool] = mapped_column(default=False, server_default="false")
    read_at: Mapped[datetime] = _now()
    __table_args__ = (
        # The valid records of a transaction in log order: the reader's "first?" check, the why.
        Index("log_records_truth", "transaction_id", "partition", "offset",
              postgresql_where=text("invalid_reason IS NULL")),
        # Ground truth per account (expected balance, latest set) and over time (the chart), read
        # from the index alone.
        Index("log_records_firsts", "account_id", "type",
              postgresql_include=["partition", "offset", "amount_cents", "status", "balance_cents", "score", "read_at"],
              postgresql_where=text("first_of_transaction")),
        # The same event at several offsets (a producer retry after a lost ack, a resend), the drill-down.
        Index("log_records_event_id", "event_id"),
        # The newest batch the reader wrote: the panels' change fingerprint and the chart's time span.
        Index("log_records_read_at", "read_at"),
    )


class Delivery(db.Model):
    """The delivery ledger: every delivery of every record to a consumer, with its outcome.

    The row is written in the same transaction as the effect, so it cannot disagree with it.
    """
    __tablename__ = "deliveries"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    group_id: Mapped[str] = mapped_column(String(128))
    consumer: Mapped[str] = mapped_column(String(64))
    partition: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(BigInteger)
    generation: Mapped[int] = mapped_column(Integer)
    attempt: Mapped[int] = mapped_column(Integer)
    event_id: Mapped[Optional[uuid.UUID]] = mapped_column(UUID, index=True)
    transaction_id: Mapped[Optional[str]] = mapped_column(String(64))
    strategy: Mapped[str] = mapped_column(String(24))
    outcome: Mapped[str] = mapped_column(String(24))  # applied | absorbed | dead-lettered
    reason: Mapped[Optional[str]] = mapped_column(Text)
    delivered_at: Mapped[datetime] = _now()
    __table_args__ = (Index("deliveries_group_partition_offset", "group_id", "partition", "offset"),
                      # the timeline merges the newest deliveries with its own entries
                      Index("deliveries_delivered_at", "delivered_at"),
                      # the log end per partition (state.log_ends), whatever the group
                      Index("deliveries_partition_offset", "partition", "offset"),
                      # absorbed and dead-lettered deliveries are few: the verdict and lanes count them
                      Index("deliveries_outcome", "outcome"))


class TimelineEntry(db.Model):
    __tablename__ = "timeline"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = mapped_column(server_default=func.now(), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    summary: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")


class ConsumerGroup(db.Model):
    __tablename__ = "consumer_groups"
    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    strategy: Mapped[str] = mapped_column(String(24))
    # The schema the group applies its effects to: the lab's own, or a strategy lane's copy.
    effects_schema: Mapped[str] = mapped_column(String(63))
    # What the consumer does with a unique violation (strategies.ON_UNIQUE_VIOLATION): the seed's
    # "already processed" (absorb, commit the offset) or "retry" (a generic error: backoff, then the DLQ).
    on_unique_violation: Mapped[str] = mapped_column(String(24), default="already-processed",
                                                     server_default="already-processed")
    created_at: Mapped[datetime] = _now()


class GroupOffset(db.Model):
    """Committed offsets per group and partition, as the lab agent last read them from Kafka."""
    __tablename__ = "group_offsets"
    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    committed: Mapped[Optional[int]] = mapped_column(BigInteger)
    read_at: Mapped[datetime] = _now()


class Setting(db.Model):
    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONB)


# --- control: shared by all labs on this database ---------------------------------------

class Agent(db.Model):
    """A lab agent process: owns consumer processes on its host, holds the Kafka clients."""
    __tablename__ = "agents"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    id: Mapped[str] = mapped_column(String(128), primary_key=True)  # host:pid:<6 hex>, unique per start
    host: Mapped[str] = mapped_column(String(128))
    pid: Mapped[int]
    started_at: Mapped[datetime] = _now()
    heartbeat_at: Mapped[datetime] = _now()
    kafka_ok: Mapped[bool] = mapped_column(default=False, server_default="false")
    kafka_error: Mapped[Optional[str]] = mapped_column(Text)


class Consumer(db.Model):
    """One consumer process: what it was asked to be and what it last reported."""
    __tablename__ = "consumers"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    id: Mapped[int] = mapped_column(primary_key=True)
    lab: Mapped[str] = mapped_column(String(32), index=True)
    name: Mapped[str] = mapped_column(String(64))
    group_id: Mapped[str] = mapped_column(String(128))
    agent_id: Mapped[Optional[str]] = mapped_column(String(128))
    pid: Mapped[Optional[int]]
    state: Mapped[str] = mapped_column(String(24), default="starting", server_default="starting")
    # Desired fault/step settings, written by the lab, read by the consumer each loop.
    armed_point: Mapped[Optional[str]] = mapped_column(String(40))
    armed_action: Mapped[Optional[str]] = mapped_column(String(16))  # crash | freeze
    armed_always: Mapped[bool] = mapped_column(default=False, server_default="false")
    step_mode: Mapped[bool] = mapped_column(default=False, server_default="false")
    step_advance: Mapped[int] = mapped_column(default=0, server_default="0")
    # Reported by the consumer.
    step_at: Mapped[Optional[str]] = mapped_column(String(40))
    assigned: Mapped[list[int]] = mapped_column(JSONB, default=list, server_default="[]")
    positions: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    applied_positions: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    generation: Mapped[int] = mapped_column(default=0, server_default="0")
    applied: Mapped[int] = mapped_column(default=0, server_default="0")
    absorbed: Mapped[int] = mapped_column(default=0, server_default="0")
    dead_lettered: Mapped[int] = mapped_column(default=0, server_default="0")
    commit_failures: Mapped[int] = mapped_column(default=0, server_default="0")
    last_error: Mapped[Optional[str]] = mapped_column(Text)
    exit_code: Mapped[Optional[int]]
    started_at: Mapped[datetime] = _now()
    heartbeat_at: Mapped[Optional[datetime]]


class Command(db.Model):
    """A request from the web or CLI to a lab agent, carried through PostgreSQL."""
    __tablename__ = "commands"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    lab: Mapped[str] = mapped_column(String(32))
    verb: Mapped[str] = mapped_column(String(32))
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    # Commands about one consumer go to the agent that owns it; the rest to any agent.
    agent_id: Mapped[Optional[str]] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default="pending", server_default="pending")  # pending|running|done|failed
    result: Mapped[Optional[dict[str, Any]]] = mapped_column(JSONB)
    error: Mapped[Optional[str]] = mapped_column(Text)
    created_at: Mapped[datetime] = _now()
    finished_at: Mapped[Optional[datetime]]
    # The lease: the agent that claimed the command renews it with each heartbeat; a running
    # command whose lease ran out belongs to a dead agent, and the reaper fails it.
    claimed_by: Mapped[Optional[str]] = mapped_column(String(128))
    lease_expires_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


class FaultProxy(db.Model):
    """The lost-ack fault proxy's control row: what the lab asks of it, and what it reports.

    Written by ``operations.arm_fault_proxy`` (lab, faults, version) and read by the proxy
    process (``python -m webapp.faultproxy``), which may run in another container.
    """
    __tablename__ = "fault_proxies"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    # Desired: the lab that armed it (its timeline receives every injected fault) and the faults.
    lab: Mapped[Optional[str]] = mapped_column(String(32))
    drop_produce_responses: Mapped[int] = mapped_column(default=0, server_default="0")  # left to drop
    delay_ms: Mapped[int] = mapped_column(default=0, server_default="0")
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # bumped by each arming
    armed_at: Mapped[Optional[datetime]]
    # Reported by the proxy.
    seen_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    listen: Mapped[Optional[str]] = mapped_column(String(128))
    upstream: Mapped[Optional[str]] = mapped_column(String(128))
    host: Mapped[Optional[str]] = mapped_column(String(128))
    pid: Mapped[Optional[int]]
    started_at: Mapped[Optional[datetime]]
    heartbeat_at: Mapped[Optional[datetime]]
    connections: Mapped[int] = mapped_column(default=0, server_default="0")
    produce_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_dropped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_delayed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class SessionOperation(db.Model):
    """Record and replay: every operation performed on the lab, in order, with what the lab
    looked like just before it (the wait a replay repeats) and what it returned."""
    __tablename__ = "session_log"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = _now()
    operation: Mapped[str] = mapped_column(String(40))
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    before: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    result: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")


class ScenarioRun(db.Model):
    """A guided scenario run: which step it is at and what each step observed, kept across reloads."""
    __tablename__ = "scenario_runs"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    scenario: Mapped[str] = mapped_column(String(120))
    lab: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16), default="ready", server_default="ready")
    progress: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    busy: Mapped[bool] = mapped_column(default=False, server_default="false")
    created_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()


def lab_tables():
    return [table for table in db.metadata.sorted_tables if table.schema is None]


def control_tables():
    return [table for table in db.metadata.sorted_tables if table.schema == CONTROL_SCHEMA]
