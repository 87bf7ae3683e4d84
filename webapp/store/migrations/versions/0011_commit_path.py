"""Revision 11: offset commits that do not reach the broker (commit mode).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

- lab_control.fault_proxies: blocked_commits (Kafka client id -> until when, epoch seconds of the
  database's clock): the fault proxy closes any connection of such a client that carries an
  OffsetCommit request, before the request reaches the broker; commits_blocked counts them;
  blocked_seen: which of those clients had a connection through the proxy when it took the
  setting (a client that goes straight to the broker cannot be blocked, and the lab says so)

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import run_control

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

CONTROL = [
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS blocked_commits JSONB DEFAULT '{}' NOT NULL",
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS commits_blocked BIGINT DEFAULT '0' NOT NULL",
    "ALTER TABLE lab_control.fault_proxies ADD COLUMN IF NOT EXISTS blocked_seen JSONB DEFAULT '[]' NOT NULL",
]


def upgrade() -> None:
    run_control(op.get_bind(), CONTROL)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
