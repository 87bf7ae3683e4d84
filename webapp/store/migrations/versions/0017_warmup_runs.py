"""Revision 17: the dedup warm-up runs on a lab agent, with progress.

Revision ID: 0017
Revises: 0014
Create Date: 2026-12-03

- every lab schema: warmup_runs: new table (a warm-up's keys, days, state and keys inserted so far),
  as load_runs is for the load generator.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

LAB = [
    """CREATE TABLE IF NOT EXISTS warmup_runs (
    id BIGSERIAL NOT NULL,
    keys BIGINT NOT NULL,
    days INTEGER NOT NULL,
    state VARCHAR(16) DEFAULT 'starting' NOT NULL,
    inserted BIGINT DEFAULT '0' NOT NULL,
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
