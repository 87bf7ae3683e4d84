"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""
from alembic import op

from webapp.migrations import for_each_lab_schema, run_control

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}

# Qualified with lab_control. Print a draft with `python -m webapp.migrations.check DATABASE_URL`.
CONTROL: list[str] = []
# Unqualified: run in every lab and lane schema.
LAB: list[str] = []


def upgrade() -> None:
    conn = op.get_bind()
    run_control(conn, CONTROL)
    for_each_lab_schema(conn, LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
