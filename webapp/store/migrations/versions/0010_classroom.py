"""Revision 10: attendees and classes.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

- lab_control.attendees: new table (classroom mode: an attendee's name, class code and own lab)

No lab-schema change: an attendee's lab is an ordinary lab.
"""
from alembic import op

from webapp.store.migrations import run_control

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

CONTROL = [
    """CREATE TABLE IF NOT EXISTS lab_control.attendees (
    id SERIAL NOT NULL,
    class_code VARCHAR(64) DEFAULT '' NOT NULL,
    name VARCHAR(64) NOT NULL,
    lab VARCHAR(32) NOT NULL,
    joined_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    seen_at TIMESTAMP WITHOUT TIME ZONE DEFAULT now() NOT NULL,
    PRIMARY KEY (id),
    UNIQUE (lab)
)""",
    """CREATE UNIQUE INDEX IF NOT EXISTS attendees_class_name ON lab_control.attendees (class_code, name)""",
]


def upgrade() -> None:
    run_control(op.get_bind(), CONTROL)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
