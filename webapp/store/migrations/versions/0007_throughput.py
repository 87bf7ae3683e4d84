"""Revision 7: batch mode, commit mode and static membership settings.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

- every lab schema: consumer_groups: new columns batch_size (1: per-message mode),
  batch_max_wait_ms, commit_mode (sync | async), static_membership

Written from `python -m webapp.store.migrations.check DATABASE_URL`; frozen: a later model change gets
a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

LAB = [
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS batch_size INTEGER DEFAULT '1' NOT NULL""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS batch_max_wait_ms INTEGER DEFAULT '100' NOT NULL""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS commit_mode VARCHAR(8) DEFAULT 'sync' NOT NULL""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS static_membership BOOLEAN DEFAULT 'false' NOT NULL""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
