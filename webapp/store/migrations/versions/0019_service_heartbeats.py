"""Revision 19: the heartbeats of the log reader and the notification service.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-03

- ``lab_control.service_heartbeats``: new table (service, host, pid, started_at, heartbeat_at),
  which the dashboard's status bar reads to show either service down within 5 s.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.connection import CONTROL_SCHEMA

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.get_bind().exec_driver_sql(f"""CREATE TABLE IF NOT EXISTS {CONTROL_SCHEMA}.service_heartbeats (
    service VARCHAR(32) NOT NULL,
    host VARCHAR(128) NOT NULL,
    pid INTEGER NOT NULL,
    started_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    heartbeat_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (service, host, pid)
)""")


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
