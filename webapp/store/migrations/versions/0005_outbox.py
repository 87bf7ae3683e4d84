"""Revision 5: the payments service's outbox and the relay's state.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

- every lab schema: source_payments: new table (the payments service's own payments; a
  transaction id once)
- every lab schema: outbox: new table (event id once, key, payload as published, published_at,
  attempts), with the partial index of unsent rows the relay scans
- every lab schema: outbox_publishes: new table (each publish by the relay, with its report)
- every lab schema: relay_state: new table (one row: the relay's armed fault and its report)

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

LAB = [
    """CREATE TABLE IF NOT EXISTS source_payments (
    id BIGSERIAL NOT NULL,
    transaction_id VARCHAR(64) NOT NULL,
    event_id UUID NOT NULL,
    account_id VARCHAR(32) NOT NULL,
    amount_cents BIGINT NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id),
    UNIQUE (transaction_id)
)""",
    """CREATE TABLE IF NOT EXISTS outbox (
    id BIGSERIAL NOT NULL,
    event_id UUID NOT NULL,
    key TEXT NOT NULL,
    payload TEXT NOT NULL,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    published_at TIMESTAMP WITH TIME ZONE,
    attempts INTEGER DEFAULT '0' NOT NULL,
    PRIMARY KEY (id),
    UNIQUE (event_id)
)""",
    """CREATE INDEX IF NOT EXISTS outbox_unsent ON outbox (id) WHERE published_at IS NULL""",
    """CREATE TABLE IF NOT EXISTS outbox_publishes (
    id BIGSERIAL NOT NULL,
    outbox_id BIGINT NOT NULL,
    event_id UUID NOT NULL,
    attempt INTEGER NOT NULL,
    partition INTEGER,
    "offset" BIGINT,
    pid INTEGER NOT NULL,
    published_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE INDEX IF NOT EXISTS ix_outbox_publishes_event_id ON outbox_publishes (event_id)""",
    """CREATE TABLE IF NOT EXISTS relay_state (
    id INTEGER NOT NULL,
    armed_point VARCHAR(40),
    armed_always BOOLEAN DEFAULT 'false' NOT NULL,
    agent_id VARCHAR(128),
    pid INTEGER,
    state VARCHAR(16) DEFAULT 'wanted' NOT NULL,
    starts INTEGER DEFAULT '0' NOT NULL,
    published BIGINT DEFAULT '0' NOT NULL,
    republished BIGINT DEFAULT '0' NOT NULL,
    last_event_id UUID,
    last_published_at TIMESTAMP WITH TIME ZONE,
    crashed_at VARCHAR(40),
    last_error TEXT,
    heartbeat_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id)
)""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
