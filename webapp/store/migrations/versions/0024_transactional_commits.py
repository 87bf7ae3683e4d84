"""Revision 24: a third commit mode, ``transactional`` (Kafka's transactions stop at the
Kafka boundary).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-05

- every lab schema: ``consumer_groups.commit_mode`` widened from VARCHAR(8) to VARCHAR(16), to hold
  ``transactional`` (the consumer's offsets committed in a Kafka transaction).

Frozen: a later change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

LAB = [
    """ALTER TABLE consumer_groups ALTER COLUMN commit_mode TYPE VARCHAR(16)""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
