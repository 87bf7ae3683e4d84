"""Revision 23: the change feed covers the guided runs and the attendees.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04

- ``lab_control.scenario_runs`` and ``lab_control.attendees``: a row trigger ``lab_changed`` that
  runs ``pg_notify('lab_change', <the row's lab>)``: the guided run's page, the presenter's step
  line and the class board are pushed (store/lab_changes.py);
- ``lab_control.consumers``: an update that changes nothing but ``heartbeat_at`` no longer
  notifies (trigger ``lab_changed_update``, with a WHEN condition); inserts and deletes do.

Frozen: a later change gets a revision of its own.
"""
from alembic import op

from webapp.store.lab_changes import control_trigger_ddl

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    for statement in control_trigger_ddl():
        conn.exec_driver_sql(statement)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
