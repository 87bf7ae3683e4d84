"""Revision 3: the key table of the ``payload-hash`` strategy, in every lab schema.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01

- every lab schema: processed_payloads: new table (payload_hash, processed_at), with the
  processed_at index the TTL cleanup and the dedup panel range over

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

LAB = [
    """CREATE TABLE IF NOT EXISTS processed_payloads (
    payload_hash TEXT NOT NULL,
    processed_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (payload_hash)
)""",
    """CREATE INDEX IF NOT EXISTS ix_processed_payloads_processed_at ON processed_payloads (processed_at)""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
