"""Revision 25: a lane's credentials kept encrypted, its role held to the lane's four tables, and
an attendee's earlier browser sessions revocable.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06

- ``lab_control.outside_roles``: the plain ``password`` column is dropped; ``password_encrypted``,
  ``kafka_password_encrypted`` and ``kafka_password_hash`` are added. The lab encrypts under
  SECRET_KEY, which a migration does not have: a lane made before this revision gets new passwords
  the next time the lab shows or refreshes it (its role's password is set anew then).
- ``lab_control.attendees``: ``session_generation`` (integer, 0): leaving and a hand-over bump it,
  and every browser session signed in under an earlier one is signed out.
- every lab schema: the summaries' change-trigger functions run as their owner (SECURITY DEFINER,
  a fixed search_path), so a lane role allowed to insert into ``payments`` and nothing of the
  summaries still has its rows queued for the verdict; nobody may call them directly.

Frozen: a later change gets a revision of its own.
"""
from alembic import op

from webapp.store.connection import CONTROL_SCHEMA
from webapp.store.migrations import for_each_lab_schema

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

CONTROL = [
    f"ALTER TABLE {CONTROL_SCHEMA}.outside_roles DROP COLUMN IF EXISTS password",
    f"ALTER TABLE {CONTROL_SCHEMA}.outside_roles ADD COLUMN IF NOT EXISTS password_encrypted TEXT",
    f"ALTER TABLE {CONTROL_SCHEMA}.outside_roles ADD COLUMN IF NOT EXISTS kafka_password_encrypted TEXT",
    f"ALTER TABLE {CONTROL_SCHEMA}.outside_roles ADD COLUMN IF NOT EXISTS kafka_password_hash TEXT",
    f"ALTER TABLE {CONTROL_SCHEMA}.attendees ADD COLUMN IF NOT EXISTS session_generation INTEGER DEFAULT 0 NOT NULL",
]
TRIGGER_FUNCTIONS = ("verdict_changes_of_log_records", "verdict_changes_of_deliveries", "verdict_changes_of_payments",
                     "verdict_changes_of_ledger", "verdict_changes_mark")
LAB = [statement for function in TRIGGER_FUNCTIONS for statement in (
    f"ALTER FUNCTION {function}() SECURITY DEFINER SET search_path = pg_catalog, pg_temp",
    f"REVOKE EXECUTE ON FUNCTION {function}() FROM PUBLIC",
)]


def upgrade() -> None:
    conn = op.get_bind()
    for statement in CONTROL:
        conn.exec_driver_sql(statement)
    for_each_lab_schema(conn, LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
