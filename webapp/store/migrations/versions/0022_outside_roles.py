"""Revision 22: the roles of learners' own consumers and their passwords.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-03

- ``lab_control.outside_roles``: new table (role, lab, password, created_at). The password of a
  "your consumer" lane's role, generated once and read by whichever process makes the role (the
  web, or an agent running the grading exercise), so both show and set the same one.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.connection import CONTROL_SCHEMA

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    conn.exec_driver_sql(f"""CREATE TABLE IF NOT EXISTS {CONTROL_SCHEMA}.outside_roles (
    role VARCHAR(63) NOT NULL PRIMARY KEY,
    lab VARCHAR(32) NOT NULL,
    password VARCHAR(64) NOT NULL,
    created_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL
)""")
    conn.exec_driver_sql(f"CREATE INDEX IF NOT EXISTS ix_{CONTROL_SCHEMA}_outside_roles_lab "
                         f"ON {CONTROL_SCHEMA}.outside_roles (lab)")


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
