"""Revision 29: the fault kinds an exploration may use.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-06

- lab_control.explorations.faults: new column, the list of fault kinds its schedules draw from
  (JSONB); NULL, as for every row before it, means every kind.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import run_control

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

CONTROL = [
    "ALTER TABLE lab_control.explorations ADD COLUMN IF NOT EXISTS faults JSONB",
]


def upgrade() -> None:
    run_control(op.get_bind(), CONTROL)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
