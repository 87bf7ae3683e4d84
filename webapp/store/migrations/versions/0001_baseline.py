"""Baseline: the schema of the release before migrations, exactly as its models created it.

Revision ID: 0001
Revises:
Create Date: 2026-12-01

A database of that release is stamped here without running this; a database that starts with
no tables at all is created at head from the models. So this runs only when someone upgrades an
empty database from base; ``IF NOT EXISTS`` keeps it harmless on one that has the tables. The
statements are frozen: never regenerate them from the models.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema, run_control

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

CONTROL = [
    """CREATE TABLE IF NOT EXISTS lab_control.agents (
    id VARCHAR(128) NOT NULL,
    host VARCHAR(128) NOT NULL,
    pid INTEGER NOT NULL,
    started_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    heartbeat_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    kafka_ok BOOLEAN DEFAULT 'false' NOT NULL,
    kafka_error TEXT,
    PRIMARY KEY (id)
)""",
    """CREATE TABLE IF NOT EXISTS lab_control.commands (
    id BIGSERIAL NOT NULL,
    lab VARCHAR(32) NOT NULL,
    verb VARCHAR(32) NOT NULL,
    args JSONB DEFAULT '{}' NOT NULL,
    agent_id VARCHAR(128),
    status VARCHAR(16) DEFAULT 'pending' NOT NULL,
    result JSONB,
    error TEXT,
    created_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    finished_at TIMESTAMP WITHOUT TIME ZONE,
    PRIMARY KEY (id)
)""",
    """CREATE TABLE IF NOT EXISTS lab_control.consumers (
    id SERIAL NOT NULL,
    lab VARCHAR(32) NOT NULL,
    name VARCHAR(64) NOT NULL,
    group_id VARCHAR(128) NOT NULL,
    agent_id VARCHAR(128),
    pid INTEGER,
    state VARCHAR(24) DEFAULT 'starting' NOT NULL,
    armed_point VARCHAR(40),
    armed_action VARCHAR(16),
    armed_always BOOLEAN DEFAULT 'false' NOT NULL,
    step_mode BOOLEAN DEFAULT 'false' NOT NULL,
    step_advance INTEGER DEFAULT '0' NOT NULL,
    step_at VARCHAR(40),
    assigned JSONB DEFAULT '[]' NOT NULL,
    positions JSONB DEFAULT '{}' NOT NULL,
    applied_positions JSONB DEFAULT '{}' NOT NULL,
    generation INTEGER DEFAULT '0' NOT NULL,
    applied INTEGER DEFAULT '0' NOT NULL,
    absorbed INTEGER DEFAULT '0' NOT NULL,
    dead_lettered INTEGER DEFAULT '0' NOT NULL,
    commit_failures INTEGER DEFAULT '0' NOT NULL,
    last_error TEXT,
    exit_code INTEGER,
    started_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    heartbeat_at TIMESTAMP WITHOUT TIME ZONE,
    PRIMARY KEY (id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_lab_control_consumers_lab ON lab_control.consumers (lab)""",
    """CREATE TABLE IF NOT EXISTS lab_control.fault_proxies (
    name VARCHAR(64) NOT NULL,
    lab VARCHAR(32),
    drop_produce_responses INTEGER DEFAULT '0' NOT NULL,
    delay_ms INTEGER DEFAULT '0' NOT NULL,
    version BIGINT DEFAULT '0' NOT NULL,
    armed_at TIMESTAMP WITHOUT TIME ZONE,
    seen_version BIGINT DEFAULT '0' NOT NULL,
    listen VARCHAR(128),
    upstream VARCHAR(128),
    host VARCHAR(128),
    pid INTEGER,
    started_at TIMESTAMP WITHOUT TIME ZONE,
    heartbeat_at TIMESTAMP WITHOUT TIME ZONE,
    connections INTEGER DEFAULT '0' NOT NULL,
    produce_requests BIGINT DEFAULT '0' NOT NULL,
    responses_dropped BIGINT DEFAULT '0' NOT NULL,
    responses_delayed BIGINT DEFAULT '0' NOT NULL,
    PRIMARY KEY (name)
)""",
    """CREATE TABLE IF NOT EXISTS lab_control.scenario_runs (
    id BIGSERIAL NOT NULL,
    scenario VARCHAR(120) NOT NULL,
    lab VARCHAR(32) NOT NULL,
    status VARCHAR(16) DEFAULT 'ready' NOT NULL,
    progress JSONB DEFAULT '{}' NOT NULL,
    busy BOOLEAN DEFAULT 'false' NOT NULL,
    created_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    updated_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
]
LAB = [
    """CREATE TABLE IF NOT EXISTS accounts (
    id VARCHAR(32) NOT NULL,
    owner VARCHAR(80) NOT NULL,
    balance BIGINT DEFAULT '0' NOT NULL,
    status VARCHAR(32) DEFAULT 'ACTIVE' NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE TABLE IF NOT EXISTS consumer_groups (
    group_id VARCHAR(128) NOT NULL,
    strategy VARCHAR(24) NOT NULL,
    effects_schema VARCHAR(63) NOT NULL,
    created_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (group_id)
)""",
    """CREATE TABLE IF NOT EXISTS deliveries (
    id BIGSERIAL NOT NULL,
    group_id VARCHAR(128) NOT NULL,
    consumer VARCHAR(64) NOT NULL,
    partition INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    generation INTEGER NOT NULL,
    attempt INTEGER NOT NULL,
    event_id UUID,
    transaction_id VARCHAR(64),
    strategy VARCHAR(24) NOT NULL,
    outcome VARCHAR(24) NOT NULL,
    reason TEXT,
    delivered_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE INDEX IF NOT EXISTS deliveries_delivered_at ON deliveries (delivered_at)""",
    """CREATE INDEX IF NOT EXISTS deliveries_group_partition_offset ON deliveries (group_id, partition, "offset")""",
    """CREATE INDEX IF NOT EXISTS deliveries_outcome ON deliveries (outcome)""",
    """CREATE INDEX IF NOT EXISTS deliveries_partition_offset ON deliveries (partition, "offset")""",
    """CREATE INDEX IF NOT EXISTS ix_deliveries_event_id ON deliveries (event_id)""",
    """CREATE TABLE IF NOT EXISTS group_offsets (
    group_id VARCHAR(128) NOT NULL,
    partition INTEGER NOT NULL,
    committed BIGINT,
    read_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (group_id, partition)
)""",
    """CREATE TABLE IF NOT EXISTS processed_events (
    event_id UUID NOT NULL,
    processed_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (event_id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_processed_events_processed_at ON processed_events (processed_at)""",
    """CREATE TABLE IF NOT EXISTS processed_transactions (
    transaction_id VARCHAR(64) NOT NULL,
    processed_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (transaction_id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_processed_transactions_processed_at ON processed_transactions (processed_at)""",
    """CREATE TABLE IF NOT EXISTS published_events (
    id BIGSERIAL NOT NULL,
    event_id UUID,
    transaction_id VARCHAR(64),
    type VARCHAR(16),
    account_id VARCHAR(32),
    amount_cents BIGINT,
    status VARCHAR(32),
    mode VARCHAR(24) NOT NULL,
    idempotent_producer BOOLEAN NOT NULL,
    partition INTEGER,
    "offset" BIGINT,
    error TEXT,
    payload TEXT NOT NULL,
    published_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_published_events_event_id ON published_events (event_id)""",
    """CREATE INDEX IF NOT EXISTS ix_published_events_transaction_id ON published_events (transaction_id)""",
    """CREATE INDEX IF NOT EXISTS published_events_partition_offset ON published_events (partition, "offset")""",
    """CREATE INDEX IF NOT EXISTS published_events_truth ON published_events (transaction_id, id) INCLUDE (account_id, amount_cents, published_at) WHERE type = 'credit' AND error IS NULL""",
    """CREATE TABLE IF NOT EXISTS session_log (
    id BIGSERIAL NOT NULL,
    at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    operation VARCHAR(40) NOT NULL,
    args JSONB DEFAULT '{}' NOT NULL,
    before JSONB DEFAULT '{}' NOT NULL,
    result JSONB DEFAULT '{}' NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE TABLE IF NOT EXISTS settings (
    key VARCHAR(64) NOT NULL,
    value JSONB NOT NULL,
    PRIMARY KEY (key)
)""",
    """CREATE TABLE IF NOT EXISTS timeline (
    id BIGSERIAL NOT NULL,
    at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    kind VARCHAR(32) NOT NULL,
    summary TEXT NOT NULL,
    detail JSONB DEFAULT '{}' NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_timeline_at ON timeline (at)""",
    """CREATE TABLE IF NOT EXISTS ledger (
    event_id UUID NOT NULL,
    account_id VARCHAR(32) NOT NULL,
    amount_cents BIGINT NOT NULL,
    recorded_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (event_id),
    FOREIGN KEY(account_id) REFERENCES accounts (id)
)""",
    """CREATE TABLE IF NOT EXISTS payments (
    id BIGSERIAL NOT NULL,
    event_id UUID NOT NULL,
    transaction_id VARCHAR(64) NOT NULL,
    account_id VARCHAR(32) NOT NULL,
    amount_cents BIGINT NOT NULL,
    applied_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id),
    FOREIGN KEY(account_id) REFERENCES accounts (id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_payments_event_id ON payments (event_id)""",
    """CREATE INDEX IF NOT EXISTS ix_payments_transaction_id ON payments (transaction_id)""",
]


def upgrade() -> None:
    conn = op.get_bind()
    conn.exec_driver_sql('CREATE SCHEMA IF NOT EXISTS "lab_control"')
    run_control(conn, CONTROL)
    for_each_lab_schema(conn, LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
