"""Revision 2: what the models gained in the issue-10 rework (agent leases, strategies' columns
and tables, the log mirror), added with IF NOT EXISTS.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01

- lab_control.commands: new columns claimed_by, lease_expires_at
- every lab schema: accounts: new columns status_at, balance_at
- every lab schema: consumer_groups: new columns on_unique_violation
- every lab schema: log_records: new table
- every lab schema: seen_events: new table
- every lab schema: scores: new table

Written from `python -m webapp.store.migrations.check DATABASE_URL` (a baseline database upgraded
to 0001 against the models); frozen now: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema, run_control

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

CONTROL = [
    """ALTER TABLE lab_control.commands ADD COLUMN IF NOT EXISTS claimed_by VARCHAR(128)""",
    """ALTER TABLE lab_control.commands ADD COLUMN IF NOT EXISTS lease_expires_at TIMESTAMP WITH TIME ZONE""",
]
LAB = [
    """ALTER TABLE accounts ADD COLUMN IF NOT EXISTS status_at TIMESTAMP WITH TIME ZONE""",
    """ALTER TABLE accounts ADD COLUMN IF NOT EXISTS balance_at TIMESTAMP WITH TIME ZONE""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS on_unique_violation VARCHAR(24) DEFAULT 'already-processed' NOT NULL""",
    """CREATE TABLE IF NOT EXISTS log_records (
    partition INTEGER NOT NULL,
    "offset" BIGINT NOT NULL,
    timestamp TIMESTAMP WITH TIME ZONE,
    key TEXT,
    headers JSONB DEFAULT '[]' NOT NULL,
    value TEXT,
    event_id UUID,
    transaction_id VARCHAR(64),
    type VARCHAR(16),
    account_id VARCHAR(32),
    amount_cents BIGINT,
    status VARCHAR(32),
    balance_cents BIGINT,
    score BIGINT,
    occurred_at TEXT,
    invalid_reason TEXT,
    first_of_transaction BOOLEAN DEFAULT 'false' NOT NULL,
    read_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (partition, "offset")
)""",
    """CREATE INDEX IF NOT EXISTS log_records_event_id ON log_records (event_id)""",
    """CREATE INDEX IF NOT EXISTS log_records_firsts ON log_records (account_id, type) INCLUDE (partition, "offset", amount_cents, status, balance_cents, score, read_at) WHERE first_of_transaction""",
    """CREATE INDEX IF NOT EXISTS log_records_read_at ON log_records (read_at)""",
    """CREATE INDEX IF NOT EXISTS log_records_truth ON log_records (transaction_id, partition, "offset") WHERE invalid_reason IS NULL""",
    """CREATE TABLE IF NOT EXISTS seen_events (
    event_id UUID NOT NULL,
    processed_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL
)""",
    """CREATE INDEX IF NOT EXISTS ix_seen_events_event_id ON seen_events (event_id)""",
    """CREATE INDEX IF NOT EXISTS ix_seen_events_processed_at ON seen_events (processed_at)""",
    """CREATE TABLE IF NOT EXISTS scores (
    account_id VARCHAR(32) NOT NULL,
    score INTEGER NOT NULL,
    score_at TIMESTAMP WITH TIME ZONE NOT NULL,
    PRIMARY KEY (account_id),
    FOREIGN KEY(account_id) REFERENCES accounts (id)
)""",
]


def upgrade() -> None:
    conn = op.get_bind()
    run_control(conn, CONTROL)
    for_each_lab_schema(conn, LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
