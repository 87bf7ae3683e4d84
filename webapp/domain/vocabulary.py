"""One vocabulary for the whole lab: consumer states, delivery outcomes, crash points, freshness
windows and limits. SQL parameters, templates, the operation registry and tests read them here,
so a limit lives in one place."""
from __future__ import annotations

from enum import StrEnum


class ConsumerState(StrEnum):
    STARTING = "starting"
    RUNNING = "running"
    FROZEN = "frozen"
    STEPPING = "stepping"
    CRASHED = "crashed"
    KILLED = "killed"
    STOPPED = "stopped"
    FAILED = "failed"
    GONE = "gone"          # its agent died: no process answers for it any more


CONSUMER_STATES = tuple(state.value for state in ConsumerState)
# States in which no process runs for the consumer row.
ENDED_STATES = (ConsumerState.CRASHED, ConsumerState.KILLED, ConsumerState.STOPPED, ConsumerState.FAILED,
                ConsumerState.GONE)
LIVE_STATES = tuple(state for state in ConsumerState if state not in ENDED_STATES)


class Outcome(StrEnum):
    """What a delivery did, as the delivery ledger records it."""
    APPLIED = "applied"
    ABSORBED = "absorbed"
    DEAD_LETTERED = "dead-lettered"
    FAILED = "failed"      # an attempt that hit a database error and will be retried (or dead-lettered)


# Crash points in the order a message passes them.
CRASH_POINTS = ("before-effect", "between-check-and-act", "between-key-and-effect",
                "before-notify", "after-notify-before-commit",
                "after-effect-before-commit", "after-commit")
# Where a group's consumers call the notification service for an applied credit (a group setting):
# not at all, inside the effect's transaction before its commit, or after it (before the offset commit).
NOTIFY_MODES = ("off", "before-commit", "after-commit")
FAULT_ACTIONS = ("crash", "freeze")
# The fault kinds the explorer's schedules draw from (webapp/explorer/schedule.py says what each does).
EXPLORER_FAULT_KINDS = ("crash", "resend", "restart", "freeze-join", "kill", "join", "async-commit",
                        "source-duplicate")
# The strategies whose dedup key is the transaction, not the event id: the only ones a source duplicate
# (the same transaction under a new event id) is judged against; to the others it is a new event.
EXPLORER_SOURCE_DUPLICATE_STRATEGIES = ("business-key", "payload-hash")
# Crash points of the outbox relay (webapp/outbox): before it produces a batch of unsent rows, and
# after their delivery reports, before the transaction that marks them sent.
RELAY_CRASH_POINTS = ("relay-before-publish", "relay-after-publish-before-mark")
# What a unique violation of a plain key INSERT means to a group (a group setting): the 001 seed's
# "already processed" (absorb, commit the offset), or "retry" (a generic error: retried with
# backoff while the partition stalls, then the DLQ).
ON_UNIQUE_VIOLATION = ("already-processed", "retry")
# How a group's consumers commit offsets: wait for the broker's answer (sync), or not (async: faster,
# and a crash can lose the commits still in flight, so more records come back), or in a Kafka
# transaction of their own (transactional: send_offsets_to_transaction, then commit_transaction;
# Kafka's exactly-once covers the offsets, never the PostgreSQL effect before them).
COMMIT_MODES = ("sync", "async", "transactional")
# "expire": the group's committed offsets deleted, as Kafka does once an empty group has been empty
# for offsets.retention.minutes; its members then start where auto.offset.reset says (earliest here).
OFFSET_RESET_MODES = ("earliest", "offset", "back", "timestamp", "expire")
PUBLISH_MODES = ("normal", "burst", "resend", "source-duplicate", "poison")
# The producer's acks a learner may ask for: the lab's own is "all"; idempotence requires it.
PRODUCER_ACKS = ("all", "1", "0")

# Freshness: a heartbeat older than this says the process is gone.
AGENT_FRESH_SECONDS = 5.0
CONSUMER_FRESH_SECONDS = 5.0
FAULT_PROXY_FRESH_SECONDS = 5.0
# The parts a lab depends on, shown down within 5 s of going down (readmodel/service_health.py):
# the log reader and the notification service beat every SERVICE_BEAT_SECONDS (one UPDATE of one
# row: negligible next to a consumer's), and are down after SERVICE_DOWN_AFTER_SECONDS without a
# beat: three beats missed, so a beat a busy machine delays by two seconds is no false alarm, and
# the dashboard (polling once a second) says so within about four seconds of the last beat.
SERVICE_BEAT_SECONDS = 1.0
SERVICE_DOWN_AFTER_SECONDS = 3.0
FAULT_PROXY_CHANNEL = "lab_fault_proxy"  # the proxy LISTENs here for new settings
LAB_CHANGE_CHANNEL = "lab_change"  # the web processes LISTEN here for any change a panel shows (store/lab_changes.py)
SETTINGS_CHANNEL = "lab_settings"  # consumers LISTEN here for changes of what they apply (store/settings_changes.py)


class Limits:
    """Every bound a person can hit, in one place (forms, API, CLI, scenario files)."""
    PARTITIONS = (1, 12)
    BURST = (1, 10_000)
    AMOUNT_CENTS = (1, 100_000_000)          # R$ 1,000,000.00: a lab, not a bank
    TTL_SECONDS = (0, 90 * 24 * 3600)
    TOPIC_RETENTION_MS = (1000, 90 * 24 * 3600 * 1000)  # a topic's retention.ms and segment.ms
    RESET_BACK = (1, 1_000_000)
    PARTITION_INDEX = (0, 1000)
    OFFSET = (0, 2**62)
    DROPPED_RESPONSES = (0, 100)
    RESPONSE_DELAY_MS = (0, 60_000)
    BLOCKED_COMMITS_SECONDS = (1, 600)     # how long a consumer's offset commits may be kept from the broker
    NAME_LENGTH = 24
    SCORE = (0, 1000)
    SESSION_TIMEOUT_MS = (0, 600_000)     # lock_timeout, idle_in_transaction_session_timeout (0: none)
    RAW_VALUE_BYTES = 512 * 1024           # a raw record's value, as the producer sends it
    RAW_VALUE_CHARACTERS = RAW_VALUE_BYTES // 4   # as typed: every character fits in the bytes
    RAW_HEADERS = 32                       # headers on one raw record
    RAW_HEADER_NAME_CHARACTERS = 256       # a raw record header's name
    RAW_HEADER_VALUE_CHARACTERS = 4096     # a raw record header's value, as typed
    # The producer's max.in.flight.requests.per.connection. Idempotence caps it at 5: above that
    # librdkafka refuses to create an idempotent producer, and the lab shows the refusal.
    MAX_IN_FLIGHT = (1, 10)
    PRODUCER_RETRIES = (0, 10)             # the producer's retries (0: librdkafka refuses idempotence)
    BATCH_SIZE = (1, 5000)                 # records per batch; 1 is per-message mode
    BATCH_MAX_WAIT_MS = (1, 3000)          # how long consume(n) waits to fill a batch (under the 5 s freshness)
    LOAD_EVENTS = (1, 10_000_000)          # the load generator
    LOAD_ACCOUNTS = (1, 10_000)
    LOAD_RATE = (0, 1_000_000)             # events per second; 0: as fast as possible
    LOAD_SEED = (0, 2**31 - 1)
    WARMUP_KEYS = (1, 10_000_000)          # synthetic dedup keys (the dedup-at-scale exercise)
    WARMUP_DAYS = (1, 60)
    CHAOS_SEED = (0, 2**31 - 1)             # chaos mode
    CHAOS_EVERY_SECONDS = (0.2, 3600.0)     # the mean wait between two chaos actions
    CHAOS_DOWN_SECONDS = (0.1, 600.0)       # how long a frozen or killed consumer stays down
    CHAOS_ACTIONS = (1, 1_000_000)          # stop after this many actions


# The tables that remember what was processed, and the key each holds. `seen_events` is
# check-then-act's table: the same key, no unique constraint (the developer trusted the SELECT).
DEDUP_TABLES = {"processed_events": "event_id", "processed_transactions": "transaction_id", "seen_events": "event_id",
                "processed_payloads": "payload_hash"}

# A dedup table's rows are counted exactly while the catalog estimates fewer than this; above, the
# panels show the estimate (pg_class.reltuples, as of the last ANALYZE), marked as one: a count(*)
# over ten million keys takes a second, every refresh.
EXACT_COUNT_BELOW = 100_000

DEFAULT_GROUP = "payments"
DEFAULT_STRATEGY = "none"
# "Your consumer": a group whose consumer is the learner's own code, outside the lab. Its
# row in consumer_groups carries this marker instead of a strategy: no lab consumer may join it.
OUTSIDE_STRATEGY = "yours"
DEFAULT_OUTSIDE_LANE = "mine"
# The only tables a lane's role may touch: what a learner's consumer reads and writes. The verdict's
# summaries, the grade and the lab's own records in the lane's schema are out of its reach.
# The SASL mechanism of Apache Kafka's learners' listener (compose): there the lab creates each lane's
# SCRAM user and ACLs through the admin API; the embedded broker's learners' gateway (PLAIN) reads the
# lane's principal from PostgreSQL itself.
SCRAM_LEARNERS = "SCRAM-SHA-512"
LANE_TABLES = ("accounts", "payments", "processed_events", "processed_transactions")
# Each lane role's session defaults. A role may SET these in its own session (PostgreSQL lets any
# role), so the lab does not rely on them to protect the others: the agent ends a lane session that
# outlives LANE_STATEMENT_SECONDS in one statement or LANE_IDLE_IN_TRANSACTION_SECONDS idle in a
# transaction (agent/periodic.py), the lab's own reads run under their own lock and statement
# timeouts (store/schema.py), and temp_file_limit is a superuser's setting the role cannot change.
LANE_STATEMENT_SECONDS = 30
LANE_IDLE_IN_TRANSACTION_SECONDS = 60
LANE_ROLE_LIMITS = {
    "statement_timeout": f"{LANE_STATEMENT_SECONDS}s",
    "lock_timeout": "5s",
    "idle_in_transaction_session_timeout": f"{LANE_IDLE_IN_TRANSACTION_SECONDS}s",
    "temp_file_limit": "16MB",
}
# The lab's own reads of a lab (panels, summaries, the agent's snapshots): a learner's lock on their
# own lane makes their lab's panel say so within READ_LOCK_TIMEOUT, and never holds a connection
# that another lab's reader is waiting for.
READ_LOCK_TIMEOUT = "3s"
READ_STATEMENT_TIMEOUT = "60s"
DEFAULT_TTL_SECONDS = 7 * 24 * 3600

# A sidecar the agent can hold off its work without stopping it (the log reader around a lab's
# drop or reset): the agent passes it the write end of a pipe in this variable; the sidecar writes
# HOLD_READY there once its signal handlers are installed, and HOLD_DONE each time SIGUSR1 has
# held it; SIGUSR2 releases it (webapp/agent/processes.py, Sidecar.held).
HOLD_ACK_FD = "LAB_SIDECAR_ACK_FD"
HOLD_READY, HOLD_DONE = b"r", b"h"

# librdkafka's debug contexts for the consumers, from the environment (the setting LAB_KAFKA_DEBUG).
KAFKA_DEBUG = "LAB_KAFKA_DEBUG"

# The lab agent's pid, in a consumer's environment: its parent is the agent's consumer fork
# server, and the consumer names the agent when it finds itself orphaned.
AGENT_PID = "LAB_AGENT_PID"
