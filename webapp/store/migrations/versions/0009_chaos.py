"""Revision 9: chaos sessions.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

- lab_control.chaos_sessions: new table, one row per chaos session (its group, seed, rate,
  actions, the agent that runs it, how far it got)
- lab_control.fault_proxies: cut_version, cut_client_ids, seen_cut_version, connections_cut: the
  chaos action that cuts the broker connections of named Kafka clients through the fault proxy

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import run_control

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

CONTROL = [
    """CREATE TABLE IF NOT EXISTS lab_control.chaos_sessions (
    id BIGSERIAL NOT NULL,
    lab VARCHAR(32) NOT NULL,
    group_id VARCHAR(128) NOT NULL,
    seed BIGINT NOT NULL,
    every_seconds FLOAT NOT NULL,
    actions JSONB DEFAULT '[]' NOT NULL,
    down_seconds FLOAT NOT NULL,
    max_actions INTEGER,
    agent_id VARCHAR(128),
    status VARCHAR(16) DEFAULT 'running' NOT NULL,
    actions_done INTEGER DEFAULT '0' NOT NULL,
    last_action TEXT,
    stop_reason TEXT,
    started_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    stopped_at TIMESTAMP WITHOUT TIME ZONE,
    PRIMARY KEY (id)
)""",
    "CREATE INDEX IF NOT EXISTS ix_lab_control_chaos_sessions_lab ON lab_control.chaos_sessions (lab)",
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS cut_version BIGINT DEFAULT '0' NOT NULL",
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS cut_client_ids JSONB DEFAULT '[]' NOT NULL",
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS seen_cut_version BIGINT DEFAULT '0' NOT NULL",
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS connections_cut BIGINT DEFAULT '0' NOT NULL",
]


def upgrade() -> None:
    run_control(op.get_bind(), CONTROL)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
