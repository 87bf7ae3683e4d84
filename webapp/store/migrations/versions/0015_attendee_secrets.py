"""Revision 15: an attendee is a secret, not a name.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03

- ``lab_control.attendees.name_key``: the name casefolded, unique per class in place of the name
  as typed (``Ana`` and ``ANA`` were two attendees to the old index). Of two rows the old release
  let in with one name in two cases, the older keeps the name; the newer's key gets ``#<id>``, so
  its lab stays on the board and the instructor can hand it over.
- ``lab_control.attendees.rejoin_hash``: a salted hash of the attendee's rejoin code. Attendees
  of the release before have none: the instructor hands their lab over from the board to open it
  in another browser.

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.connection import CONTROL_SCHEMA

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

C = CONTROL_SCHEMA


def upgrade() -> None:
    conn = op.get_bind()
    conn.exec_driver_sql(f"ALTER TABLE {C}.attendees ADD COLUMN IF NOT EXISTS name_key VARCHAR(64)")
    conn.exec_driver_sql(f"ALTER TABLE {C}.attendees ADD COLUMN IF NOT EXISTS rejoin_hash VARCHAR(160)")
    # The key as this release computes it (store/classroom.name_key: spaces collapsed, casefolded),
    # spelled out here so that a later change of that function does not change this revision.
    taken: set[tuple[str, str]] = set()
    rows = conn.exec_driver_sql(f"SELECT id, class_code, name FROM {C}.attendees WHERE name_key IS NULL "
                                "ORDER BY id").all()
    for attendee_id, class_code, name in rows:
        key = " ".join(str(name).split()).casefold()[:56]
        if (class_code, key) in taken:
            key = f"{key}#{attendee_id}"
        taken.add((class_code, key))
        conn.exec_driver_sql(f"UPDATE {C}.attendees SET name_key = %(key)s WHERE id = %(id)s",
                             {"key": key, "id": attendee_id})
    conn.exec_driver_sql(f"ALTER TABLE {C}.attendees ALTER COLUMN name_key SET NOT NULL")
    conn.exec_driver_sql(f"DROP INDEX IF EXISTS {C}.attendees_class_name")
    conn.exec_driver_sql(f"CREATE UNIQUE INDEX IF NOT EXISTS attendees_class_name_key "
                         f"ON {C}.attendees (class_code, name_key)")


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
