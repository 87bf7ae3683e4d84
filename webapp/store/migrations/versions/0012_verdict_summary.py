"""Revision 12: the running summaries of the verdict (webapp/summary/).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

In every lab and lane schema:
- verdict_changes: the queue the change triggers fill (log_records, deliveries, payments, ledger);
- verdict_keys, verdict_totals: the verdict's facts per key and its counts, as folded;
- expected_credits, ledger_sums: the accounts' running sums; repeated_events: the events at several
  offsets (the producer duplicates); chart_truth, chart_effects: the chart's cents per second;
- the change triggers;
- log_records_first_sets: the first records of sets alone (the accounts' latest set per kind).

The summaries start empty: the agent's folder builds each schema's from its tables (until then,
the verdict is computed whole, as before).

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import all_lab_schemas

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

TABLES = [
    "CREATE TABLE IF NOT EXISTS {s}.verdict_changes (id BIGSERIAL PRIMARY KEY, log BOOLEAN NOT NULL, key TEXT, "
    "event_id UUID, partition INTEGER, \"offset\" BIGINT, outcome VARCHAR(24), account_id VARCHAR(32), cents BIGINT, "
    "chart_cents BIGINT, second BIGINT, "
    "sign INTEGER DEFAULT '1' NOT NULL, rebuild BOOLEAN DEFAULT 'false' NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.verdict_keys (key TEXT PRIMARY KEY, records BIGINT NOT NULL, "
    "several_events BOOLEAN NOT NULL, delta BOOLEAN NOT NULL, consumed BOOLEAN NOT NULL, dead BOOLEAN NOT NULL, "
    "effects BIGINT NOT NULL, effects_delivered BIGINT NOT NULL, applied BIGINT NOT NULL, log_records BIGINT NOT NULL, "
    "log_pending BIGINT NOT NULL, log_invalid BIGINT NOT NULL, log_invalid_kept BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.verdict_totals (id INTEGER PRIMARY KEY, transactions BIGINT NOT NULL, "
    "duplicates_applied BIGINT NOT NULL, transactions_applied_twice BIGINT NOT NULL, effects_lost BIGINT NOT NULL, "
    "source_duplicates_absorbed BIGINT NOT NULL, source_duplicates BIGINT NOT NULL, not_yet_applied BIGINT NOT NULL, "
    "sets_reapplied BIGINT NOT NULL, records BIGINT NOT NULL, records_pending BIGINT NOT NULL, "
    "invalid_records BIGINT NOT NULL, invalid_not_dead_lettered BIGINT NOT NULL, "
    "effects_without_record BIGINT NOT NULL, effects_not_yet_mirrored BIGINT NOT NULL, "
    "redeliveries_absorbed BIGINT NOT NULL, dead_letters BIGINT NOT NULL, committed JSONB NOT NULL, "
    "folded_at TIMESTAMP WITH TIME ZONE NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.expected_credits (account_id VARCHAR(32) PRIMARY KEY, cents BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.ledger_sums (account_id VARCHAR(32) PRIMARY KEY, cents BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.repeated_events (event_id UUID PRIMARY KEY)",
    "CREATE TABLE IF NOT EXISTS {s}.chart_truth (second BIGINT PRIMARY KEY, cents BIGINT NOT NULL, rows BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS {s}.chart_effects (second BIGINT PRIMARY KEY, cents BIGINT NOT NULL, "
    "rows BIGINT NOT NULL)",
    "CREATE INDEX IF NOT EXISTS log_records_first_sets ON {s}.log_records (account_id, type, partition, \"offset\") "
    "INCLUDE (status, balance_cents, score) "
    "WHERE first_of_transaction AND type IN ('set_status', 'set_balance', 'set_score')",
]


def upgrade() -> None:
    from webapp.store.verdict_changes import trigger_ddl

    conn = op.get_bind()
    for schema in all_lab_schemas(conn):
        quoted = '"' + schema.replace('"', '""') + '"'
        for statement in TABLES:
            conn.exec_driver_sql(statement.format(s=quoted))
        # The triggers as this release defines them (store.verdict_changes.trigger_ddl is idempotent).
        for statement in trigger_ddl(schema):
            conn.exec_driver_sql(statement)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
