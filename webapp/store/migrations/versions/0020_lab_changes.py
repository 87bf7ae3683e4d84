"""Revision 20: the live panels' change feed.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-03

- every lab (and lane) schema: a statement trigger ``lab_changed`` on each lab table that runs
  ``pg_notify('lab_change', <lab>)`` (store/lab_changes.py);
- ``lab_control.consumers``: a row trigger ``lab_changed`` that does the same with the row's lab.

Frozen: a later change gets a revision of its own.
"""
from alembic import op

from webapp.store.lab_changes import control_trigger_ddl, lab_trigger_ddl
from webapp.store.schema import all_lab_schemas

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    conn = op.get_bind()
    for statement in control_trigger_ddl():
        conn.exec_driver_sql(statement)
    for schema in all_lab_schemas(conn):
        # The tables this schema has now: a table a later revision adds gets its trigger there.
        tables = set(conn.exec_driver_sql("SELECT tablename FROM pg_tables WHERE schemaname = %(s)s",
                                          {"s": schema}).scalars())
        for statement in lab_trigger_ddl(schema, tables):
            conn.exec_driver_sql(statement)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
