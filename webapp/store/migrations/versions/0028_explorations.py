"""Revision 28: the explorer's runs.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-06

- lab_control.explorations: new table, one row per exploration of a lab (its target, budget and
  seed, its state and progress, its result, the cancel it reads, the agent and process running it);
  a partial unique index holds a lab to one queued or running exploration.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import run_control

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

CONTROL = [
    """CREATE TABLE IF NOT EXISTS lab_control.explorations (
    id BIGSERIAL NOT NULL,
    lab VARCHAR(32) NOT NULL,
    strategy VARCHAR(64),
    lane VARCHAR(64),
    budget_runs INTEGER,
    budget_minutes FLOAT,
    seed BIGINT NOT NULL,
    state VARCHAR(16) DEFAULT 'queued' NOT NULL,
    phase VARCHAR(32),
    runs_done INTEGER DEFAULT '0' NOT NULL,
    schedule_length INTEGER,
    result JSONB,
    error TEXT,
    cancel_requested BOOLEAN DEFAULT 'false' NOT NULL,
    agent_id VARCHAR(128),
    pid INTEGER,
    created_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    started_at TIMESTAMP WITH TIME ZONE,
    updated_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    finished_at TIMESTAMP WITH TIME ZONE,
    PRIMARY KEY (id)
)""",
    "CREATE INDEX IF NOT EXISTS ix_lab_control_explorations_lab ON lab_control.explorations (lab)",
    "CREATE UNIQUE INDEX IF NOT EXISTS ux_lab_control_explorations_active ON lab_control.explorations (lab) "
    "WHERE state IN ('queued', 'running')",
]


def upgrade() -> None:
    run_control(op.get_bind(), CONTROL)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
