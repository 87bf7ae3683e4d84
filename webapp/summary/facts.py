"""The facts of keys: VERDICT_SQL's per_transaction, per key (RECORDS_OF_DIRTY, RECORDS_OF_ALL,
FACTS, the columns of ``verdict_keys``), and what a set of key rows adds to the verdict's totals
(CONTRIBUTION, OUTCOMES, TOTALS). Shared by the fold (fold.py) and the reads (reads.py).
"""
from __future__ import annotations

from .triggers import RECORD_KEY

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
