"""Revision 4: the notification service's tables and the group's notify settings.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01

- every lab schema: consumer_groups: new columns notify, notify_idempotency_key
- every lab schema: notifications: new table (every request the notification service received)
- every lab schema: idempotency_keys: new table (the service's first response per Idempotency-Key)
- every lab schema: notifications_sent: new table (every call the consumers made)

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

LAB = [
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS notify VARCHAR(16) DEFAULT 'off' NOT NULL""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS notify_idempotency_key BOOLEAN DEFAULT 'false' NOT NULL""",
    """CREATE TABLE IF NOT EXISTS notifications (
    id BIGSERIAL NOT NULL,
    account_id VARCHAR(32) NOT NULL,
    event_id UUID NOT NULL,
    amount_cents BIGINT NOT NULL,
    text TEXT NOT NULL,
    idempotency_key TEXT,
    replayed BOOLEAN DEFAULT 'false' NOT NULL,
    received_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
    """CREATE INDEX IF NOT EXISTS notifications_account_event ON notifications (account_id, event_id)""",
    """CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status INTEGER NOT NULL,
    body JSONB NOT NULL,
    replays INTEGER DEFAULT '0' NOT NULL,
    created_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (key)
)""",
    """CREATE TABLE IF NOT EXISTS notifications_sent (
    id BIGSERIAL NOT NULL,
    group_id VARCHAR(128) NOT NULL,
    consumer VARCHAR(64) NOT NULL,
    generation INTEGER NOT NULL,
    event_id UUID NOT NULL,
    account_id VARCHAR(32) NOT NULL,
    mode VARCHAR(16) NOT NULL,
    idempotency_key TEXT,
    status INTEGER NOT NULL,
    replayed BOOLEAN DEFAULT 'false' NOT NULL,
    sent_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
