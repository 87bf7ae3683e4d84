"""Every table of the lab: plain SQLAlchemy Core ``Table`` declarations on one MetaData.

Lab tables carry no schema (the session's search_path picks the lab); control tables, shared by
every lab on one database, live in ``lab_control``. The store's statements, the migrations and the
web app's Flask-SQLAlchemy (given this MetaData) all read them. No ORM and no Flask here: the
consumers and the agent import it, and a declarative mapping cost every process ~0.25 s to import.
"""
from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB, UUID

from .connection import CONTROL_SCHEMA

metadata = MetaData()


# --- the lab's business state (one copy per lab schema) -------------------------------

accounts = Table(
    "accounts", metadata,
    Column("id", String(32), primary_key=True),
    Column("owner", String(80), nullable=False),
    Column("balance", BigInteger, default=0, server_default="0", nullable=False),  # cents
    Column("status", String(32), default="ACTIVE", server_default="ACTIVE", nullable=False),
    # Event time of the set that wrote status / balance (set_status, set_balance): the guard of
    # the natural strategy compares against it, so an older set re-sent later cannot regress state.
    Column("status_at", DateTime(timezone=True)),
    Column("balance_at", DateTime(timezone=True)),
)


# A customer's latest credit score (the seed's risco-service): written by an upsert by primary key.
scores = Table(
    "scores", metadata,
    Column("account_id", String(32), ForeignKey("accounts.id"), primary_key=True),
    Column("score", Integer, nullable=False),
    Column("score_at", DateTime(timezone=True), nullable=False),  # event time of the set_score
)


# check-then-act's key table: deliberately no primary key and no unique constraint (the developer
# trusted the SELECT); the index makes the lookup fast and guarantees nothing.
seen_events = Table(
    "seen_events", metadata,
    Column("event_id", UUID, nullable=False, index=True),
    Column("processed_at", DateTime(timezone=True), nullable=False, server_default=func.now(), index=True),
)


# One row per applied credit: the effect. Never unique, so a duplicate shows as a second row.
payments = Table(
    "payments", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("event_id", UUID, index=True, nullable=False),
    Column("transaction_id", String(64), index=True, nullable=False),
    Column("account_id", String(32), ForeignKey("accounts.id"), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("applied_at", DateTime(), server_default=func.now(), nullable=False),
)


# An audit trail beside a set (the natural-audit strategies): one row per status an application set.
# Its key is the lesson: natural-audit gives each row a new id (gen_random_uuid(), a row per execution,
# source text 000's "INSERT de um evento de auditoria"), natural-audit-keyed the event's id (ON CONFLICT
# DO NOTHING: one row per event, however often it is delivered).
audit_events = Table(
    "audit_events", metadata,
    Column("id", UUID, primary_key=True),
    Column("event_id", UUID, index=True, nullable=False),
    Column("transaction_id", String(64), index=True, nullable=False),
    Column("account_id", String(32), nullable=False),
    Column("action", Text, nullable=False),
    Column("recorded_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
)


def dedup_key_table(name: str, key: Column) -> Table:
    """A strategy's key table: the key under a primary key (the unique constraint the strategy's
    INSERT relies on) and when it was processed. processed_at is indexed: the TTL cleanup, the oldest
    key's age and the newest keys all range over it; TIMESTAMPTZ, as in the source text's DDL (an
    instant, whatever the session's time zone)."""
    return Table(name, metadata, key,
                 Column("processed_at", DateTime(timezone=True), server_default=func.now(), index=True,
                        nullable=False))


# The event id: eventid-atomic's, eventid-split's and insert-first's key.
processed_events = dedup_key_table("processed_events", Column("event_id", UUID, primary_key=True))
# business-key's: the transaction id the source system gave the payment.
processed_transactions = dedup_key_table("processed_transactions",
                                         Column("transaction_id", String(64), primary_key=True))
# payload-hash's: sha256 of the event's content without its ids (see the strategy).
processed_payloads = dedup_key_table("processed_payloads", Column("payload_hash", Text, primary_key=True))


# Natural idempotency: a credit is a fact keyed by its event; the balance is derived.
ledger = Table(
    "ledger", metadata,
    Column("event_id", UUID, primary_key=True),
    Column("account_id", String(32), ForeignKey("accounts.id"), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("recorded_at", DateTime(), server_default=func.now(), nullable=False),
)


# --- what the lab produced and observed ------------------------------------------------

# The journal: every record the lab produced, with partition/offset from its delivery report.
published_events = Table(
    "published_events", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("event_id", UUID, index=True),
    Column("transaction_id", String(64), index=True),
    Column("type", String(16)),
    Column("account_id", String(32)),
    Column("amount_cents", BigInteger),
    Column("status", String(32)),
    Column("mode", String(24), nullable=False),  # normal | resend | source-duplicate | poison | burst
    Column("idempotent_producer", Boolean(), nullable=False),
    Column("partition", Integer),
    Column("offset", BigInteger),
    Column("error", Text),
    Column("payload", Text, nullable=False),
    Column("published_at", DateTime(), server_default=func.now(), nullable=False),
    Index("published_events_partition_offset", "partition", "offset"),
    # Ground truth as published (the first credit of each transaction) read in index order,
    # without sorting the journal: the verdict, the accounts and the chart all start from it.
    Index("published_events_truth", "transaction_id", "id",
          postgresql_include=["account_id", "amount_cents", "published_at"],
          postgresql_where=text("type = 'credit' AND error IS NULL")),
)


# The log mirror: one row per record of the lab's topic, whoever produced it (the truth).
#
# Written only by the log reader (webapp/logreader), which reads every partition from the start
# without a group; (partition, offset) is the record's identity, so a re-read inserts nothing.
log_records = Table(
    "log_records", metadata,
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("offset", BigInteger, primary_key=True, autoincrement=False),
    Column("timestamp", DateTime(timezone=True)),  # the record's Kafka timestamp (create or log-append time)
    Column("key", Text),
    Column("headers", JSONB, default=list, server_default="[]", nullable=False),  # [[name, value], ...]
    # As text (undecodable bytes and NUL backslash-escaped); for a valid event, the event's whole
    # JSON object (``value::jsonb``), whatever its type's fields.
    Column("value", Text),
    # The decoded event's fields (NULL when the record is invalid).
    Column("event_id", UUID),
    Column("transaction_id", String(64)),
    Column("type", String(16)),
    Column("account_id", String(32)),
    Column("amount_cents", BigInteger),
    Column("status", String(32)),
    Column("balance_cents", BigInteger),
    Column("score", BigInteger),
    Column("occurred_at", Text),
    Column("invalid_reason", Text),  # why it is not a valid event
    # The first valid record of its transaction in log order (set by the reader as it inserts):
    # the one exactly-once applies. Later records of the same transaction are duplicates.
    Column("first_of_transaction", Boolean(), default=False, server_default="false", nullable=False),
    # Which producer wrote the event and its running number there (events.py; the lab's producer
    # stamps them, other clients need not): NULL when the event does not carry them.
    Column("producer_id", String(64)),
    Column("producer_seq", BigInteger),
    # Set by the reader as it inserts: the highest producer_seq of an earlier record of the same
    # producer in the same partition, when it is above this record's (it landed out of order).
    Column("out_of_order_after", BigInteger),
    Column("read_at", DateTime(), server_default=func.now(), nullable=False),
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


# The delivery ledger: every delivery of every record to a consumer, with its outcome.
#
# The row is written in the same transaction as the effect, so it cannot disagree with it.
deliveries = Table(
    "deliveries", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("group_id", String(128), nullable=False),
    Column("consumer", String(64), nullable=False),
    Column("partition", Integer, nullable=False),
    Column("offset", BigInteger, nullable=False),
    Column("generation", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("event_id", UUID, index=True),
    Column("transaction_id", String(64)),
    Column("strategy", String(24), nullable=False),
    Column("outcome", String(24), nullable=False),  # applied | absorbed | dead-lettered
    Column("reason", Text),
    Column("delivered_at", DateTime(), server_default=func.now(), nullable=False),
    Index("deliveries_group_partition_offset", "group_id", "partition", "offset"),
    # the timeline merges the newest deliveries with its own entries
    Index("deliveries_delivered_at", "delivered_at"),
    # the log end per partition (partitions.log_ends), whatever the group
    Index("deliveries_partition_offset", "partition", "offset"),
    # absorbed and dead-lettered deliveries are few: the verdict and lanes count them
    Index("deliveries_outcome", "outcome"),
)


timeline = Table(
    "timeline", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("at", DateTime(), server_default=func.now(), index=True, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("summary", Text, nullable=False),
    Column("detail", JSONB, default=dict, server_default="{}", nullable=False),
)


consumer_groups = Table(
    "consumer_groups", metadata,
    Column("group_id", String(128), primary_key=True),
    Column("strategy", String(24), nullable=False),
    # The schema the group applies its effects to: the lab's own, or a strategy lane's copy.
    Column("effects_schema", String(63), nullable=False),
    # What the consumer does with a unique violation (strategies.ON_UNIQUE_VIOLATION): the seed's
    # "already processed" (absorb, commit the offset) or "retry" (a generic error: backoff, then the DLQ).
    Column("on_unique_violation", String(24), default="already-processed", server_default="already-processed", nullable=False),
    # Throughput (revision 0007): batch_size 1 is per-message mode, more is batch mode (consume(n),
    # one transaction and one offset commit per batch); commit_mode sync|async|transactional
    # (widened in 0024); static membership (group.instance.id) applies when a consumer (re)starts.
    Column("batch_size", Integer, default=1, server_default="1", nullable=False),
    Column("batch_max_wait_ms", Integer, default=100, server_default="100", nullable=False),
    Column("commit_mode", String(16), default="sync", server_default="sync", nullable=False),
    Column("static_membership", Boolean(), default=False, server_default="false", nullable=False),
    # The external side effect: whether the group's consumers notify the notification
    # service of an applied credit, where (vocabulary.NOTIFY_MODES), and with `Idempotency-Key: <event_id>`.
    Column("notify", String(16), default="off", server_default="off", nullable=False),
    Column("notify_idempotency_key", Boolean(), default=False, server_default="false", nullable=False),
    Column("created_at", DateTime(), server_default=func.now(), nullable=False),
    # Health and recovery (revision 0015): the Kafka group id the members join (NULL: the
    # group's own; a recovery that had to move the group gives it a fresh one, Lab.kafka_group_id),
    # when the last recovery started, and the last health transition written to the timeline.
    Column("kafka_group_id", String(160)),
    Column("recovery_started_at", DateTime(timezone=True)),
    Column("health", String(16)),
    Column("health_since", DateTime(timezone=True)),
)


# The notification service's own record (webapp/notify): every request it received, one row
# each. A request whose Idempotency-Key was seen before is answered with the first response and
# kept here as ``replayed``: the customer got nothing new. The Notifications panel's "received".
notifications = Table(
    "notifications", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("account_id", String(32), nullable=False),
    Column("event_id", UUID, nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("text", Text, nullable=False),
    Column("idempotency_key", Text),
    Column("replayed", Boolean(), default=False, server_default="false", nullable=False),
    Column("received_at", DateTime(), server_default=func.now(), nullable=False),
    Index("notifications_account_event", "account_id", "event_id"),
)


# The notification service's idempotency keys: the first response to each key, replayed to
# every later request with the same key. The primary key is what makes two concurrent requests
# with one key deliver once (the second waits on the first's insert, then finds it).
idempotency_keys = Table(
    "idempotency_keys", metadata,
    Column("key", Text, primary_key=True),
    Column("request_hash", Text, nullable=False),  # the first request's body: a reuse with another is refused
    Column("status", Integer, nullable=False),
    Column("body", JSONB, nullable=False),
    Column("replays", Integer(), default=0, server_default="0", nullable=False),
    Column("created_at", DateTime(), server_default=func.now(), nullable=False),
)


# The consumers' side: every call to the notification service, written on the consumer's
# control connection (outside the effect's transaction, so a rolled-back effect keeps its call).
notifications_sent = Table(
    "notifications_sent", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("group_id", String(128), nullable=False),
    Column("consumer", String(64), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("event_id", UUID, nullable=False),
    Column("account_id", String(32), nullable=False),
    Column("mode", String(16), nullable=False),  # before-commit | after-commit
    Column("idempotency_key", Text),
    Column("status", Integer, nullable=False),  # the service's HTTP status
    Column("replayed", Boolean(), default=False, server_default="false", nullable=False),
    Column("sent_at", DateTime(), server_default=func.now(), nullable=False),
)


# Committed offsets per group and partition, as the lab agent last read them from Kafka.
group_offsets = Table(
    "group_offsets", metadata,
    Column("group_id", String(128), primary_key=True),
    Column("partition", Integer, primary_key=True),
    Column("committed", BigInteger),
    Column("read_at", DateTime(), server_default=func.now(), nullable=False),
)


settings = Table(
    "settings", metadata,
    Column("key", String(64), primary_key=True),
    Column("value", JSONB, nullable=False),
)


def heavy_run_progress() -> list[Column]:
    """What a load and a dedup warm-up both report as they run (webapp/agent/heavy.py): the rate
    over the last report, the lab's request to stop, the error, and when it started, last
    reported and finished."""
    return [Column("rate", Double(), default=0, server_default="0", nullable=False),
            Column("cancel_requested", Boolean(), default=False, server_default="false", nullable=False),
            Column("error", Text),
            Column("started_at", DateTime(), server_default=func.now(), nullable=False),
            Column("updated_at", DateTime(), server_default=func.now(), nullable=False),
            Column("finished_at", DateTime())]


# One run of the load generator (webapp/load.py): what was asked, and its progress as the
# agent's producer thread reports it. ``cancel_requested`` is the lab's request to stop.
load_runs = Table(
    "load_runs", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("events", BigInteger, nullable=False),
    Column("accounts", Integer, nullable=False),
    Column("rate_per_second", Integer, nullable=False),  # 0: as fast as possible
    Column("resend_ratio", Double(), nullable=False),
    Column("source_duplicate_ratio", Double(), nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("state", String(16), default="starting", server_default="starting", nullable=False),
    Column("sent", BigInteger, default=0, server_default="0", nullable=False),
    Column("resends", BigInteger, default=0, server_default="0", nullable=False),
    Column("source_duplicates", BigInteger, default=0, server_default="0", nullable=False),
    Column("failed", BigInteger, default=0, server_default="0", nullable=False),
    *heavy_run_progress(),  # rate: records/s over the last report
)


# One dedup warm-up (synthetic keys into ``processed_events``), run by a lab agent's thread
# (webapp/agent/warmup.py): what was asked, and the keys inserted so far as it reports them.
# ``cancel_requested`` is the lab's request to stop.
warmup_runs = Table(
    "warmup_runs", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("keys", BigInteger, nullable=False),
    Column("days", Integer, nullable=False),
    Column("state", String(16), default="starting", server_default="starting", nullable=False),
    Column("inserted", BigInteger, default=0, server_default="0", nullable=False),
    *heavy_run_progress(),  # rate: keys/s over the last report
)


# Dedup tables at scale, per table, as the agent's sampler last measured them: rows (exact
# when small, pg_class.reltuples when large), sizes, the latency of a probe key insert
# (rolled back), and the last TTL cleanup's duration.
dedup_scale = Table(
    "dedup_scale", metadata,
    Column("table_name", String(63), primary_key=True),
    Column("rows", BigInteger),
    Column("rows_estimated", Boolean(), default=False, server_default="false", nullable=False),
    Column("table_bytes", BigInteger),
    Column("index_bytes", BigInteger),
    Column("insert_p50_ms", Double()),
    Column("insert_p99_ms", Double()),
    Column("insert_samples", Integer(), default=0, server_default="0", nullable=False),
    Column("sampled_at", DateTime()),
    Column("cleanup_ms", Double()),
    Column("cleanup_method", String(24)),  # delete | drop-partitions
    Column("cleanup_removed", BigInteger),
    Column("cleanup_at", DateTime()),
)


# --- the transactional outbox: the payments service's tables and its relay (webapp/outbox) ----

# The payments service's own record of a payment (not the consumers' ``payments`` effect
# table): written in one transaction with its outbox row (store/outbox.py).
source_payments = Table(
    "source_payments", metadata,
    Column("id", BigInteger, primary_key=True),
    # The service records a business payment once: a second one with the same id fails, and its
    # outbox row with it.
    Column("transaction_id", String(64), unique=True, nullable=False),
    Column("event_id", UUID, nullable=False),
    Column("account_id", String(32), nullable=False),
    Column("amount_cents", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
)


# One event to publish, exactly as the relay will publish it; ``published_at`` NULL until sent.
outbox = Table(
    "outbox", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("event_id", UUID, unique=True, nullable=False),
    Column("key", Text, nullable=False),
    Column("payload", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
    Column("published_at", DateTime(timezone=True)),
    Column("attempts", Integer(), default=0, server_default="0", nullable=False),
    # The relay's scan: unsent rows in order, from an index that holds only them.
    Index("outbox_unsent", "id", postgresql_where=text("published_at IS NULL")),
)


# Every publish of an outbox row by the relay, with its delivery report: committed before the
# row is marked sent, so a relay killed in between leaves the evidence of its republish.
outbox_publishes = Table(
    "outbox_publishes", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("outbox_id", BigInteger, nullable=False),
    Column("event_id", UUID, index=True, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("partition", Integer),
    Column("offset", BigInteger),
    Column("pid", Integer, nullable=False),
    Column("published_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
)


# The outbox relay of this lab (one row, id 1): what the lab asks of it and what it reports.
relay_state = Table(
    "relay_state", metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    # Desired: a crash point (vocabulary.RELAY_CRASH_POINTS), once or every time.
    Column("armed_point", String(40)),
    Column("armed_always", Boolean(), default=False, server_default="false", nullable=False),
    # Reported: the agent that runs it, its process and what it did.
    Column("agent_id", String(128)),
    Column("pid", Integer()),
    Column("state", String(16), default="wanted", server_default="wanted", nullable=False),
    Column("starts", Integer(), default=0, server_default="0", nullable=False),
    Column("published", BigInteger, default=0, server_default="0", nullable=False),
    Column("republished", BigInteger, default=0, server_default="0", nullable=False),
    Column("last_event_id", UUID),
    Column("last_published_at", DateTime(timezone=True)),
    Column("crashed_at", String(40)),
    Column("last_error", Text),
    Column("heartbeat_at", DateTime(timezone=True)),
)


# --- the running summaries of the verdict (webapp/summary/) ---------------------------------------

# The summaries' queue: the keys of every row of ``log_records``, ``deliveries``, ``payments``
# and ``ledger`` that a statement inserted, updated or deleted, written by triggers in that
# statement's transaction; the agent's folder empties it.
verdict_changes = Table(
    "verdict_changes", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("log", Boolean(), nullable=False),  # a change of the log mirror (every copy of the accounts judges against it)
    Column("key", Text),
    Column("event_id", UUID),
    Column("partition", Integer),
    Column("offset", BigInteger),
    Column("outcome", String(24)),  # a delivery's
    Column("account_id", String(32)),
    Column("cents", BigInteger),  # a first credit's (log), a ledger row's
    Column("chart_cents", BigInteger),  # a first credit's, a payment's, a ledger row's
    Column("second", BigInteger),  # its time, whole epoch seconds (the chart's)
    Column("sign", Integer, default=1, server_default="1", nullable=False),  # +1 a new row, -1 an old one
    Column("rebuild", Boolean(), default=False, server_default="false", nullable=False),  # a TRUNCATE
)


# VERDICT_SQL's per-transaction facts, per key (a transaction id, ``record:<p>:<o>`` for an
# invalid record, ``ledger:<event id>`` for a ledger row the log does not explain), as folded.
verdict_keys = Table(
    "verdict_keys", metadata,
    Column("key", Text, primary_key=True),
    Column("records", BigInteger, nullable=False),  # valid records
    Column("several_events", Boolean(), nullable=False),
    Column("delta", Boolean(), nullable=False),
    Column("consumed", Boolean(), nullable=False),
    Column("dead", Boolean(), nullable=False),
    Column("effects", BigInteger, nullable=False),
    Column("effects_delivered", BigInteger, nullable=False),
    Column("applied", BigInteger, nullable=False),
    Column("log_records", BigInteger, nullable=False),
    Column("log_pending", BigInteger, nullable=False),
    Column("log_invalid", BigInteger, nullable=False),
    Column("log_invalid_kept", BigInteger, nullable=False),
    # When this key first went wrong, for the lanes panel's first divergent event: its second
    # effect (by time, then id), and the first absorbed delivery of one of its records.
    Column("second_effect_at", DateTime()),
    Column("first_absorbed_at", DateTime()),
    # The keys the lanes panel looks for, in the order it wants them (summary/reads.py: TWICE, LOST).
    Index("verdict_keys_twice", "second_effect_at", "key",
          postgresql_where=text("records > 0 AND delta AND effects > 1")),
    Index("verdict_keys_lost", "first_absorbed_at", "key",
          postgresql_where=text("records > 0 AND delta AND effects = 0 "
          "AND first_absorbed_at IS NOT NULL")),
)


# The verdict's counts over every key (one row), and the committed offsets they reflect.
verdict_totals = Table(
    "verdict_totals", metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("transactions", BigInteger, nullable=False),
    Column("duplicates_applied", BigInteger, nullable=False),
    Column("transactions_applied_twice", BigInteger, nullable=False),
    Column("effects_lost", BigInteger, nullable=False),
    Column("source_duplicates_absorbed", BigInteger, nullable=False),
    Column("source_duplicates", BigInteger, nullable=False),
    Column("not_yet_applied", BigInteger, nullable=False),
    Column("sets_reapplied", BigInteger, nullable=False),
    Column("records", BigInteger, nullable=False),
    Column("records_pending", BigInteger, nullable=False),
    Column("invalid_records", BigInteger, nullable=False),
    Column("invalid_not_dead_lettered", BigInteger, nullable=False),
    Column("effects_without_record", BigInteger, nullable=False),
    Column("effects_not_yet_mirrored", BigInteger, nullable=False),
    Column("redeliveries_absorbed", BigInteger, nullable=False),
    Column("dead_letters", BigInteger, nullable=False),
    Column("committed", JSONB, nullable=False),  # {partition: offset}
    Column("folded_at", DateTime(timezone=True), nullable=False),
)


def cents_per_account(name: str) -> Table:
    """A running summary: per account, a sum of cents."""
    return Table(name, metadata,
                 Column("account_id", String(32), primary_key=True),
                 Column("cents", BigInteger, nullable=False))


def cents_per_second(name: str) -> Table:
    """A running summary for the chart: per second (epoch), the cents and the rows behind them."""
    return Table(name, metadata,
                 Column("second", BigInteger, primary_key=True, autoincrement=False),
                 Column("cents", BigInteger, nullable=False),
                 Column("rows", BigInteger, nullable=False))


# Per account, the sum of the log's first credits (the lab's schema: the journal's).
expected_credits = cents_per_account("expected_credits")


# The events the log holds at more than one offset (the lab's schema: the journal's).
repeated_events = Table(
    "repeated_events", metadata,
    Column("event_id", UUID, primary_key=True),
)


# Per second (epoch), the cents of the first credits the reader mirrored then (the journal's).
chart_truth = cents_per_second("chart_truth")
# Per second (epoch), the cents this copy's effects (payments, ledger rows) applied then.
chart_effects = cents_per_second("chart_effects")
# Per account, the sum of this copy's ledger rows (the natural strategy's credits).
ledger_sums = cents_per_account("ledger_sums")


# --- control: shared by all labs on this database ---------------------------------------

# A lab agent process: owns consumer processes on its host, holds the Kafka clients.
agents = Table(
    "agents", metadata,
    Column("id", String(128), primary_key=True),  # host:pid:<6 hex>, unique per start
    Column("host", String(128), nullable=False),
    Column("pid", Integer(), nullable=False),
    Column("started_at", DateTime(), server_default=func.now(), nullable=False),
    Column("heartbeat_at", DateTime(), server_default=func.now(), nullable=False),
    Column("kafka_ok", Boolean(), default=False, server_default="false", nullable=False),
    Column("kafka_error", Text),
    schema=CONTROL_SCHEMA,
)


# A helper process the lab depends on, as it reports itself: the log reader and the
# notification service beat here every SERVICE_BEAT_SECONDS (store/service_heartbeats.py); one
# row per process (two agents on one database each run a log reader), deleted when it stops
# gracefully, and a killed one's by the next of its service after a while. The dashboard shows a
# service down when its freshest beat is older than SERVICE_DOWN_AFTER_SECONDS
# (readmodel/service_health.py).
service_heartbeats = Table(
    "service_heartbeats", metadata,
    Column("service", String(32), primary_key=True),
    Column("host", String(128), primary_key=True),
    Column("pid", Integer(), primary_key=True, autoincrement=False),
    Column("started_at", DateTime(), server_default=func.now(), nullable=False),
    Column("heartbeat_at", DateTime(), server_default=func.now(), nullable=False),
    schema=CONTROL_SCHEMA,
)


# The credentials of a lane whose consumer is the learner's own code (store/outside.py): its
# PostgreSQL role's password and its Kafka password, generated at random when the lane is first
# made, kept across the lab's resets (which drop and re-create the role: the URL a learner copied
# stays valid), and deleted when the lab is dropped. Both kept encrypted under SECRET_KEY (the lab
# shows them to the learner), the Kafka one also hashed (what the gateway checks).
outside_roles = Table(
    "outside_roles", metadata,
    Column("role", String(63), primary_key=True),
    Column("lab", String(32), index=True, nullable=False),
    Column("password_encrypted", Text()),
    Column("kafka_password_encrypted", Text()),
    Column("kafka_password_hash", Text()),
    Column("created_at", DateTime(), server_default=func.now(), nullable=False),
    schema=CONTROL_SCHEMA,
)


# One consumer process: what it was asked to be and what it last reported.
consumers = Table(
    "consumers", metadata,
    Column("id", Integer(), primary_key=True),
    Column("lab", String(32), index=True, nullable=False),
    Column("name", String(64), nullable=False),
    Column("group_id", String(128), nullable=False),
    Column("agent_id", String(128)),
    Column("pid", Integer()),
    Column("state", String(24), default="starting", server_default="starting", nullable=False),
    # Desired fault/step settings, written by the lab, read by the consumer each loop.
    Column("armed_point", String(40)),
    Column("armed_action", String(16)),  # crash | freeze
    Column("armed_always", Boolean(), default=False, server_default="false", nullable=False),
    Column("step_mode", Boolean(), default=False, server_default="false", nullable=False),
    Column("step_advance", Integer(), default=0, server_default="0", nullable=False),
    # Reported by the consumer.
    Column("step_at", String(40)),
    Column("assigned", JSONB, default=list, server_default="[]", nullable=False),
    Column("positions", JSONB, default=dict, server_default="{}", nullable=False),
    Column("applied_positions", JSONB, default=dict, server_default="{}", nullable=False),
    Column("generation", Integer(), default=0, server_default="0", nullable=False),
    Column("applied", Integer(), default=0, server_default="0", nullable=False),
    Column("absorbed", Integer(), default=0, server_default="0", nullable=False),
    Column("dead_lettered", Integer(), default=0, server_default="0", nullable=False),
    Column("commit_failures", Integer(), default=0, server_default="0", nullable=False),
    Column("last_error", Text),
    Column("exit_code", Integer()),
    Column("started_at", DateTime(), server_default=func.now(), nullable=False),
    Column("heartbeat_at", DateTime()),
    # When it last read what it applies (its acknowledgement of a change: settings_changes.settle).
    Column("settings_seen_at", DateTime(timezone=True)),
    # The clocks of its group's health (revision 0015, domain/group_health.py): when its reported
    # assignment last changed (or its process started or ended), and when its position last moved.
    Column("assigned_at", DateTime(timezone=True)),
    Column("progressed_at", DateTime(timezone=True)),
    schema=CONTROL_SCHEMA,
)


# A request from the web or CLI to a lab agent, carried through PostgreSQL.
commands = Table(
    "commands", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("lab", String(32), nullable=False),
    Column("verb", String(32), nullable=False),
    Column("args", JSONB, default=dict, server_default="{}", nullable=False),
    # Commands about one consumer go to the agent that owns it; the rest to any agent.
    Column("agent_id", String(128)),
    Column("status", String(16), default="pending", server_default="pending", nullable=False),  # pending|running|done|failed
    Column("result", JSONB),
    Column("error", Text),
    Column("created_at", DateTime(), server_default=func.now(), nullable=False),
    Column("finished_at", DateTime()),
    # The lease: the agent that claimed the command renews it with each heartbeat; a running
    # command whose lease ran out belongs to a dead agent, and the reaper fails it.
    Column("claimed_by", String(128)),
    Column("lease_expires_at", DateTime(timezone=True)),
    schema=CONTROL_SCHEMA,
)


def traffic_counters(*names: str) -> list[Column]:
    """A fault proxy's traffic counters, zero to start: the whole proxy's (fault_proxies) and each
    lab's (fault_proxy_labs) count the same things."""
    return [Column(name, Integer() if name == "connections" else BigInteger, default=0, server_default="0",
                   nullable=False) for name in names]


# The lost-ack fault proxy process as it reports itself, and the version of the labs' settings
# it acknowledged. What each lab asks of it is that lab's row in ``fault_proxy_labs``.
#
# Any lab's arming bumps ``version`` (webapp/store/faultproxies.py); the proxy process
# (``python -m webapp.faultproxy``, maybe in another container) reads every lab's row and
# acknowledges the version it read in ``seen_version``.
fault_proxies = Table(
    "fault_proxies", metadata,
    Column("name", String(64), primary_key=True),
    Column("version", BigInteger, default=0, server_default="0", nullable=False),  # bumped by each setting
    # Reported by the proxy.
    Column("seen_version", BigInteger, default=0, server_default="0", nullable=False),
    Column("listen", String(128)),
    Column("upstream", String(128)),
    Column("host", String(128)),
    Column("pid", Integer()),
    Column("started_at", DateTime()),
    Column("heartbeat_at", DateTime()),
    # The whole proxy's traffic, every client's (a lab reads only its own row's counters).
    *traffic_counters("connections", "produce_requests", "responses_dropped", "responses_delayed", "connections_cut",
                      "commits_blocked"),
    schema=CONTROL_SCHEMA,
)


# One lab's faults at one fault proxy: they act only on requests whose Kafka client
# id names that lab (``Lab.of_client_id``), and only that lab reads or changes them.
#
# Written by the lab's operations (arm_fault_proxy, block_commits, chaos's cuts); the proxy
# reports the lab's counters here and writes its injected faults to the lab's timeline.
fault_proxy_labs = Table(
    "fault_proxy_labs", metadata,
    Column("proxy", String(64), primary_key=True),
    Column("lab", String(32), primary_key=True),
    # Desired.
    Column("drop_produce_responses", Integer(), default=0, server_default="0", nullable=False),  # left to drop
    Column("delay_ms", Integer(), default=0, server_default="0", nullable=False),
    Column("armed_at", DateTime()),
    # Commit mode: {Kafka client id of one of the lab's consumers: until when, epoch
    # seconds}; the proxy closes any connection of such a client that carries an OffsetCommit.
    Column("blocked_commits", JSONB, default=dict, server_default="{}", nullable=False),
    # Chaos: cut the broker connections of these client ids of the lab once per bump of cut_version.
    Column("cut_version", BigInteger, default=0, server_default="0", nullable=False),
    Column("cut_client_ids", JSONB, default=list, server_default="[]", nullable=False),
    # Reported by the proxy: the lab's clients only.
    Column("seen_cut_version", BigInteger, default=0, server_default="0", nullable=False),
    # The blocked clients that had a connection through the proxy when it took the lab's last setting.
    Column("blocked_seen", JSONB, default=list, server_default="[]", nullable=False),
    *traffic_counters("connections", "produce_requests", "responses_dropped", "responses_delayed", "commits_blocked",
                      "connections_cut"),
    schema=CONTROL_SCHEMA,
)


# A chaos session on one group: seeded random kills, freezes, restarts, session
# terminations and broker connection cuts, carried out by the agent that runs it. Each action
# goes to the lab's timeline (kind ``chaos``) with the seed and its index.
chaos_sessions = Table(
    "chaos_sessions", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("lab", String(32), index=True, nullable=False),
    Column("group_id", String(128), nullable=False),
    Column("seed", BigInteger, nullable=False),
    Column("every_seconds", Double(), nullable=False),
    Column("actions", JSONB, default=list, server_default="[]", nullable=False),
    Column("down_seconds", Double(), nullable=False),
    Column("max_actions", Integer()),
    Column("agent_id", String(128)),
    Column("status", String(16), default="running", server_default="running", nullable=False),  # running|stopping|stopped
    Column("actions_done", Integer(), default=0, server_default="0", nullable=False),
    Column("last_action", Text),
    Column("stop_reason", Text),
    Column("started_at", DateTime(), server_default=func.now(), nullable=False),
    Column("stopped_at", DateTime()),
    schema=CONTROL_SCHEMA,
)


# The explorer's runs (webapp/explorer): one row per exploration of a lab, written by the request that
# queues it, by its process as it searches (progress, the cancel it reads) and by the agent that
# watches that process (how it ended when it dies). At most one queued or running per lab.
explorations = Table(
    "explorations", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("lab", String(32), index=True, nullable=False),
    Column("strategy", String(64)),  # the target: a strategy, or a lane (a learner's own consumer)
    Column("lane", String(64)),
    Column("budget_runs", Integer()),
    Column("budget_minutes", Double()),
    Column("seed", BigInteger, nullable=False),
    Column("faults", JSONB),  # the fault kinds its schedules may use, a list; NULL: every kind
    # queued | running | found | nothing-found | cancelled | failed
    Column("state", String(16), default="queued", server_default="queued", nullable=False),
    Column("phase", String(32)),
    Column("runs_done", Integer(), default=0, server_default="0", nullable=False),
    Column("schedule_length", Integer()),
    Column("result", JSONB),  # Exploration.to_dict(): the scenario YAML, why, reproduced K of N, tried
    Column("error", Text),  # why it failed or was cancelled
    Column("cancel_requested", Boolean(), default=False, server_default="false", nullable=False),
    Column("agent_id", String(128)),
    Column("pid", Integer()),
    Column("created_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
    Column("started_at", DateTime(timezone=True)),
    Column("updated_at", DateTime(timezone=True), server_default=func.now(), nullable=False),
    Column("finished_at", DateTime(timezone=True)),
    # One exploration at a time per lab: a second insert while one is queued or running fails here,
    # even when two requests race.
    Index("ux_lab_control_explorations_active", "lab", unique=True,
          postgresql_where=text("state IN ('queued', 'running')")),
    schema=CONTROL_SCHEMA,
)

# Record and replay: every operation performed on the lab, in order, with what the lab
# looked like just before it (the wait a replay repeats) and what it returned.
session_log = Table(
    "session_log", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("at", DateTime(), server_default=func.now(), nullable=False),
    Column("operation", String(40), nullable=False),
    Column("args", JSONB, default=dict, server_default="{}", nullable=False),
    Column("before", JSONB, default=dict, server_default="{}", nullable=False),
    Column("result", JSONB, default=dict, server_default="{}", nullable=False),
)


# A guided scenario run: which step it is at and what each step observed, kept across reloads.
scenario_runs = Table(
    "scenario_runs", metadata,
    Column("id", BigInteger, primary_key=True),
    Column("scenario", String(120), nullable=False),
    Column("lab", String(32), nullable=False),
    Column("status", String(16), default="ready", server_default="ready", nullable=False),
    Column("progress", JSONB, default=dict, server_default="{}", nullable=False),
    Column("busy", Boolean(), default=False, server_default="false", nullable=False),
    Column("created_at", DateTime(), server_default=func.now(), nullable=False),
    Column("updated_at", DateTime(), server_default=func.now(), nullable=False),
    schema=CONTROL_SCHEMA,
)


# Classroom mode: one attendee of a class and the lab that is theirs (joined through /join).
# ``name_key`` is the name casefolded (unique in the class: ``Ana`` and ``ANA`` are one attendee);
# ``rejoin_hash`` a salted hash of their rejoin code (store/classroom.py), never the code.
attendees = Table(
    "attendees", metadata,
    Column("id", Integer(), primary_key=True),
    Column("class_code", String(64), server_default="", nullable=False),
    Column("name", String(64), nullable=False),
    Column("name_key", String(64), nullable=False),
    Column("rejoin_hash", String(160)),
    Column("lab", String(32), unique=True, nullable=False),
    Column("joined_at", DateTime(), server_default=func.now(), nullable=False),
    Column("seen_at", DateTime(), server_default=func.now(), nullable=False),
    # Bumped when the attendee leaves or is handed over: every browser session signed in under an
    # earlier value is signed out at its next request or pushed event (web/access.py).
    Column("session_generation", Integer(), server_default="0", nullable=False),
    Index("attendees_class_name_key", "class_code", "name_key", unique=True),
    schema=CONTROL_SCHEMA,
)


def lab_tables():
    return [table for table in metadata.sorted_tables if table.schema is None]


def control_tables():
    return [table for table in metadata.sorted_tables if table.schema == CONTROL_SCHEMA]
