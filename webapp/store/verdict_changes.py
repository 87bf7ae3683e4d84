"""The running summaries' change triggers (summary/fold.py folds what they queue).

Statement triggers on ``log_records``, ``deliveries``, ``payments`` and ``ledger`` copy the keys of
the rows an INSERT, UPDATE or DELETE touched into ``verdict_changes``, in the writer's own
transaction; a TRUNCATE leaves a ``rebuild`` mark. Part of every lab schema (migrations
create_lab_schema), hence here, in the store.
"""
from __future__ import annotations

from .schema import quoted

# --- the triggers: every changed row's keys into verdict_changes, in the writer's transaction ---

# What each table's changed rows say: the key of the transaction (or invalid record) they belong
# to, their event (which other keys it touches: a payment's orphan check, a ledger row's key), the
# record they are about, a delivery's outcome, and the cents an account's sums move by.
# The chart's cents and second: a first credit's when the reader saw it, an effect's when applied.
CHANGE_COLUMNS = "log, key, event_id, partition, \"offset\", outcome, account_id, cents, chart_cents, second, sign"
FIRST_CREDIT = "CASE WHEN first_of_transaction AND type = 'credit' AND invalid_reason IS NULL THEN amount_cents END"
CHANGED_ROWS = {
    "log_records": ("true, CASE WHEN invalid_reason IS NULL THEN transaction_id "
                    "ELSE 'record:' || partition || ':' || \"offset\" END, event_id, partition, \"offset\", NULL, "
                    f"account_id, {FIRST_CREDIT}, {FIRST_CREDIT}, floor(extract(epoch FROM read_at))"),
    "deliveries": ("false, coalesce(transaction_id, 'record:' || partition || ':' || \"offset\"), event_id, "
                   "partition, \"offset\", outcome, NULL, NULL, NULL, NULL"),
    "payments": ("false, transaction_id, event_id, NULL, NULL, NULL, NULL, NULL, amount_cents, "
                 "floor(extract(epoch FROM applied_at))"),
    "ledger": ("false, NULL, event_id, NULL, NULL, NULL, account_id, amount_cents, amount_cents, "
               "floor(extract(epoch FROM recorded_at))"),
}


# The functions run as their owner: a lane's role, allowed to write ``payments`` and none of the
# summaries, still has its rows queued. Their bodies name every table with its schema, and the
# search_path is fixed, so no object of the writer's choosing is ever resolved inside them.
AS_OWNER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"


def trigger_ddl(schema: str) -> list[str]:
    """The change triggers of one lab (or lane) schema; idempotent."""
    s = quoted(schema)
    statements = []
    for table, columns in CHANGED_ROWS.items():
        log = "true" if table == "log_records" else "false"
        function = f"{s}.verdict_changes_of_{table}"
        statements.append(f"""
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql {AS_OWNER} AS $fn$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        INSERT INTO {s}.verdict_changes (log, rebuild) VALUES ({log}, true);
        RETURN NULL;
    END IF;
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        INSERT INTO {s}.verdict_changes ({CHANGE_COLUMNS}) SELECT {columns}, -1 FROM old_rows;
    END IF;
    IF TG_OP IN ('UPDATE', 'INSERT') THEN
        INSERT INTO {s}.verdict_changes ({CHANGE_COLUMNS}) SELECT {columns}, 1 FROM new_rows;
    END IF;
    RETURN NULL;
END $fn$""")
        for event, referencing in (("INSERT", "NEW TABLE AS new_rows"),
                                   ("UPDATE", "OLD TABLE AS old_rows NEW TABLE AS new_rows"),
                                   ("DELETE", "OLD TABLE AS old_rows")):
            name = f"verdict_changes_{event.lower()}"
            statements.append(f"DROP TRIGGER IF EXISTS {name} ON {s}.{table}")
            statements.append(f"CREATE TRIGGER {name} AFTER {event} ON {s}.{table} REFERENCING {referencing} "
                              f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()")
        statements.append(f"DROP TRIGGER IF EXISTS verdict_changes_truncate ON {s}.{table}")
        statements.append(f"CREATE TRIGGER verdict_changes_truncate AFTER TRUNCATE ON {s}.{table} "
                          f"FOR EACH STATEMENT EXECUTE FUNCTION {function}()")
    # Committed offsets (and the groups that say which schema they apply to) carry no key: a bare
    # mark tells the folder to look (a read compares the offsets itself, mark or not).
    statements.append(f"""
CREATE OR REPLACE FUNCTION {s}.verdict_changes_mark() RETURNS trigger LANGUAGE plpgsql {AS_OWNER} AS $fn$
BEGIN
    INSERT INTO {s}.verdict_changes (log) VALUES (true);
    RETURN NULL;
END $fn$""")
    for table, event in (("group_offsets", "INSERT OR DELETE OR TRUNCATE"), ("consumer_groups", "INSERT OR UPDATE OR DELETE")):
        statements.append(f"DROP TRIGGER IF EXISTS verdict_changes_mark ON {s}.{table}")
        statements.append(f"CREATE TRIGGER verdict_changes_mark AFTER {event} ON {s}.{table} "
                          f"FOR EACH STATEMENT EXECUTE FUNCTION {s}.verdict_changes_mark()")
    statements += [f"REVOKE EXECUTE ON FUNCTION {s}.verdict_changes_of_{table}() FROM PUBLIC" for table in CHANGED_ROWS]
    statements.append(f"REVOKE EXECUTE ON FUNCTION {s}.verdict_changes_mark() FROM PUBLIC")
    statements.append(f"DROP TRIGGER IF EXISTS verdict_changes_moved ON {s}.group_offsets")
    statements.append(f"CREATE TRIGGER verdict_changes_moved AFTER UPDATE ON {s}.group_offsets FOR EACH ROW "
                      f"WHEN (OLD.committed IS DISTINCT FROM NEW.committed) EXECUTE FUNCTION {s}.verdict_changes_mark()")
    return statements
