"""Revision 18: group health and recovery.

Revision ID: 0018
Revises: 0014
Create Date: 2026-12-04

- ``lab_control.consumers``: ``assigned_at`` (when the consumer's reported assignment last changed,
  or its process started or ended) and ``progressed_at`` (when its reported position last moved):
  the clocks of a group's health (domain/group_health.py);
- every lab schema: ``consumer_groups``: ``kafka_group_id`` (the Kafka group id its members join:
  NULL for the group's own id, a fresh one after a recovery moved the group), ``recovery_started_at``,
  and ``health`` / ``health_since`` (the last health transition written to the timeline, so each is
  written once).

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.connection import CONTROL_SCHEMA
from webapp.store.migrations import for_each_lab_schema

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

LAB = [
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS kafka_group_id VARCHAR(160)""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS recovery_started_at TIMESTAMP WITH TIME ZONE""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS health VARCHAR(16)""",
    """ALTER TABLE consumer_groups ADD COLUMN IF NOT EXISTS health_since TIMESTAMP WITH TIME ZONE""",
]


def upgrade() -> None:
    conn = op.get_bind()
    for column in ("assigned_at", "progressed_at"):
        conn.exec_driver_sql(f"ALTER TABLE {CONTROL_SCHEMA}.consumers "
                             f"ADD COLUMN IF NOT EXISTS {column} TIMESTAMP WITH TIME ZONE")
    for_each_lab_schema(conn, LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
