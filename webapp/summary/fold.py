"""The folder: fold_lab folds the queued changes of a lab and its lanes into their summaries (or
builds them whole), labs_to_fold finds the labs with something queued, and the upkeep the agent's
folder runs beside it (vacuum_queues, analyze_grown_tables).
"""
from __future__ import annotations

import psycopg

from ..store.schema import enter_psycopg, quoted
from .facts import (
    CONTRIBUTION,
    FACTS,
    KEY_COLUMNS,
    OUTCOMES,
    RECORDS_OF_ALL,
    RECORDS_OF_DIRTY,
    TOTALS,
    _contribution,
    _queued_outcomes,
)
from .triggers import CHANGES, COMMITTED, DIRTY

FOLD_LOCK_SQL = "SELECT pg_try_advisory_lock(hashtextextended('verdict summary ' || %s, 0))"
FOLD_UNLOCK_SQL = "SELECT pg_advisory_unlock(hashtextextended('verdict summary ' || %s, 0))"

LANES_SQL = ("SELECT nspname FROM pg_namespace n WHERE (nspname = %s OR nspname LIKE %s) "
             "AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'verdict_totals') "
             "ORDER BY nspname = %s DESC, nspname")


# What a fold that gave way raises: the lab was dropped or reset meanwhile, or a lock was held.
FOLD_GAVE_WAY = (psycopg.errors.InvalidSchemaName, psycopg.errors.UndefinedTable, psycopg.errors.LockNotAvailable,
                 psycopg.errors.DeadlockDetected)


SCHEMAS_SQL = ("SELECT nspname FROM pg_namespace n WHERE nspname LIKE 'lab\\_%' AND EXISTS "
               "(SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'verdict_totals') ORDER BY 1")


def labs_to_fold(conn: psycopg.Connection) -> list[str]:
    """The lab schemas with something to fold (a queued change in the lab or a lane, or a schema not
    built yet): one statement over every schema, so a database of idle labs costs one look."""
    schemas = [name for (name,) in conn.execute(SCHEMAS_SQL)]
    if not schemas:
        return []
    looks = " UNION ALL ".join(
        f"SELECT %s WHERE EXISTS (SELECT 1 FROM {quoted(schema)}.verdict_changes) "
        f"OR NOT EXISTS (SELECT 1 FROM {quoted(schema)}.verdict_totals)" for schema in schemas)
    waiting = [name for (name,) in conn.execute(looks, [schema.split("__", 1)[0] for schema in schemas])]
    return sorted(set(waiting))


def fold_lab(conn: psycopg.Connection, lab_schema: str) -> dict[str, str] | None:
    """Fold the queued changes of a lab and its lanes into their summaries, in one transaction.

    ``conn`` is in autocommit mode. Returns what was done per schema (``built``, ``folded`` or
    ``current``), or None when another process is folding this lab now.
    """
    if not conn.execute(FOLD_LOCK_SQL, [lab_schema]).fetchone()[0]:
        return None
    try:
        # The lock is the session's, taken before the transaction: the snapshot below sees every
        # fold committed before ours.
        with conn.transaction():
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            # Never the one others wait for: a lab reset (DROP SCHEMA) or a hand-made lock wins, and
            # this fold is done again next time (FOLD_GAVE_WAY).
            conn.execute("SET LOCAL lock_timeout = '200ms'")
            # No wait for the WAL flush: a crash loses at most the last folds, each whole (its queue
            # rows come back with it, since the same transaction deleted them), and is folded again.
            conn.execute("SET LOCAL synchronous_commit = off")
            return _fold(conn, lab_schema)
    finally:
        conn.execute(FOLD_UNLOCK_SQL, [lab_schema])


def vacuum_queues(conn: psycopg.Connection, schemas: list[str], thorough: bool = True) -> None:
    """Vacuum the queues of ``schemas`` (``conn`` in autocommit mode). Every read scans its whole
    queue, dead rows included, and each fold leaves the rows it emptied dead: under a load of
    2,000 records a second, some 6,000 a second, and autovacuum looks once a minute.

    ``thorough`` False: the dead rows' space only, which is what reads pay for, and never a wait.
    It skips the two parts that take long:
    - the queue's primary key (``INDEX_CLEANUP OFF``): that index is as large as the queue ever
      was (its file never shrinks); after a burst of 30,000,000 changes, 650 MB, and cleaning it
      took 200 ms against 0.6 ms without;
    - giving the emptied pages at the table's end back (``TRUNCATE false``): that needs the
      table's exclusive lock, and while any reader holds the queue (every panel's read does),
      VACUUM retries for up to five seconds before it gives up. Under a load with the dashboard
      open, the folder stood in that wait again and again, and the queue grew to 40,000 changes.

    ``thorough`` True does both (the line pointers a vacuum without index cleanup leaves grow the
    queue's table, 22 MB in ten minutes of load, and only truncation shrinks it after a burst), so
    its caller runs it where its wait stops nothing (SummaryFolder: on a thread of its own)."""
    if schemas:
        # SKIP_LOCKED: a queue locked by a reset, by hand, or by the other kind of vacuum is
        # vacuumed another time.
        options = "SKIP_LOCKED" if thorough else "SKIP_LOCKED, INDEX_CLEANUP OFF, TRUNCATE false"
        conn.execute(f"VACUUM ({options}) " + ", ".join(f"{quoted(schema)}.verdict_changes" for schema in schemas))


# The tables of ``schemas`` whose rows changed by more than the count their statistics hold, and
# by at least GROWN_ROWS (the queue aside: it churns by design and is read whole). Autovacuum
# would analyze them within a minute; a new lab under a load doubles its log mirror every few
# seconds at first, and plans made on a table's default guesses looked each queued event up
# through the whole of an index (5 s for one read of the "why" list at 24,000 records).
GROWN_ROWS = 1000
GROWN_TABLES_SQL = """
SELECT format('%%I.%%I', s.schemaname, s.relname) FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
WHERE s.schemaname = ANY(%s) AND s.relname <> 'verdict_changes'
  AND s.n_mod_since_analyze >= %s AND s.n_mod_since_analyze > greatest(c.reltuples, 0)
ORDER BY 1"""


def analyze_grown_tables(conn: psycopg.Connection, schemas: list[str]) -> list[str]:
    """ANALYZE the tables of ``schemas`` that grew past their statistics (``conn`` in autocommit
    mode); the tables analyzed."""
    grown = [name for (name,) in conn.execute(GROWN_TABLES_SQL, [schemas, GROWN_ROWS])]
    for table in grown:
        conn.execute(f"ANALYZE (SKIP_LOCKED) {table}")
    return grown


def _fold(conn: psycopg.Connection, lab_schema: str) -> dict[str, str]:
    journal = quoted(lab_schema)
    schemas = [name for (name,) in conn.execute(LANES_SQL, [lab_schema, lab_schema.replace("_", "\\_") + "\\_\\_%",
                                                            lab_schema])]
    if lab_schema not in schemas:
        return {}
    log_rebuild = conn.execute(f"SELECT EXISTS (SELECT 1 FROM {journal}.verdict_changes WHERE log AND rebuild)"
                               ).fetchone()[0]
    done: dict[str, str] = {}
    for schema in schemas:
        enter_psycopg(conn, schema)
        built = conn.execute("SELECT EXISTS (SELECT 1 FROM verdict_totals) AND NOT EXISTS "
                             "(SELECT 1 FROM verdict_changes WHERE NOT log AND rebuild)").fetchone()[0]
        if log_rebuild or not built:
            _build(conn, journal, journal_too=schema == lab_schema)
            done[schema] = "built"
        else:
            done[schema] = _fold_schema(conn, journal)
        conn.execute("DELETE FROM verdict_changes WHERE NOT log")
    if done.get(lab_schema) != "built":
        changed = f"SELECT event_id FROM {journal}.verdict_changes WHERE log AND event_id IS NOT NULL"
        conn.execute(f"DELETE FROM {journal}.repeated_events WHERE event_id IN ({changed})")
        conn.execute(f"""
            INSERT INTO {journal}.repeated_events (event_id)
            SELECT c.event_id FROM (SELECT DISTINCT event_id FROM ({changed}) e) c
            WHERE (SELECT count(*) FROM {journal}.log_records x WHERE x.event_id = c.event_id) > 1""")
        _add_seconds(conn, f"{journal}.chart_truth", f"{journal}.verdict_changes WHERE log")
        conn.execute(f"""
            INSERT INTO {journal}.expected_credits (account_id, cents)
            SELECT account_id, sum(sign * cents) FROM {journal}.verdict_changes WHERE log AND cents IS NOT NULL
            GROUP BY account_id
            ON CONFLICT (account_id) DO UPDATE SET cents = expected_credits.cents + EXCLUDED.cents""")
    conn.execute(f"DELETE FROM {journal}.verdict_changes WHERE log")
    return done


def _fold_schema(conn: psycopg.Connection, journal: str) -> str:
    """Recompute the queued keys of the current schema and move its totals by the difference."""
    changed = conn.execute("WITH " + COMMITTED.format(journal=journal) + " SELECT EXISTS (SELECT 1 FROM moved) "
                           "OR EXISTS (SELECT 1 FROM verdict_changes WHERE NOT log) "
                           f"OR EXISTS (SELECT 1 FROM {journal}.verdict_changes WHERE log)").fetchone()[0]
    if not changed:
        return "current"
    # The connection's own scratch tables, created once and emptied at each commit: a fold ten times
    # a second must not create and drop tables (every one writes and leaves dead rows in the
    # catalogs, which every VACUUM then scans).
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS summary_dirty (key text) ON COMMIT DELETE ROWS")
    conn.execute("CREATE TEMP TABLE IF NOT EXISTS summary_fresh (LIKE verdict_keys) ON COMMIT DELETE ROWS")
    # A fold's transaction folds the lab and then each lane: the previous schema's rows go first.
    conn.execute("DELETE FROM summary_dirty")
    conn.execute("DELETE FROM summary_fresh")
    conn.execute("INSERT INTO summary_dirty (key) WITH "
                 + ",".join([CHANGES, COMMITTED, DIRTY]).format(journal=journal) + " SELECT key FROM dirty")
    conn.execute("ANALYZE summary_dirty")
    conn.execute(f"INSERT INTO summary_fresh ({', '.join(KEY_COLUMNS)}) WITH dirty AS (SELECT key FROM summary_dirty), "
                 + ",".join([COMMITTED, RECORDS_OF_DIRTY, FACTS]).format(journal=journal)
                 + f" SELECT {', '.join(KEY_COLUMNS)} FROM fresh")
    # The old rows of the queued keys are deleted and subtracted in one pass over them.
    conn.execute(
        "WITH " + CHANGES.format(journal=journal) + ", "
        "old AS (DELETE FROM verdict_keys WHERE key = ANY (ARRAY(SELECT key FROM summary_dirty)) RETURNING *), "
        "plus AS (" + _contribution("summary_fresh") + "), "
        "minus AS (" + _contribution("old") + "), "
        "queued AS (" + _queued_outcomes() + ") "
        "UPDATE verdict_totals t SET "
        + ", ".join([f"{name} = t.{name} + plus.{name} - minus.{name}" for name in CONTRIBUTION]
                    + [f"{name} = t.{name} + queued.{name}" for name in OUTCOMES])
        + ", folded_at = now() FROM plus, minus, queued")
    conn.execute(f"INSERT INTO verdict_keys ({', '.join(KEY_COLUMNS)}) SELECT {', '.join(KEY_COLUMNS)} "
                 "FROM summary_fresh")
    _store_committed(conn, journal)
    conn.execute("""
        INSERT INTO ledger_sums (account_id, cents)
        SELECT account_id, sum(sign * cents) FROM verdict_changes WHERE NOT log AND cents IS NOT NULL
        GROUP BY account_id
        ON CONFLICT (account_id) DO UPDATE SET cents = ledger_sums.cents + EXCLUDED.cents""")
    _add_seconds(conn, "chart_effects", "verdict_changes WHERE NOT log")
    return "folded"


def _add_seconds(conn: psycopg.Connection, table: str, changes: str) -> None:
    conn.execute(f"INSERT INTO {table} (second, cents, rows) SELECT second, sum(sign * chart_cents), sum(sign) "
                 f"FROM {changes} AND chart_cents IS NOT NULL GROUP BY second "
                 f"ON CONFLICT (second) DO UPDATE SET cents = {table}.cents + EXCLUDED.cents, "
                 f"rows = {table}.rows + EXCLUDED.rows")


def _store_committed(conn: psycopg.Connection, journal: str) -> None:
    conn.execute("WITH " + COMMITTED.format(journal=journal) + " UPDATE verdict_totals SET committed = "
                 "(SELECT coalesce(jsonb_object_agg(partition, upto) FILTER (WHERE upto > 0), '{}') "
                 "FROM committed_now)")


def _build(conn: psycopg.Connection, journal: str, journal_too: bool) -> None:
    """Every key of the current schema computed from the tables (a new schema, or after a TRUNCATE)."""
    # One hash entry per transaction: the memory to stay off disk at millions (VERDICT_SQL's 64MB, x4).
    conn.execute("SET LOCAL work_mem = '256MB'")
    conn.execute("DELETE FROM verdict_keys")
    conn.execute(f"INSERT INTO verdict_keys ({', '.join(KEY_COLUMNS)}) WITH "
                 + ",".join([COMMITTED, RECORDS_OF_ALL, FACTS]).format(journal=journal)
                 + f" SELECT {', '.join(KEY_COLUMNS)} FROM fresh")
    conn.execute("DELETE FROM verdict_totals")
    conn.execute(f"INSERT INTO verdict_totals (id, {', '.join(TOTALS)}, committed, folded_at) "
                 f"SELECT 1, c.*, o.*, '{{}}', now() FROM ({_contribution('verdict_keys')}) c, ("
                 + "SELECT " + ", ".join(f"count(*) FILTER (WHERE outcome = '{outcome}') AS {name}"
                                         for name, outcome in OUTCOMES.items()) + " FROM deliveries) o")
    _store_committed(conn, journal)
    conn.execute("DELETE FROM ledger_sums")
    conn.execute("INSERT INTO ledger_sums (account_id, cents) "
                 "SELECT account_id, sum(amount_cents) FROM ledger GROUP BY account_id")
    conn.execute("DELETE FROM chart_effects")
    conn.execute("INSERT INTO chart_effects (second, cents, rows) SELECT second, sum(cents), count(*) FROM ("
                 "SELECT floor(extract(epoch FROM applied_at)) AS second, amount_cents AS cents FROM payments "
                 "UNION ALL SELECT floor(extract(epoch FROM recorded_at)), amount_cents FROM ledger) e GROUP BY second")
    if journal_too:
        conn.execute(f"DELETE FROM {journal}.repeated_events")
        conn.execute(f"INSERT INTO {journal}.repeated_events (event_id) SELECT event_id FROM {journal}.log_records "
                     "WHERE event_id IS NOT NULL GROUP BY event_id HAVING count(*) > 1")
        conn.execute(f"DELETE FROM {journal}.chart_truth")
        conn.execute(f"INSERT INTO {journal}.chart_truth (second, cents, rows) SELECT "
                     f"floor(extract(epoch FROM read_at)), sum(amount_cents), count(*) FROM {journal}.log_records "
                     "WHERE first_of_transaction AND type = 'credit' GROUP BY 1")
        conn.execute(f"DELETE FROM {journal}.expected_credits")
        conn.execute(f"INSERT INTO {journal}.expected_credits (account_id, cents) SELECT account_id, "
                     f"sum(amount_cents) FROM {journal}.log_records WHERE first_of_transaction AND type = 'credit' "
                     "GROUP BY account_id")
