"""What the triggers queue, as the summaries read it: the queue of one schema (its own effects'
changes and the journal's log changes, CHANGES), the committed offsets and where they moved
(COMMITTED), and every key a queued change may have moved (DIRTY).

The triggers themselves are the store's DDL: a lab schema is created with them
(store/verdict_changes.py, trigger_ddl); they copy the keys of every changed row of
``log_records``, ``deliveries``, ``payments`` and ``ledger`` into ``verdict_changes``.
"""
from __future__ import annotations

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
