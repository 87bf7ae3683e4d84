"""Revision 8: the load generator and dedup tables at scale.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

- every lab schema: load_runs: new table (the load generator's runs and their progress)
- every lab schema: dedup_scale: new table (per dedup table: rows, sizes, sampled key-insert
  latency, the last TTL cleanup's duration)

The partitioned layout of ``processed_events`` is not a migration: it is a lab setting that
converts the table when asked (webapp/strategies/dedup_layout.py); every schema starts plain.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

LAB = [
    """CREATE TABLE IF NOT EXISTS dedup_scale (
    table_name VARCHAR(63) NOT NULL,
    rows BIGINT,
    rows_estimated BOOLEAN DEFAULT 'false' NOT NULL,
    table_bytes BIGINT,
    index_bytes BIGINT,
    insert_p50_ms DOUBLE PRECISION,
    insert_p99_ms DOUBLE PRECISION,
    insert_samples INTEGER DEFAULT '0' NOT NULL,
    sampled_at TIMESTAMP WITHOUT TIME ZONE,
    cleanup_ms DOUBLE PRECISION,
    cleanup_method VARCHAR(24),
    cleanup_removed BIGINT,
    cleanup_at TIMESTAMP WITHOUT TIME ZONE,
    PRIMARY KEY (table_name)
)""",
    """CREATE TABLE IF NOT EXISTS load_runs (
    id BIGSERIAL NOT NULL,
    events BIGINT NOT NULL,
    accounts INTEGER NOT NULL,
    rate_per_second INTEGER NOT NULL,
    resend_ratio DOUBLE PRECISION NOT NULL,
    source_duplicate_ratio DOUBLE PRECISION NOT NULL,
    seed BIGINT NOT NULL,
    state VARCHAR(16) DEFAULT 'starting' NOT NULL,
    sent BIGINT DEFAULT '0' NOT NULL,
    resends BIGINT DEFAULT '0' NOT NULL,
    source_duplicates BIGINT DEFAULT '0' NOT NULL,
    failed BIGINT DEFAULT '0' NOT NULL,
    rate DOUBLE PRECISION DEFAULT '0' NOT NULL,
    cancel_requested BOOLEAN DEFAULT 'false' NOT NULL,
    error TEXT,
    started_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    updated_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    finished_at TIMESTAMP WITHOUT TIME ZONE,
    PRIMARY KEY (id)
)""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
