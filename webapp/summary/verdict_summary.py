"""Running summaries of the verdict and of the accounts' expected balances (issue 14).

``verdict.VERDICT_SQL`` judges the whole log and every effect on each call: seconds at a million
records. The summaries keep its answer as it changes, so a panel pays for what changed, not for
what the lab holds; ``VERDICT_SQL`` stays the exact definition, and the answer on demand
(``verdict(..., exact=True)``, ``GET /api/v1/state?exact=1``).

How it stays exact:

- **What changed is written where it changes.** Statement triggers on ``log_records``,
  ``deliveries``, ``payments`` and ``ledger`` copy the keys of the rows an INSERT, UPDATE or DELETE
  touched into ``verdict_changes``, in the writer's own transaction: a change is in the queue
  exactly when its row is committed, whoever wrote it (the log reader, a consumer, a person in
  psql). Each statement appends rows of its own: no counter row is shared, so concurrent consumers
  never wait on each other for it (the check-then-act race stays the race it is). A TRUNCATE
  leaves a ``rebuild`` mark.
- **Facts are recomputed per key, never patched.** The verdict groups facts by transaction
  (``VERDICT_SQL``'s ``per_transaction``). ``verdict_keys`` holds that row per key; a changed key's
  row is computed again from the tables (index lookups), and the totals move by the difference
  of the old and new rows' contributions: the same ``FILTER`` expressions ``VERDICT_SQL`` uses.
  Keys: a transaction id; ``record:<partition>:<offset>`` for an invalid record; ``ledger:<event
  id>`` for a ledger row whose event the log does not hold (yet). A key's row also says since when
  it is wrong (its second effect, its first absorbed delivery): the lanes panel's first divergent
  event is the first row of a partial index (``first_divergence``).
- **Committed offsets move both ways.** The totals keep the committed offsets they reflect;
  where a group's committed offset moved (a commit, a reset back), the records in between are the
  changed keys.
- **Sums move by the queued rows themselves**: the deliveries' outcomes, the accounts' first
  credits (expected) and ledger rows (actual), the chart's cents per second, and which events the
  log holds at several offsets (those events counted again).
- **A read adds what is not folded yet.** One statement (one snapshot) reads the totals and
  recomputes the keys still in the queue: the answer is the verdict of that snapshot, not of the
  last fold. The agent's folder (``agent.periodic.SummaryFolder``: ``fold_lab`` for the labs with
  something queued, ``labs_to_fold``; again after 0.1 s while there is, else after 0.5 s) only
  keeps the queue short, and with it what a read recomputes under a load; it vacuums the queues
  it emptied (``vacuum_queues``) once a second, since a read scans a queue's dead rows too, and
  every ten seconds, on a thread of its own, vacuums them thoroughly and analyzes the tables that
  outgrew their statistics (``analyze_grown_tables``).

A schema without totals (new, or marked for a rebuild) is judged by ``VERDICT_SQL`` until the
folder has built them. ``tests/test_verdict_summary.py`` checks the summaries against
``VERDICT_SQL`` after random changes of every kind.
"""
from __future__ import annotations

from typing import Any

import psycopg
from sqlalchemy import text
from sqlalchemy.orm import Session
from ..store.schema import quoted
# The triggers that queue every changed row's keys into verdict_changes are the store's DDL: a lab
# schema is created with them (store/verdict_changes.py).
from ..store.verdict_changes import trigger_ddl  # noqa: F401  (re-exported)


# --- what changed since the last fold: keys -------------------------------------------------

# The queue as one schema sees it: its own effects' changes and the journal's log changes (every
# copy of the accounts is judged against the lab's one log).
CHANGES = """
changes AS (
    SELECT key, event_id, partition, "offset", outcome, account_id, cents, sign, rebuild, log
    FROM verdict_changes WHERE NOT log
    UNION ALL
    SELECT key, event_id, partition, "offset", outcome, account_id, cents, sign, rebuild, log
    FROM {journal}.verdict_changes WHERE log
)"""

# VERDICT_SQL's committed offsets, and where they moved since the totals were folded.
COMMITTED = """
committed AS (
    SELECT g.partition, max(g.committed) AS committed
    FROM {journal}.group_offsets g
    JOIN {journal}.consumer_groups cg ON cg.group_id = g.group_id AND cg.effects_schema = current_schema()
    GROUP BY g.partition
),
committed_now AS (SELECT partition, greatest(coalesce(committed, 0), 0) AS upto FROM committed),
moved AS (
    SELECT coalesce(n.partition, f.partition) AS partition,
           least(coalesce(n.upto, 0), coalesce(f.upto, 0)) AS low,
           greatest(coalesce(n.upto, 0), coalesce(f.upto, 0)) AS high
    FROM committed_now n
    FULL JOIN (SELECT key::int AS partition, value::bigint AS upto
               FROM verdict_totals, jsonb_each_text(committed)) f ON f.partition = n.partition
    WHERE coalesce(n.upto, 0) <> coalesce(f.upto, 0)
)"""

RECORD_KEY = "CASE WHEN {r}.invalid_reason IS NULL THEN {r}.transaction_id ELSE 'record:' || {r}.partition || ':' || {r}.\"offset\" END"

# Every key whose facts a queued change may have moved: its own key; for its event, the
# ledger row's keys and the payments' (whose orphan check looks for a delivery of the event); the
# record it names; the records a committed offset moved over.
DIRTY = """
changed_events AS (SELECT DISTINCT event_id FROM changes WHERE event_id IS NOT NULL),
dirty AS (
    SELECT key FROM changes WHERE key IS NOT NULL
    UNION SELECT 'ledger:' || event_id FROM changed_events
    UNION SELECT p.transaction_id FROM changed_events e CROSS JOIN LATERAL (
              SELECT transaction_id FROM payments p WHERE p.event_id = e.event_id OFFSET 0) p
    UNION SELECT x.transaction_id FROM changed_events e CROSS JOIN LATERAL (
              SELECT transaction_id, invalid_reason FROM {journal}.log_records x
              WHERE x.event_id = e.event_id OFFSET 0) x WHERE x.invalid_reason IS NULL
    UNION SELECT """ + RECORD_KEY.format(r="x") + """ FROM changes c CROSS JOIN LATERAL (
              SELECT * FROM {journal}.log_records x WHERE x.partition = c.partition AND x."offset" = c."offset"
              OFFSET 0) x
    UNION SELECT """ + RECORD_KEY.format(r="x") + """ FROM moved m CROSS JOIN LATERAL (
              SELECT * FROM {journal}.log_records x
              WHERE x.partition = m.partition AND x."offset" >= m.low AND x."offset" < m.high OFFSET 0) x
)"""
# (LATERAL ... OFFSET 0, here and below: index lookups per queued key or event, never a scan of a
# table or an index, whatever the planner guesses. An IN (SELECT key FROM dirty) was planned as a
# merge join that read log_records' and payments' indexes from their first key to the last queued
# one: at 10,000,000 records, 470,000 index entries each; the fold's recompute of 1,000 queued
# records took 366 ms instead of 29. The statistics that misled it lag the keys a load adds.
# A record's validity is tested outside the lookup by event id: inside, the planner may AND the
# event-id index with the whole of the partial index on valid records (log_records_truth), once per
# event. On a new lab whose log mirror had no statistics yet (the planner's default guess: a few
# dozen records per event id), that made a fold of 28,000 queued changes run for minutes, and the
# queue grew without end.)

# --- the facts of keys: VERDICT_SQL's per_transaction, per key ---------------------------------

# The key a ledger row counts under: the transaction of its event's first record in the log.
LEDGER_KEY = """(SELECT coalesce((SELECT x.transaction_id
                           FROM (SELECT transaction_id, invalid_reason, partition, "offset" FROM {journal}.log_records x
                                 WHERE x.event_id = l.event_id OFFSET 0) x
                           WHERE x.invalid_reason IS NULL
                           ORDER BY x.partition, x."offset" LIMIT 1), 'ledger:' || l.event_id) AS key)"""

# The records and effects of the dirty keys (index lookups), or of every key (the full build).
RECORDS_OF_DIRTY = """
rec AS (
    SELECT d.key, r.partition, r."offset", r.event_id, r.type, false AS invalid
    FROM dirty d CROSS JOIN LATERAL (
        SELECT * FROM {journal}.log_records r
        WHERE r.transaction_id = d.key AND r.invalid_reason IS NULL OFFSET 0) r
    UNION ALL
    SELECT d.key, r.partition, r."offset", NULL, NULL, true
    FROM (SELECT key, split_part(key, ':', 2)::int AS p, split_part(key, ':', 3)::bigint AS o
          FROM (SELECT key FROM dirty WHERE key ~ '^record:[0-9]{{1,9}}:[0-9]{{1,18}}$' OFFSET 0) k) d
    CROSS JOIN LATERAL (SELECT * FROM {journal}.log_records r
                        WHERE r.partition = d.p AND r."offset" = d.o AND r.invalid_reason IS NOT NULL OFFSET 0) r
),
effects AS (
    SELECT d.key, p.event_id, p.applied_at AS at, p.id
    FROM dirty d CROSS JOIN LATERAL (SELECT * FROM payments p WHERE p.transaction_id = d.key OFFSET 0) p
    UNION ALL
    SELECT k.key, l.event_id, l.recorded_at, 0
    FROM (SELECT event_id FROM rec WHERE NOT invalid
          UNION
          SELECT CASE WHEN key ~ '^ledger:[0-9a-f]{{8}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{4}}-[0-9a-f]{{12}}$'
                      THEN substr(key, 8)::uuid END FROM dirty) e
    CROSS JOIN LATERAL (SELECT * FROM ledger l WHERE l.event_id = e.event_id OFFSET 0) l
    CROSS JOIN LATERAL """ + LEDGER_KEY + """ k
    WHERE k.key IN (SELECT key FROM dirty)
)"""

RECORDS_OF_ALL = """
rec AS (
    SELECT """ + RECORD_KEY.format(r="r") + """ AS key, r.partition, r."offset", r.event_id, r.type,
           r.invalid_reason IS NOT NULL AS invalid
    FROM {journal}.log_records r
),
effects AS (
    SELECT p.transaction_id AS key, p.event_id, p.applied_at AS at, p.id FROM payments p
    UNION ALL
    SELECT k.key, l.event_id, l.recorded_at, 0 FROM ledger l CROSS JOIN LATERAL """ + LEDGER_KEY + """ k
)"""

# Per effect: whether its event was ever delivered (EXISTS ... OFFSET 0: one index lookup per effect;
# without the OFFSET the planner may hash the whole deliveries table for a few queued effects, a
# scan of every delivery on each read and fold while a load runs).
# Per record: consumed (a group applying here committed past it, or delivered it), dead-lettered,
# for a set how often a consumer says it applied it, and when a delivery of it was first absorbed:
# one look at the record's deliveries. Then one row per key.
FACTS = """
records AS (
    SELECT rec.key, rec.event_id, rec.type, rec.invalid,
           coalesce(rec."offset" < c.committed, false) OR d.delivered AS consumed,
           d.dead,
           CASE WHEN NOT rec.invalid AND rec.type <> 'credit' THEN d.applied ELSE 0 END AS applied,
           CASE WHEN NOT rec.invalid THEN d.absorbed_at END AS absorbed_at
    FROM rec LEFT JOIN committed c ON c.partition = rec.partition
    CROSS JOIN LATERAL (
        SELECT count(*) > 0 AS delivered, coalesce(bool_or(outcome = 'dead-lettered'), false) AS dead,
               count(*) FILTER (WHERE outcome = 'applied') AS applied,
               min(delivered_at) FILTER (WHERE outcome = 'absorbed') AS absorbed_at
        FROM deliveries d WHERE d.partition = rec.partition AND d."offset" = rec."offset") d
),
facts AS (
    SELECT key, event_id, NOT invalid AS valid, invalid, type = 'credit' AS delta, consumed, dead, applied,
           0 AS effect, 0 AS delivered_effect, absorbed_at, NULL::timestamp AS at, NULL::bigint AS id
    FROM records
    UNION ALL
    SELECT key, NULL, false, false, NULL, NULL, NULL, 0, 1,
           CASE WHEN EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.event_id OFFSET 0) THEN 1 ELSE 0 END,
           NULL, at, id
    FROM effects e
),
fresh AS (
    SELECT key,
           count(*) FILTER (WHERE valid) AS records,
           coalesce(min(event_id::text) FILTER (WHERE valid) <> max(event_id::text) FILTER (WHERE valid), false)
               AS several_events,
           coalesce(bool_or(delta) FILTER (WHERE valid), false) AS delta,
           coalesce(bool_or(consumed) FILTER (WHERE valid), false) AS consumed,
           coalesce(bool_or(dead) FILTER (WHERE valid), false) AS dead,
           sum(effect) AS effects, sum(delivered_effect) AS effects_delivered, sum(applied) AS applied,
           count(*) FILTER (WHERE valid OR invalid) AS log_records,
           count(*) FILTER (WHERE (valid OR invalid) AND NOT consumed) AS log_pending,
           count(*) FILTER (WHERE invalid) AS log_invalid,
           count(*) FILTER (WHERE invalid AND consumed AND NOT dead) AS log_invalid_kept,
           (array_agg(at ORDER BY at, id) FILTER (WHERE effect = 1))[2] AS second_effect_at,
           min(absorbed_at) FILTER (WHERE valid) AS first_absorbed_at
    FROM facts GROUP BY key
)"""

KEY_COLUMNS = ("key", "records", "several_events", "delta", "consumed", "dead", "effects", "effects_delivered",
               "applied", "log_records", "log_pending", "log_invalid", "log_invalid_kept", "second_effect_at",
               "first_absorbed_at")

# What a set of key rows ``k`` adds to the verdict: VERDICT_SQL's judged, log and orphans.
CONTRIBUTION = {
    "transactions": "count(*) FILTER (WHERE records > 0)",
    "duplicates_applied": "coalesce(sum(greatest(effects - 1, 0)) FILTER (WHERE records > 0 AND delta), 0)",
    "transactions_applied_twice": "count(*) FILTER (WHERE records > 0 AND delta AND effects > 1)",
    "effects_lost": "count(*) FILTER (WHERE records > 0 AND CASE WHEN delta THEN effects ELSE applied END = 0 "
                    "AND consumed AND NOT dead)",
    "source_duplicates_absorbed": "count(*) FILTER (WHERE records > 0 AND several_events "
                                  "AND CASE WHEN delta THEN effects ELSE applied END = 1)",
    "source_duplicates": "count(*) FILTER (WHERE records > 0 AND several_events)",
    "not_yet_applied": "count(*) FILTER (WHERE records > 0 AND CASE WHEN delta THEN effects ELSE applied END = 0 "
                       "AND NOT consumed)",
    "sets_reapplied": "count(*) FILTER (WHERE records > 0 AND NOT delta AND applied > 1)",
    "records": "coalesce(sum(log_records), 0)",
    "records_pending": "coalesce(sum(log_pending), 0)",
    "invalid_records": "coalesce(sum(log_invalid), 0)",
    "invalid_not_dead_lettered": "coalesce(sum(log_invalid_kept), 0)",
    "effects_without_record": "coalesce(sum(effects - effects_delivered) FILTER (WHERE records = 0), 0)",
    "effects_not_yet_mirrored": "coalesce(sum(effects_delivered) FILTER (WHERE records = 0), 0)",
}
# Counted over the deliveries themselves (VERDICT_SQL's outcomes): moved by each queued delivery.
OUTCOMES = {"redeliveries_absorbed": "absorbed", "dead_letters": "dead-lettered"}
TOTALS = tuple(CONTRIBUTION) + tuple(OUTCOMES)


def _contribution(relation: str) -> str:
    return "SELECT " + ", ".join(f"{sql} AS {name}" for name, sql in CONTRIBUTION.items()) + f" FROM {relation} k"


def _queued_outcomes() -> str:
    return "SELECT " + ", ".join(f"coalesce(sum(sign) FILTER (WHERE outcome = '{outcome}'), 0) AS {name}"
                                 for name, outcome in OUTCOMES.items()) + " FROM changes WHERE NOT log"


# One statement, one snapshot: the folded totals, plus what the queue changes (the fresh rows of
# its keys minus their folded rows). No row when this schema has no totals.
VERDICT_READ_SQL = ("WITH " + ",".join([CHANGES, COMMITTED, DIRTY, RECORDS_OF_DIRTY, FACTS]) + """,
folded AS (SELECT k.* FROM dirty d CROSS JOIN LATERAL (SELECT * FROM verdict_keys k WHERE k.key = d.key OFFSET 0) k),
plus AS (""" + _contribution("fresh") + """),
minus AS (""" + _contribution("folded") + """),
queued AS (""" + _queued_outcomes() + """)
SELECT """ + ", ".join([f"t.{name} + plus.{name} - minus.{name} AS {name}" for name in CONTRIBUTION]
                       + [f"t.{name} + queued.{name} AS {name}" for name in OUTCOMES]) + """,
       EXISTS (SELECT 1 FROM changes WHERE rebuild) AS rebuild
FROM verdict_totals t, plus, minus, queued""")


def verdict_values(session: Session, journal_schema: str) -> dict[str, int] | None:
    """The verdict's counts from the running summaries of the current schema, as of this
    statement's snapshot; None when there are none to read (then VERDICT_SQL judges)."""
    row = session.execute(text(VERDICT_READ_SQL.format(journal=quoted(journal_schema)))).mappings().first()
    if row is None or row["rebuild"]:
        return None
    return {name: int(row[name]) for name in TOTALS}


# --- the first divergent event of a copy of the accounts (the lanes panel) ---------------------

# A key gone wrong as the verdict counts it, and since when: a credit applied twice (from its
# second effect), a credit consumed without an effect while a delivery of one of its records was
# absorbed (from the first such delivery). verdict_keys has a partial index on each.
TWICE = "records > 0 AND delta AND effects > 1"
LOST = "records > 0 AND delta AND effects = 0 AND first_absorbed_at IS NOT NULL"
WRONG_OF_FRESH = f"""
wrong AS (
    SELECT key, second_effect_at AS at, 'applied twice' AS what FROM fresh WHERE {TWICE}
    UNION ALL
    SELECT key, first_absorbed_at, 'effect lost' FROM fresh WHERE {LOST}"""

# Judged whole: every key's facts, then the earliest key gone wrong (the exact answer, seconds at
# a million records).
FIRST_DIVERGENCE_SQL = ("WITH " + ",".join([COMMITTED, RECORDS_OF_ALL, FACTS]) + "," + WRONG_OF_FRESH + """
)
SELECT key, at, what FROM wrong ORDER BY at, key LIMIT 1""")

# From the summary, in one snapshot: the queued keys recomputed, and the first folded key of each
# index that the queue has not changed. (NOT IN: the queued keys hashed once, each index read in
# order until its first key not queued; a NOT EXISTS becomes an anti-join that reads the whole
# index, 50,000 keys applied twice at 10,000,000 records. NULLs left out: a NULL makes NOT IN unknown.)
FIRST_DIVERGENCE_READ_SQL = ("WITH " + ",".join([CHANGES, COMMITTED, DIRTY, RECORDS_OF_DIRTY, FACTS]) + ","
                             + WRONG_OF_FRESH + f"""
    UNION ALL
    (SELECT key, second_effect_at, 'applied twice' FROM verdict_keys k WHERE {TWICE}
     AND k.key NOT IN (SELECT key FROM dirty WHERE key IS NOT NULL) ORDER BY second_effect_at, key LIMIT 1)
    UNION ALL
    (SELECT key, first_absorbed_at, 'effect lost' FROM verdict_keys k WHERE {LOST}
     AND k.key NOT IN (SELECT key FROM dirty WHERE key IS NOT NULL) ORDER BY first_absorbed_at, key LIMIT 1)
)
SELECT key, at, what FROM wrong ORDER BY at, key LIMIT 1""")

# The event that shows it (the second effect's, or the first absorbed delivery's), and where that
# event was delivered last: index lookups for one key.
FIRST_DIVERGENCE_EVENT_SQL = """
SELECT e.event_id::text AS event_id, d.partition, d."offset", d.consumer
FROM (SELECT CASE WHEN :what = 'applied twice' THEN (
          SELECT event_id FROM (
              SELECT applied_at AS at, id, event_id FROM payments WHERE transaction_id = :key
              UNION ALL
              SELECT l.recorded_at, 0, l.event_id FROM ledger l CROSS JOIN LATERAL """ + LEDGER_KEY + """ k
              WHERE k.key = :key AND l.event_id IN (SELECT x.event_id FROM {journal}.log_records x
                                                    WHERE x.transaction_id = :key AND x.invalid_reason IS NULL)
          ) u ORDER BY at, id OFFSET 1 LIMIT 1)
      ELSE (SELECT d.event_id FROM {journal}.log_records r
            JOIN deliveries d ON d.partition = r.partition AND d."offset" = r."offset"
            WHERE r.transaction_id = :key AND r.invalid_reason IS NULL AND d.outcome = 'absorbed'
            ORDER BY d.delivered_at, d.id LIMIT 1)
      END AS event_id) e
LEFT JOIN LATERAL (SELECT partition, "offset", consumer FROM deliveries WHERE event_id = e.event_id
                   ORDER BY id DESC LIMIT 1) d ON true"""


def first_divergence(session: Session, journal_schema: str, exact: bool = False) -> dict[str, Any] | None:
    """The current schema's earliest effect that differs from exactly-once, or None: when, which
    transaction and event, what ('applied twice' or 'effect lost'), and the event's last delivery.

    From the summary unless ``exact`` (the caller checks that it is ready: ``ready``)."""
    journal = quoted(journal_schema)
    row = session.execute(text((FIRST_DIVERGENCE_SQL if exact else FIRST_DIVERGENCE_READ_SQL).format(
        journal=journal))).first()
    if row is None:
        return None
    key, at, what = row
    shown = session.execute(text(FIRST_DIVERGENCE_EVENT_SQL.format(journal=journal)),
                            {"key": key, "what": what}).mappings().one()
    return {"at": at, "transaction_id": key, "what": what, **shown}


# --- the first few transactions applied twice (the verdict's "why" list) -----------------------

# Without a scan of the effects: the candidates are the folded keys applied twice (their partial
# index, earliest second effect first) that the queue does not name, and every key the queue names
# (an effect or a record written since the last fold; a ledger row's, through its event). Each
# candidate is counted again here, by index lookups, so a key is listed as it is at this snapshot.
APPLIED_TWICE_SQL = """
WITH queued AS (
    SELECT key FROM verdict_changes WHERE NOT log AND key IS NOT NULL AND outcome IS NULL
    UNION
    SELECT key FROM {journal}.verdict_changes WHERE log AND key IS NOT NULL
    UNION
    SELECT x.transaction_id FROM (SELECT DISTINCT event_id FROM verdict_changes
                                  WHERE NOT log AND key IS NULL AND event_id IS NOT NULL) e
    CROSS JOIN LATERAL (SELECT transaction_id, invalid_reason FROM {journal}.log_records x
                        WHERE x.event_id = e.event_id OFFSET 0) x
    WHERE x.invalid_reason IS NULL
),
candidates AS (
    (SELECT key, second_effect_at AS at FROM verdict_keys k WHERE """ + TWICE + """
     AND k.key NOT IN (SELECT key FROM queued WHERE key IS NOT NULL) ORDER BY second_effect_at, key LIMIT :limit)
    UNION ALL
    SELECT key, NULL FROM queued WHERE key IS NOT NULL
)
SELECT c.key AS transaction_id, n.effects FROM candidates c
CROSS JOIN LATERAL (
    SELECT (SELECT count(*) FROM payments p WHERE p.transaction_id = c.key)
         + (SELECT count(DISTINCT l.event_id) FROM {journal}.log_records x JOIN ledger l ON l.event_id = x.event_id
            WHERE x.transaction_id = c.key AND x.invalid_reason IS NULL) AS effects
    OFFSET 0) n
WHERE n.effects > 1
  AND EXISTS (SELECT 1 FROM {journal}.log_records r
              WHERE r.transaction_id = c.key AND r.invalid_reason IS NULL AND r.type = 'credit' OFFSET 0)
ORDER BY c.at NULLS LAST, c.key LIMIT :limit"""


# --- the accounts' expected balances and the ledger's sums ---------------------------------------

# The sums per account as folded, plus what the queue moves them by: the journal's first credits
# (expected) and this schema's ledger rows (actual, natural). NULL when they are not built.
CREDITED_SQL = """
credited AS (
    SELECT account_id, sum(cents) AS cents FROM (
        SELECT account_id, cents FROM {journal}.expected_credits
        UNION ALL
        SELECT account_id, sign * cents FROM {journal}.verdict_changes WHERE log AND cents IS NOT NULL
    ) c GROUP BY account_id
),
ledger_sum AS (
    SELECT account_id, sum(cents) AS cents FROM (
        SELECT account_id, cents FROM ledger_sums
        UNION ALL
        SELECT account_id, sign * cents FROM verdict_changes WHERE NOT log AND cents IS NOT NULL
    ) l GROUP BY account_id
)"""

# Whether both sums can be read: the journal and this schema have folded totals and no rebuild mark.
ACCOUNTS_READY_SQL = """
SELECT EXISTS (SELECT 1 FROM {journal}.verdict_totals) AND EXISTS (SELECT 1 FROM verdict_totals)
       AND NOT EXISTS (SELECT 1 FROM {journal}.verdict_changes WHERE log AND rebuild)
       AND NOT EXISTS (SELECT 1 FROM verdict_changes WHERE NOT log AND rebuild)"""


# --- the chart: credited cents per second, expected (the journal's) and applied (each copy) -------

# Cents per bucket of ``:width`` whole seconds, from the folded seconds and the queued changes; a
# bucket is there when rows are (as in state.CHART_TRUTH_SQL, which buckets the rows themselves).
CHART_TRUTH_SQL = """
SELECT floor(second / :width) * :width AS t, sum(cents) FROM (
    SELECT second, cents, rows FROM {journal}.chart_truth
    UNION ALL
    SELECT second, sign * chart_cents, sign FROM {journal}.verdict_changes WHERE log AND chart_cents IS NOT NULL
) s GROUP BY 1 HAVING sum(rows) > 0 ORDER BY 1"""
CHART_EFFECTS_SQL = """
SELECT floor(second / :width) * :width AS t, sum(cents) FROM (
    SELECT second, cents, rows FROM {s}.chart_effects
    UNION ALL
    SELECT second, sign * chart_cents, sign FROM {s}.verdict_changes WHERE NOT log AND chart_cents IS NOT NULL
) s GROUP BY 1 HAVING sum(rows) > 0 ORDER BY 1"""


def ready(session: Session, journal_schema: str, schemas: list[str]) -> bool:
    """Whether the journal's summaries and those of every schema in ``schemas`` can be read."""
    checks = [f"EXISTS (SELECT 1 FROM {quoted(journal_schema)}.verdict_changes WHERE log AND rebuild)"]
    checks += [f"NOT EXISTS (SELECT 1 FROM {quoted(schema)}.verdict_totals) OR EXISTS "
               f"(SELECT 1 FROM {quoted(schema)}.verdict_changes WHERE NOT log AND rebuild)"
               for schema in {journal_schema, *schemas}]
    return not session.execute(text("SELECT " + " OR ".join(f"({check})" for check in checks))).scalar()


# --- events at several offsets (the producer duplicates) ----------------------------------------

# The events the log holds at more than one offset, as folded, corrected by the queued log changes
# (their events counted again from the log: index lookups). Read in the journal's schema.
REPEATED_EVENTS_SQL = """
repeated AS (
    SELECT r.event_id FROM repeated_events r
    WHERE r.event_id NOT IN (SELECT event_id FROM verdict_changes WHERE log AND event_id IS NOT NULL)
    UNION
    SELECT c.event_id FROM (SELECT DISTINCT event_id FROM verdict_changes WHERE log AND event_id IS NOT NULL) c
    WHERE (SELECT count(*) FROM log_records x WHERE x.event_id = c.event_id) > 1
)"""

# Whether the journal's summaries can be read (built, no rebuild mark), in the journal's schema.
JOURNAL_READY_SQL = ("SELECT EXISTS (SELECT 1 FROM verdict_totals) "
                     "AND NOT EXISTS (SELECT 1 FROM verdict_changes WHERE log AND rebuild)")


# --- the folder ------------------------------------------------------------------------------

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
        conn.execute("SELECT set_config('search_path', %s, true)", [schema])
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


def summary_state(conn: Any) -> dict[str, Any]:
    """How far behind the current schema's summary is: queued changes and the last fold's time."""
    row = conn.execute(text("SELECT (SELECT count(*) FROM verdict_changes), (SELECT folded_at FROM verdict_totals)")
                       ).one()
    return {"queued": int(row[0]), "folded_at": row[1]}
