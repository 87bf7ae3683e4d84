"""Revision 26: an audit trail beside a set (the natural-audit strategies, exercise 26).

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-06

- every lab schema: ``audit_events`` (one row per status a set applied: its own ``id``, the event's
  ``event_id`` and ``transaction_id``, the account, what was set, when it was recorded). Its primary
  key is the lesson: a new id per execution doubles on a redelivery, the event's id does not;
  with the live panels' change trigger every lab table has (store/lab_changes.py).

Frozen: a later change gets a revision of its own.
"""
from alembic import op

from webapp.store.lab_changes import lab_trigger_ddl
from webapp.store.migrations import for_each_lab_schema

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

LAB = [
    """CREATE TABLE IF NOT EXISTS audit_events (
    id UUID NOT NULL,
    event_id UUID NOT NULL,
    transaction_id VARCHAR(64) NOT NULL,
    account_id VARCHAR(32) NOT NULL,
    action TEXT NOT NULL,
    recorded_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id)
)""",
    "CREATE INDEX IF NOT EXISTS ix_audit_events_event_id ON audit_events (event_id)",
    "CREATE INDEX IF NOT EXISTS ix_audit_events_transaction_id ON audit_events (transaction_id)",
]


def upgrade() -> None:
    conn = op.get_bind()
    for schema in for_each_lab_schema(conn, LAB):
        for statement in lab_trigger_ddl(schema, {"audit_events"}):
            conn.exec_driver_sql(statement)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
