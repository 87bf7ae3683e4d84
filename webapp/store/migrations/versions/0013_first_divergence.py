"""Revision 13: when each key of the verdict's summary first went wrong.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02

In every lab and lane schema, ``verdict_keys`` gains ``second_effect_at`` (a transaction's second
effect) and ``first_absorbed_at`` (the first absorbed delivery of one of its records), with one
partial index each: the lanes panel's first divergent event is then the first row of an index,
not an aggregation of the log (webapp/summary/reads.py, FIRST_DIVERGENCE_READ_SQL).

The summaries already built have no such times: each schema is marked for a rebuild, which the
agent's folder does (until then, the verdict and the lanes are computed whole, as before 0012).

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import all_lab_schemas

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

STATEMENTS = [
    "ALTER TABLE {s}.verdict_keys ADD COLUMN IF NOT EXISTS second_effect_at TIMESTAMP WITHOUT TIME ZONE",
    "ALTER TABLE {s}.verdict_keys ADD COLUMN IF NOT EXISTS first_absorbed_at TIMESTAMP WITHOUT TIME ZONE",
    "CREATE INDEX IF NOT EXISTS verdict_keys_twice ON {s}.verdict_keys (second_effect_at, key) "
    "WHERE records > 0 AND delta AND effects > 1",
    "CREATE INDEX IF NOT EXISTS verdict_keys_lost ON {s}.verdict_keys (first_absorbed_at, key) "
    "WHERE records > 0 AND delta AND effects = 0 AND first_absorbed_at IS NOT NULL",
    # Each schema's own rebuild mark (a lane's queue holds only its effects' changes).
    "INSERT INTO {s}.verdict_changes (log, rebuild) VALUES (false, true)",
]


def upgrade() -> None:
    conn = op.get_bind()
    for schema in all_lab_schemas(conn):
        quoted = '"' + schema.replace('"', '""') + '"'
        for statement in STATEMENTS:
            conn.exec_driver_sql(statement.format(s=quoted))


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
