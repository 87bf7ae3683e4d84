"""Revision 27: a lab consumer's effect transactions do not announce their lab.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-06

- every lab (and lane) schema: the change feed's statement triggers ``lab_changed`` get a WHEN:
  a session that sets ``lab.change_feed = 'reported'`` (a lab consumer's effects connection) runs
  no ``pg_notify`` from a lab table; its report on the control table announces its lab instead
  (store/lab_changes.py). A commit that has notified takes PostgreSQL's cluster-wide notify lock;
  one per record serialized every consumer's commits.

Frozen: a later change gets a revision of its own.
"""
from alembic import op

from webapp.store.lab_changes import lab_trigger_ddl
from webapp.store.schema import all_lab_schemas

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    for schema in all_lab_schemas(conn):
        for statement in lab_trigger_ddl(schema):
            conn.exec_driver_sql(statement)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
