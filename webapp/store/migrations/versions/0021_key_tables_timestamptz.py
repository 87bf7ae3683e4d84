"""Revision 21: the key tables' processed_at is TIMESTAMPTZ, as in the source text's DDL.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-03

- every lab schema: processed_events, processed_transactions, processed_payloads, seen_events:
  ``processed_at`` TIMESTAMP WITH TIME ZONE (source text 000: ``processed_at TIMESTAMPTZ NOT NULL
  DEFAULT now()``). The values were written by ``now()`` in the session's time zone, which the
  conversion reads them in; with the session in UTC PostgreSQL converts without rewriting the table.
  A partitioned processed_events passes the change to its day partitions.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

KEY_TABLES = ("processed_events", "processed_transactions", "processed_payloads", "seen_events")
LAB = [f"ALTER TABLE {table} ALTER COLUMN processed_at TYPE TIMESTAMP WITH TIME ZONE" for table in KEY_TABLES]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
