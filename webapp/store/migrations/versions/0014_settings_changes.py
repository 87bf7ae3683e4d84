"""Revision 14: changes of what a consumer applies are notified, and acknowledged.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02

- ``lab_control.consumers.settings_seen_at``: when the consumer last read its settings;
- the triggers that ``NOTIFY lab_settings`` (webapp/store/settings_changes.py): on the control table's
  fault and step-mode columns and deletes, and on every lab schema's ``consumer_groups`` and
  ``settings``.

A consumer of the release before keeps reading its settings before every record, and works on.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.connection import CONTROL_SCHEMA
from webapp.store.migrations import all_lab_schemas

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # The triggers as this release defines them (settings_changes' DDL is idempotent).
    from webapp.store.settings_changes import control_trigger_ddl, lab_trigger_ddl

    conn = op.get_bind()
    conn.exec_driver_sql(f"ALTER TABLE {CONTROL_SCHEMA}.consumers "
                         "ADD COLUMN IF NOT EXISTS settings_seen_at TIMESTAMP WITH TIME ZONE")
    for statement in control_trigger_ddl():
        conn.exec_driver_sql(statement)
    for schema in all_lab_schemas(conn):
        for statement in lab_trigger_ddl(schema):
            conn.exec_driver_sql(statement)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
