"""The reads of the running summaries, each exact as of its statement's snapshot (the folded
totals plus what the queue changes): the verdict's counts (verdict_values), the lanes panel's first
divergent event (first_divergence), the "why" list's transactions applied twice
(APPLIED_TWICE_SQL), the accounts' sums, the chart's cents per second, the events at several
offsets, whether the summaries can be read (ready) and how far behind they are (summary_state).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..store.schema import quoted
from .facts import (
    CONTRIBUTION,
    FACTS,
    LEDGER_KEY,
    OUTCOMES,
    RECORDS_OF_ALL,
    RECORDS_OF_DIRTY,
    TOTALS,
    _contribution,
    _queued_outcomes,
)
from .triggers import CHANGES, COMMITTED, DIRTY

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
# bucket is there when rows are (as in readmodel/chart.py's CHART_TRUTH_SQL, which buckets the rows
# themselves).
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


def summary_state(conn: Any) -> dict[str, Any]:
    """How far behind the current schema's summary is: queued changes and the last fold's time."""
    row = conn.execute(text("SELECT (SELECT count(*) FROM verdict_changes), (SELECT folded_at FROM verdict_totals)")
                       ).one()
    return {"queued": int(row[0]), "folded_at": row[1]}
