"""Typed models. Lab tables carry no schema (the session's search_path picks the lab);
control tables, shared by every lab on one database, live in ``lab_control``.
"""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Optional

from sqlalchemy import BigInteger, Column, MetaData, Table, DateTime, ForeignKey, Index, Integer, String, Text, func, text
from sqlalchemy.dialects.postgresql import JSONB, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from .connection import CONTROL_SCHEMA

# One MetaData for every table: the store's statements, the migrations and the web app's
# Flask-SQLAlchemy (given this MetaData) all read it. No Flask here: consumers and the agent import it.
metadata = MetaData()


class Base(DeclarativeBase):
    metadata = metadata

def _now():
    return mapped_column(server_default=func.now())


# --- the lab's business state (one copy per lab schema) -------------------------------

class Account(Base):
    __tablename__ = "accounts"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner: Mapped[str] = mapped_column(String(80))
    balance: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # cents
    status: Mapped[str] = mapped_column(String(32), default="ACTIVE", server_default="ACTIVE")
    # Event time of the set that wrote status / balance (set_status, set_balance): the guard of
    # the natural strategy compares against it, so an older set re-sent later cannot regress state.
    status_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    balance_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


class Score(Base):
    """A customer's latest credit score (the seed's risco-service): written by an upsert by primary key."""
    __tablename__ = "scores"
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"), primary_key=True)
    score: Mapped[int] = mapped_column(Integer)
    score_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))  # event time of the set_score


# check-then-act's key table: deliberately no primary key and no unique constraint (the developer
# trusted the SELECT); the index makes the lookup fast and guarantees nothing.
seen_events = Table(
    "seen_events", metadata,
    Column("event_id", UUID, nullable=False, index=True),
    Column("processed_at", DateTime(timezone=True), nullable=False, server_default=func.now(), index=True),
)


class Payment(Base):
    """One row per applied credit: the effect. Never unique, so a duplicate shows as a second row."""
    __tablename__ = "payments"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, index=True)
    transaction_id: Mapped[str] = mapped_column(String(64), index=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    applied_at: Mapped[datetime] = _now()


class ProcessedEvent(Base):
    __tablename__ = "processed_events"
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    # indexed: the TTL cleanup, the oldest key's age and the newest keys all range over it;
    # TIMESTAMPTZ, as in the source text's DDL (an instant, whatever the session's time zone)
    processed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)


class ProcessedTransaction(Base):
    __tablename__ = "processed_transactions"
    transaction_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    processed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)


class ProcessedPayload(Base):
    """payload-hash's key table: sha256 of the event's content without its ids (see the strategy)."""
    __tablename__ = "processed_payloads"
    payload_hash: Mapped[str] = mapped_column(Text, primary_key=True)
    processed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now(), index=True)


class LedgerEntry(Base):
    """Natural idempotency: a credit is a fact keyed by its event; the balance is derived."""
    __tablename__ = "ledger"
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("accounts.id"))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = _now()


# --- what the lab produced and observed ------------------------------------------------

class PublishedEvent(Base):
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


class LogRecord(Base):
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
    # Which producer wrote the event and its running number there (events.py; the lab's producer
    # stamps them, other clients need not): NULL when the event does not carry them.
    producer_id: Mapped[Optional[str]] = mapped_column(String(64))
    producer_seq: Mapped[Optional[int]] = mapped_column(BigInteger)
    # Set by the reader as it inserts: the highest producer_seq of an earlier record of the same
    # producer in the same partition, when it is above this record's (it landed out of order).
    out_of_order_after: Mapped[Optional[int]] = mapped_column(BigInteger)
    read_at: Mapped[datetime] = _now()
    __table_args__ = (
        # A producer's numbers per partition: the reader's "highest so far", the strip's "a copy?".
        Index("log_records_producer_seq", "partition", "producer_id", "producer_seq",
              postgresql_where=text("producer_id IS NOT NULL")),
        # The valid records of a transaction in log order: the reader's "first?" check, the why.
        Index("log_records_truth", "transaction_id", "partition", "offset",
              postgresql_where=text("invalid_reason IS NULL")),
        # Ground truth per account (expected balance, latest set) and over time (the chart), read
        # from the index alone.
        Index("log_records_firsts", "account_id", "type",
              postgresql_include=["partition", "offset", "amount_cents", "status", "balance_cents", "score", "read_at"],
              postgresql_where=text("first_of_transaction")),
        # The latest set of each account and kind (the expected status, balance and score): the
        # sets alone, so the accounts panel does not walk every first credit to find them.
        Index("log_records_first_sets", "account_id", "type", "partition", "offset",
              postgresql_include=["status", "balance_cents", "score"],
              postgresql_where=text("first_of_transaction AND type IN ('set_status', 'set_balance', 'set_score')")),
        # The same event at several offsets (a producer retry after a lost ack, a resend), the drill-down.
        Index("log_records_event_id", "event_id"),
        # The newest batch the reader wrote: the panels' change fingerprint and the chart's time span.
        Index("log_records_read_at", "read_at"),
    )


class Delivery(Base):
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
                      # the log end per partition (partitions.log_ends), whatever the group
                      Index("deliveries_partition_offset", "partition", "offset"),
                      # absorbed and dead-lettered deliveries are few: the verdict and lanes count them
                      Index("deliveries_outcome", "outcome"))


class TimelineEntry(Base):
    __tablename__ = "timeline"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = mapped_column(server_default=func.now(), index=True)
    kind: Mapped[str] = mapped_column(String(32))
    summary: Mapped[str] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")


class ConsumerGroup(Base):
    __tablename__ = "consumer_groups"
    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    strategy: Mapped[str] = mapped_column(String(24))
    # The schema the group applies its effects to: the lab's own, or a strategy lane's copy.
    effects_schema: Mapped[str] = mapped_column(String(63))
    # What the consumer does with a unique violation (strategies.ON_UNIQUE_VIOLATION): the seed's
    # "already processed" (absorb, commit the offset) or "retry" (a generic error: backoff, then the DLQ).
    on_unique_violation: Mapped[str] = mapped_column(String(24), default="already-processed",
                                                     server_default="already-processed")
    # Throughput (revision 0007): batch_size 1 is per-message mode, more is batch mode (consume(n),
    # one transaction and one offset commit per batch); commit_mode sync|async; static membership
    # (group.instance.id) applies when a consumer (re)starts.
    batch_size: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    batch_max_wait_ms: Mapped[int] = mapped_column(Integer, default=100, server_default="100")
    commit_mode: Mapped[str] = mapped_column(String(8), default="sync", server_default="sync")
    static_membership: Mapped[bool] = mapped_column(default=False, server_default="false")
    # The external side effect (issue 13): whether the group's consumers notify the notification
    # service of an applied credit, where (vocabulary.NOTIFY_MODES), and with `Idempotency-Key: <event_id>`.
    notify: Mapped[str] = mapped_column(String(16), default="off", server_default="off")
    notify_idempotency_key: Mapped[bool] = mapped_column(default=False, server_default="false")
    created_at: Mapped[datetime] = _now()
    # Health and recovery (revision 0015, issue 29): the Kafka group id the members join (NULL: the
    # group's own; a recovery that had to move the group gives it a fresh one, Lab.kafka_group_id),
    # when the last recovery started, and the last health transition written to the timeline.
    kafka_group_id: Mapped[Optional[str]] = mapped_column(String(160))
    recovery_started_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    health: Mapped[Optional[str]] = mapped_column(String(16))
    health_since: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


class Notification(Base):
    """The notification service's own record (webapp/notify): every request it received, one row
    each. A request whose Idempotency-Key was seen before is answered with the first response and
    kept here as ``replayed``: the customer got nothing new. The Notifications panel's "received"."""
    __tablename__ = "notifications"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    account_id: Mapped[str] = mapped_column(String(32))
    event_id: Mapped[uuid.UUID] = mapped_column(UUID)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    text: Mapped[str] = mapped_column(Text)
    idempotency_key: Mapped[Optional[str]] = mapped_column(Text)
    replayed: Mapped[bool] = mapped_column(default=False, server_default="false")
    received_at: Mapped[datetime] = _now()
    __table_args__ = (Index("notifications_account_event", "account_id", "event_id"),)


class IdempotencyKey(Base):
    """The notification service's idempotency keys: the first response to each key, replayed to
    every later request with the same key. The primary key is what makes two concurrent requests
    with one key deliver once (the second waits on the first's insert, then finds it)."""
    __tablename__ = "idempotency_keys"
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    request_hash: Mapped[str] = mapped_column(Text)   # the first request's body: a reuse with another is refused
    status: Mapped[int] = mapped_column(Integer)
    body: Mapped[dict[str, Any]] = mapped_column(JSONB)
    replays: Mapped[int] = mapped_column(default=0, server_default="0")
    created_at: Mapped[datetime] = _now()


class NotificationSent(Base):
    """The consumers' side: every call to the notification service, written on the consumer's
    control connection (outside the effect's transaction, so a rolled-back effect keeps its call)."""
    __tablename__ = "notifications_sent"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    group_id: Mapped[str] = mapped_column(String(128))
    consumer: Mapped[str] = mapped_column(String(64))
    generation: Mapped[int] = mapped_column(Integer)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID)
    account_id: Mapped[str] = mapped_column(String(32))
    mode: Mapped[str] = mapped_column(String(16))     # before-commit | after-commit
    idempotency_key: Mapped[Optional[str]] = mapped_column(Text)
    status: Mapped[int] = mapped_column(Integer)      # the service's HTTP status
    replayed: Mapped[bool] = mapped_column(default=False, server_default="false")
    sent_at: Mapped[datetime] = _now()


class GroupOffset(Base):
    """Committed offsets per group and partition, as the lab agent last read them from Kafka."""
    __tablename__ = "group_offsets"
    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    partition: Mapped[int] = mapped_column(Integer, primary_key=True)
    committed: Mapped[Optional[int]] = mapped_column(BigInteger)
    read_at: Mapped[datetime] = _now()


class Setting(Base):
    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[Any] = mapped_column(JSONB)


class LoadRun(Base):
    """One run of the load generator (webapp/load.py): what was asked, and its progress as the
    agent's producer thread reports it. ``cancel_requested`` is the lab's request to stop."""
    __tablename__ = "load_runs"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    events: Mapped[int] = mapped_column(BigInteger)
    accounts: Mapped[int] = mapped_column(Integer)
    rate_per_second: Mapped[int] = mapped_column(Integer)  # 0: as fast as possible
    resend_ratio: Mapped[float]
    source_duplicate_ratio: Mapped[float]
    seed: Mapped[int] = mapped_column(BigInteger)
    state: Mapped[str] = mapped_column(String(16), default="starting", server_default="starting")
    sent: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    resends: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    source_duplicates: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    failed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    rate: Mapped[float] = mapped_column(default=0, server_default="0")  # records/s over the last report
    cancel_requested: Mapped[bool] = mapped_column(default=False, server_default="false")
    error: Mapped[Optional[str]] = mapped_column(Text)
    started_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    finished_at: Mapped[Optional[datetime]]


class WarmupRun(Base):
    """One dedup warm-up (synthetic keys into ``processed_events``), run by a lab agent's thread
    (webapp/agent/warmup.py): what was asked, and the keys inserted so far as it reports them.
    ``cancel_requested`` is the lab's request to stop."""
    __tablename__ = "warmup_runs"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    keys: Mapped[int] = mapped_column(BigInteger)
    days: Mapped[int] = mapped_column(Integer)
    state: Mapped[str] = mapped_column(String(16), default="starting", server_default="starting")
    inserted: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    rate: Mapped[float] = mapped_column(default=0, server_default="0")  # keys/s over the last report
    cancel_requested: Mapped[bool] = mapped_column(default=False, server_default="false")
    error: Mapped[Optional[str]] = mapped_column(Text)
    started_at: Mapped[datetime] = _now()
    updated_at: Mapped[datetime] = _now()
    finished_at: Mapped[Optional[datetime]]


class DedupScale(Base):
    """Dedup tables at scale, per table, as the agent's sampler last measured them: rows (exact
    when small, pg_class.reltuples when large), sizes, the latency of a probe key insert
    (rolled back), and the last TTL cleanup's duration."""
    __tablename__ = "dedup_scale"
    table_name: Mapped[str] = mapped_column(String(63), primary_key=True)
    rows: Mapped[Optional[int]] = mapped_column(BigInteger)
    rows_estimated: Mapped[bool] = mapped_column(default=False, server_default="false")
    table_bytes: Mapped[Optional[int]] = mapped_column(BigInteger)
    index_bytes: Mapped[Optional[int]] = mapped_column(BigInteger)
    insert_p50_ms: Mapped[Optional[float]]
    insert_p99_ms: Mapped[Optional[float]]
    insert_samples: Mapped[int] = mapped_column(default=0, server_default="0")
    sampled_at: Mapped[Optional[datetime]]
    cleanup_ms: Mapped[Optional[float]]
    cleanup_method: Mapped[Optional[str]] = mapped_column(String(24))  # delete | drop-partitions
    cleanup_removed: Mapped[Optional[int]] = mapped_column(BigInteger)
    cleanup_at: Mapped[Optional[datetime]]


# --- the transactional outbox: the payments service's tables and its relay (webapp/outbox) ----

class SourcePayment(Base):
    """The payments service's own record of a payment (not the consumers' ``payments`` effect
    table): written in one transaction with its outbox row (store/outbox.py)."""
    __tablename__ = "source_payments"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    # The service records a business payment once: a second one with the same id fails, and its
    # outbox row with it.
    transaction_id: Mapped[str] = mapped_column(String(64), unique=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID)
    account_id: Mapped[str] = mapped_column(String(32))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class OutboxRow(Base):
    """One event to publish, exactly as the relay will publish it; ``published_at`` NULL until sent."""
    __tablename__ = "outbox"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, unique=True)
    key: Mapped[str] = mapped_column(Text)
    payload: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    published_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    attempts: Mapped[int] = mapped_column(default=0, server_default="0")
    # The relay's scan: unsent rows in order, from an index that holds only them.
    __table_args__ = (Index("outbox_unsent", "id", postgresql_where=text("published_at IS NULL")),)


class OutboxPublish(Base):
    """Every publish of an outbox row by the relay, with its delivery report: committed before the
    row is marked sent, so a relay killed in between leaves the evidence of its republish."""
    __tablename__ = "outbox_publishes"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    outbox_id: Mapped[int] = mapped_column(BigInteger)
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    partition: Mapped[Optional[int]] = mapped_column(Integer)
    offset: Mapped[Optional[int]] = mapped_column(BigInteger)
    pid: Mapped[int] = mapped_column(Integer)
    published_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class RelayState(Base):
    """The outbox relay of this lab (one row, id 1): what the lab asks of it and what it reports."""
    __tablename__ = "relay_state"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    # Desired: a crash point (vocabulary.RELAY_CRASH_POINTS), once or every time.
    armed_point: Mapped[Optional[str]] = mapped_column(String(40))
    armed_always: Mapped[bool] = mapped_column(default=False, server_default="false")
    # Reported: the agent that runs it, its process and what it did.
    agent_id: Mapped[Optional[str]] = mapped_column(String(128))
    pid: Mapped[Optional[int]]
    state: Mapped[str] = mapped_column(String(16), default="wanted", server_default="wanted")
    starts: Mapped[int] = mapped_column(default=0, server_default="0")
    published: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    republished: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    last_event_id: Mapped[Optional[uuid.UUID]] = mapped_column(UUID)
    last_published_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    crashed_at: Mapped[Optional[str]] = mapped_column(String(40))
    last_error: Mapped[Optional[str]] = mapped_column(Text)
    heartbeat_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


# --- the running summaries of the verdict (webapp/summary/) ---------------------------------------

class VerdictChange(Base):
    """The summaries' queue: the keys of every row of ``log_records``, ``deliveries``, ``payments``
    and ``ledger`` that a statement inserted, updated or deleted, written by triggers in that
    statement's transaction; the agent's folder empties it."""
    __tablename__ = "verdict_changes"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    log: Mapped[bool]  # a change of the log mirror (every copy of the accounts judges against it)
    key: Mapped[Optional[str]] = mapped_column(Text)
    event_id: Mapped[Optional[uuid.UUID]] = mapped_column(UUID)
    partition: Mapped[Optional[int]] = mapped_column(Integer)
    offset: Mapped[Optional[int]] = mapped_column(BigInteger)
    outcome: Mapped[Optional[str]] = mapped_column(String(24))  # a delivery's
    account_id: Mapped[Optional[str]] = mapped_column(String(32))
    cents: Mapped[Optional[int]] = mapped_column(BigInteger)  # a first credit's (log), a ledger row's
    chart_cents: Mapped[Optional[int]] = mapped_column(BigInteger)  # a first credit's, a payment's, a ledger row's
    second: Mapped[Optional[int]] = mapped_column(BigInteger)  # its time, whole epoch seconds (the chart's)
    sign: Mapped[int] = mapped_column(Integer, default=1, server_default="1")  # +1 a new row, -1 an old one
    rebuild: Mapped[bool] = mapped_column(default=False, server_default="false")  # a TRUNCATE


class VerdictKey(Base):
    """VERDICT_SQL's per-transaction facts, per key (a transaction id, ``record:<p>:<o>`` for an
    invalid record, ``ledger:<event id>`` for a ledger row the log does not explain), as folded."""
    __tablename__ = "verdict_keys"
    key: Mapped[str] = mapped_column(Text, primary_key=True)
    records: Mapped[int] = mapped_column(BigInteger)  # valid records
    several_events: Mapped[bool]
    delta: Mapped[bool]
    consumed: Mapped[bool]
    dead: Mapped[bool]
    effects: Mapped[int] = mapped_column(BigInteger)
    effects_delivered: Mapped[int] = mapped_column(BigInteger)
    applied: Mapped[int] = mapped_column(BigInteger)
    log_records: Mapped[int] = mapped_column(BigInteger)
    log_pending: Mapped[int] = mapped_column(BigInteger)
    log_invalid: Mapped[int] = mapped_column(BigInteger)
    log_invalid_kept: Mapped[int] = mapped_column(BigInteger)
    # When this key first went wrong, for the lanes panel's first divergent event: its second
    # effect (by time, then id), and the first absorbed delivery of one of its records.
    second_effect_at: Mapped[datetime | None]
    first_absorbed_at: Mapped[datetime | None]
    # The keys the lanes panel looks for, in the order it wants them (summary/reads.py: TWICE, LOST).
    __table_args__ = (Index("verdict_keys_twice", "second_effect_at", "key",
                            postgresql_where=text("records > 0 AND delta AND effects > 1")),
                      Index("verdict_keys_lost", "first_absorbed_at", "key",
                            postgresql_where=text("records > 0 AND delta AND effects = 0 "
                                                  "AND first_absorbed_at IS NOT NULL")))


class VerdictTotals(Base):
    """The verdict's counts over every key (one row), and the committed offsets they reflect."""
    __tablename__ = "verdict_totals"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    transactions: Mapped[int] = mapped_column(BigInteger)
    duplicates_applied: Mapped[int] = mapped_column(BigInteger)
    transactions_applied_twice: Mapped[int] = mapped_column(BigInteger)
    effects_lost: Mapped[int] = mapped_column(BigInteger)
    source_duplicates_absorbed: Mapped[int] = mapped_column(BigInteger)
    source_duplicates: Mapped[int] = mapped_column(BigInteger)
    not_yet_applied: Mapped[int] = mapped_column(BigInteger)
    sets_reapplied: Mapped[int] = mapped_column(BigInteger)
    records: Mapped[int] = mapped_column(BigInteger)
    records_pending: Mapped[int] = mapped_column(BigInteger)
    invalid_records: Mapped[int] = mapped_column(BigInteger)
    invalid_not_dead_lettered: Mapped[int] = mapped_column(BigInteger)
    effects_without_record: Mapped[int] = mapped_column(BigInteger)
    effects_not_yet_mirrored: Mapped[int] = mapped_column(BigInteger)
    redeliveries_absorbed: Mapped[int] = mapped_column(BigInteger)
    dead_letters: Mapped[int] = mapped_column(BigInteger)
    committed: Mapped[dict[str, Any]] = mapped_column(JSONB)  # {partition: offset}
    folded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class ExpectedCredit(Base):
    """Per account, the sum of the log's first credits (the lab's schema: the journal's)."""
    __tablename__ = "expected_credits"
    account_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    cents: Mapped[int] = mapped_column(BigInteger)


class RepeatedEvent(Base):
    """The events the log holds at more than one offset (the lab's schema: the journal's)."""
    __tablename__ = "repeated_events"
    event_id: Mapped[uuid.UUID] = mapped_column(UUID, primary_key=True)


class ChartTruth(Base):
    """Per second (epoch), the cents of the first credits the reader mirrored then (the journal's)."""
    __tablename__ = "chart_truth"
    second: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    cents: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(BigInteger)


class ChartEffect(Base):
    """Per second (epoch), the cents this copy's effects (payments, ledger rows) applied then."""
    __tablename__ = "chart_effects"
    second: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    cents: Mapped[int] = mapped_column(BigInteger)
    rows: Mapped[int] = mapped_column(BigInteger)


class LedgerSum(Base):
    """Per account, the sum of this copy's ledger rows (the natural strategy's credits)."""
    __tablename__ = "ledger_sums"
    account_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    cents: Mapped[int] = mapped_column(BigInteger)


# --- control: shared by all labs on this database ---------------------------------------

class Agent(Base):
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


class ServiceHeartbeat(Base):
    """A helper process the lab depends on, as it reports itself: the log reader and the
    notification service beat here every SERVICE_BEAT_SECONDS (store/service_heartbeats.py); one
    row per process (two agents on one database each run a log reader), deleted when it stops
    gracefully, and a killed one's by the next of its service after a while. The dashboard shows a
    service down when its freshest beat is older than SERVICE_DOWN_AFTER_SECONDS
    (readmodel/service_health.py)."""
    __tablename__ = "service_heartbeats"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    service: Mapped[str] = mapped_column(String(32), primary_key=True)
    host: Mapped[str] = mapped_column(String(128), primary_key=True)
    pid: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    started_at: Mapped[datetime] = _now()
    heartbeat_at: Mapped[datetime] = _now()


class OutsideRole(Base):
    """The PostgreSQL role of a lane whose consumer is the learner's own code (issue 34,
    store/outside.py) and its password: generated at random when the lane is first made, kept
    across the lab's resets (which drop and re-create the role: the URL a learner copied stays
    valid), and deleted when the lab is dropped. Whoever makes the role, the web or an agent
    running a grading exercise, reads the same password here."""
    __tablename__ = "outside_roles"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    role: Mapped[str] = mapped_column(String(63), primary_key=True)
    lab: Mapped[str] = mapped_column(String(32), index=True)
    password: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = _now()


class Consumer(Base):
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
    # When it last read what it applies (its acknowledgement of a change: settings_changes.settle).
    settings_seen_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    # The clocks of its group's health (revision 0015, domain/group_health.py): when its reported
    # assignment last changed (or its process started or ended), and when its position last moved.
    assigned_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))
    progressed_at: Mapped[Optional[datetime]] = mapped_column(DateTime(timezone=True))


class Command(Base):
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


class FaultProxy(Base):
    """The lost-ack fault proxy process as it reports itself, and the version of the labs' settings
    it acknowledged. What each lab asks of it is that lab's row in ``fault_proxy_labs``.

    Any lab's arming bumps ``version`` (webapp/store/faultproxies.py); the proxy process
    (``python -m webapp.faultproxy``, maybe in another container) reads every lab's row and
    acknowledges the version it read in ``seen_version``.
    """
    __tablename__ = "fault_proxies"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # bumped by each setting
    # Reported by the proxy.
    seen_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    listen: Mapped[Optional[str]] = mapped_column(String(128))
    upstream: Mapped[Optional[str]] = mapped_column(String(128))
    host: Mapped[Optional[str]] = mapped_column(String(128))
    pid: Mapped[Optional[int]]
    started_at: Mapped[Optional[datetime]]
    heartbeat_at: Mapped[Optional[datetime]]
    # The whole proxy's traffic, every client's (a lab reads only its own row's counters).
    connections: Mapped[int] = mapped_column(default=0, server_default="0")
    produce_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_dropped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_delayed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    connections_cut: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    commits_blocked: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class FaultProxyLab(Base):
    """One lab's faults at one fault proxy (issue 28): they act only on requests whose Kafka client
    id names that lab (``Lab.of_client_id``), and only that lab reads or changes them.

    Written by the lab's operations (arm_fault_proxy, block_commits, chaos's cuts); the proxy
    reports the lab's counters here and writes its injected faults to the lab's timeline.
    """
    __tablename__ = "fault_proxy_labs"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    proxy: Mapped[str] = mapped_column(String(64), primary_key=True)
    lab: Mapped[str] = mapped_column(String(32), primary_key=True)
    # Desired.
    drop_produce_responses: Mapped[int] = mapped_column(default=0, server_default="0")  # left to drop
    delay_ms: Mapped[int] = mapped_column(default=0, server_default="0")
    armed_at: Mapped[Optional[datetime]]
    # Commit mode (issue 14): {Kafka client id of one of the lab's consumers: until when, epoch
    # seconds}; the proxy closes any connection of such a client that carries an OffsetCommit.
    blocked_commits: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    # Chaos (issue 15): cut the broker connections of these client ids of the lab once per bump of cut_version.
    cut_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    cut_client_ids: Mapped[list[Any]] = mapped_column(JSONB, default=list, server_default="[]")
    # Reported by the proxy: the lab's clients only.
    seen_cut_version: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The blocked clients that had a connection through the proxy when it took the lab's last setting.
    blocked_seen: Mapped[list[Any]] = mapped_column(JSONB, default=list, server_default="[]")
    connections: Mapped[int] = mapped_column(default=0, server_default="0")
    produce_requests: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_dropped: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    responses_delayed: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    commits_blocked: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    connections_cut: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class ChaosSession(Base):
    """A chaos session on one group (issue 15): seeded random kills, freezes, restarts, session
    terminations and broker connection cuts, carried out by the agent that runs it. Each action
    goes to the lab's timeline (kind ``chaos``) with the seed and its index."""
    __tablename__ = "chaos_sessions"
    __table_args__ = {"schema": CONTROL_SCHEMA}
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    lab: Mapped[str] = mapped_column(String(32), index=True)
    group_id: Mapped[str] = mapped_column(String(128))
    seed: Mapped[int] = mapped_column(BigInteger)
    every_seconds: Mapped[float]
    actions: Mapped[list[Any]] = mapped_column(JSONB, default=list, server_default="[]")
    down_seconds: Mapped[float]
    max_actions: Mapped[Optional[int]]
    agent_id: Mapped[Optional[str]] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16), default="running", server_default="running")  # running|stopping|stopped
    actions_done: Mapped[int] = mapped_column(default=0, server_default="0")
    last_action: Mapped[Optional[str]] = mapped_column(Text)
    stop_reason: Mapped[Optional[str]] = mapped_column(Text)
    started_at: Mapped[datetime] = _now()
    stopped_at: Mapped[Optional[datetime]]


class SessionOperation(Base):
    """Record and replay: every operation performed on the lab, in order, with what the lab
    looked like just before it (the wait a replay repeats) and what it returned."""
    __tablename__ = "session_log"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    at: Mapped[datetime] = _now()
    operation: Mapped[str] = mapped_column(String(40))
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    before: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")
    result: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default="{}")


class ScenarioRun(Base):
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


class Attendee(Base):
    """Classroom mode: one attendee of a class and the lab that is theirs (joined through /join).
    ``name_key`` is the name casefolded (unique in the class: ``Ana`` and ``ANA`` are one attendee);
    ``rejoin_hash`` a salted hash of their rejoin code (store/classroom.py), never the code."""
    __tablename__ = "attendees"
    __table_args__ = (Index("attendees_class_name_key", "class_code", "name_key", unique=True),
                      {"schema": CONTROL_SCHEMA})
    id: Mapped[int] = mapped_column(primary_key=True)
    class_code: Mapped[str] = mapped_column(String(64), server_default="")
    name: Mapped[str] = mapped_column(String(64))
    name_key: Mapped[str] = mapped_column(String(64))
    rejoin_hash: Mapped[Optional[str]] = mapped_column(String(160))
    lab: Mapped[str] = mapped_column(String(32), unique=True)
    joined_at: Mapped[datetime] = _now()
    seen_at: Mapped[datetime] = _now()


def lab_tables():
    return [table for table in metadata.sorted_tables if table.schema is None]


def control_tables():
    return [table for table in metadata.sorted_tables if table.schema == CONTROL_SCHEMA]
