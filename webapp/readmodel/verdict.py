"""Ground truth vs actual, computed in PostgreSQL from what the log holds and what was applied.

The log is the truth: ``log_records`` is the log reader's mirror of every record of the lab's
topic, whoever produced it (the lab's producer, a raw record typed in the UI, any other Kafka
client). The producer's journal (``published_events``) is only "what the lab asked to publish".

Ground truth is what exactly-once delivery would give: each distinct ``transaction_id`` applied
once, from its first valid record in log order (partition, offset); for sets, the value of the
latest distinct transaction, so an old one re-sent or re-delivered later does not move it.
Invalid records are expected in the dead-letter topic, not in balances.

The queries run in an effects schema (the lab's, or a lane's) and read the log from the lab's
schema, so lanes are judged against the same log.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..store.schema import quoted
from ..summary import reads as summary
from .accounts import AccountLine, accounts, accounts_sql  # noqa: F401  (AccountLine, accounts: re-exported)
from .regressions import CHANGED_SETS, REGRESSED_SETS
from .why import explain as explain_anomalies

SET_TYPES = ("set_status", "set_balance", "set_score")

# The first valid record of each transaction, in log order: the one exactly-once applies. The
# log reader marks it as it mirrors the log (``first_of_transaction``); an index holds them.
FIRSTS = """
firsts AS (
    SELECT transaction_id, type, account_id, amount_cents, status, balance_cents, score, partition, "offset"
    FROM {journal}.log_records WHERE first_of_transaction
)"""

# One hash aggregation per transaction over the log's records and the effects together (no
# DISTINCT, no sort, no join of two big aggregates). A record is consumed once a group applying
# to this copy has committed past it, or (beyond the committed offset: few records, index
# lookups) has a delivery of it.
VERDICT_SQL = """
WITH committed AS (
    -- how far the groups applying to this schema have committed, per partition
    SELECT g.partition, max(g.committed) AS committed
    FROM {journal}.group_offsets g
    JOIN {journal}.consumer_groups cg ON cg.group_id = g.group_id AND cg.effects_schema = current_schema()
    GROUP BY g.partition
),
dead AS (SELECT DISTINCT partition, "offset" FROM deliveries WHERE outcome = 'dead-lettered'),
records AS MATERIALIZED (
    SELECT r.partition, r."offset", r.transaction_id, r.event_id, r.type, r.invalid_reason,
           CASE WHEN r."offset" < c.committed THEN true
                ELSE EXISTS (SELECT 1 FROM deliveries d WHERE d.partition = r.partition AND d."offset" = r."offset")
           END AS consumed,
           x.partition IS NOT NULL AS dead
    FROM {journal}.log_records r
    LEFT JOIN committed c ON c.partition = r.partition
    LEFT JOIN dead x ON x.partition = r.partition AND x."offset" = r."offset"
),
facts AS (
    -- keyed by 64-bit hashes of the ids: integers hash and compare fast; two of 100,000 ids
    -- share a hash with odds near 1e-10
    SELECT hashtextextended(transaction_id, 0) AS tx, uuid_hash_extended(event_id, 0) AS event,
           type = 'credit' AS delta, consumed, dead, 0 AS effect,
           -- a set leaves no effect row: what the consumers say they applied is its trace
           CASE WHEN type <> 'credit' THEN (SELECT count(*) FROM deliveries d WHERE d.partition = r.partition
                                            AND d."offset" = r."offset" AND d.outcome = 'applied') ELSE 0 END AS applied
    FROM records r WHERE invalid_reason IS NULL
    UNION ALL
    -- the effects of credits: payment rows, and ledger rows (natural) through their event's record
    SELECT hashtextextended(transaction_id, 0), NULL, NULL, NULL, NULL, 1, 0 FROM payments
    UNION ALL
    -- (the transaction of its event's first record in the log)
    SELECT hashtextextended(coalesce(r.transaction_id, 'ledger:' || l.event_id), 0), NULL, NULL, NULL, NULL, 1, 0
    -- (validity tested outside the lookup by event id: verdict_summary's DIRTY says why)
    FROM ledger l LEFT JOIN LATERAL (SELECT transaction_id
                                     FROM (SELECT transaction_id, invalid_reason, partition, "offset"
                                           FROM {journal}.log_records x WHERE x.event_id = l.event_id OFFSET 0) x
                                     WHERE x.invalid_reason IS NULL
                                     ORDER BY x.partition, x."offset" LIMIT 1) r ON true
),
per_transaction AS MATERIALIZED (
    SELECT tx, count(event) AS records, min(event) <> max(event) AS several_events,
           coalesce(bool_or(delta), false) AS delta, coalesce(bool_or(consumed), false) AS consumed,
           coalesce(bool_or(dead), false) AS dead, sum(effect) AS effects, sum(applied) AS applied
    FROM facts GROUP BY tx
),
judged AS (
    SELECT count(*) FILTER (WHERE records > 0) AS transactions,
           coalesce(sum(greatest(effects - 1, 0)) FILTER (WHERE records > 0 AND delta), 0) AS duplicates_applied,
           count(*) FILTER (WHERE records > 0 AND delta AND effects > 1) AS transactions_applied_twice,
           count(*) FILTER (WHERE records > 0 AND CASE WHEN delta THEN effects ELSE applied END = 0
                            AND consumed AND NOT dead) AS effects_lost,
           count(*) FILTER (WHERE records > 0 AND several_events
                            AND CASE WHEN delta THEN effects ELSE applied END = 1) AS source_duplicates_absorbed,
           count(*) FILTER (WHERE records > 0 AND several_events) AS source_duplicates,
           count(*) FILTER (WHERE records > 0 AND CASE WHEN delta THEN effects ELSE applied END = 0
                            AND NOT consumed) AS not_yet_applied,
           count(*) FILTER (WHERE records > 0 AND NOT delta AND applied > 1) AS sets_reapplied
    FROM per_transaction
),
orphans AS (
    -- effect rows whose transaction has no valid record in the log: written by a consumer (it has
    -- a delivery: the reader has not mirrored that record yet) or by no consumer at all (by hand)
    SELECT count(*) FILTER (WHERE NOT delivered) AS by_hand, count(*) FILTER (WHERE delivered) AS unmirrored
    FROM (SELECT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = e.event_id) AS delivered
          FROM (SELECT event_id, transaction_id FROM payments
                UNION ALL
                SELECT l.event_id, NULL FROM ledger l
                WHERE NOT EXISTS (SELECT 1 FROM {journal}.log_records x WHERE x.event_id = l.event_id)) e
          WHERE e.transaction_id IS NULL OR hashtextextended(e.transaction_id, 0) IN (
              SELECT tx FROM per_transaction WHERE records = 0)) o
),
outcomes AS (
    SELECT count(*) FILTER (WHERE outcome = 'absorbed') AS absorbed,
           count(*) FILTER (WHERE outcome = 'dead-lettered') AS dead
    FROM deliveries WHERE outcome <> 'applied'
),
log AS (
    SELECT count(*) AS records, count(*) FILTER (WHERE NOT consumed) AS pending,
           count(*) FILTER (WHERE invalid_reason IS NOT NULL) AS invalid,
           count(*) FILTER (WHERE invalid_reason IS NOT NULL AND consumed AND NOT dead) AS invalid_kept
    FROM records
)
SELECT j.transactions, j.duplicates_applied, j.transactions_applied_twice, j.effects_lost,
       j.source_duplicates_absorbed, j.source_duplicates, outcomes.absorbed AS redeliveries_absorbed,
       outcomes.dead AS dead_letters, j.not_yet_applied,
       log.records, log.pending AS records_pending, log.invalid AS invalid_records,
       log.invalid_kept AS invalid_not_dead_lettered, j.sets_reapplied,
       orphans.by_hand AS effects_without_record, orphans.unmirrored AS effects_not_yet_mirrored
FROM judged j, outcomes, log, orphans
"""

REGRESSED_SETS_SQL = "WITH " + REGRESSED_SETS + """
SELECT count(DISTINCT transaction_id) AS sets_regressed,
       count(DISTINCT transaction_id) FILTER (WHERE applications > 1) AS reapplied_sets_regressed
FROM regressions
"""

SETS_CHANGED_SQL = "WITH " + CHANGED_SETS + """
SELECT count(*) FROM changed WHERE applications > 1
"""

# Audit rows (audit_events, the natural-audit strategies) beyond one per transaction: exactly-once
# writes one per transaction, so each extra row is a delivery, a resend or a source duplicate the
# trail recorded again. Usually an empty table: one index-only aggregate.
AUDIT_DUPLICATED_SQL = """
SELECT coalesce(sum(audit_rows - 1), 0) FROM (
    SELECT count(*) AS audit_rows FROM audit_events GROUP BY transaction_id HAVING count(*) > 1) t
"""

# Accounts whose balance or status differs from the log's truth.
MISMATCHES_SQL = """
SELECT count(*) FILTER (WHERE actual <> expected) AS balances_mismatched,
       count(*) FILTER (WHERE status <> expected_status OR (expected_score IS NOT NULL AND score IS DISTINCT FROM expected_score))
           AS statuses_mismatched
FROM ({accounts}) a
"""


@dataclass(frozen=True)
class Verdict:
    transactions: int
    duplicates_applied: int
    transactions_applied_twice: int
    effects_lost: int
    source_duplicates_absorbed: int
    source_duplicates: int
    redeliveries_absorbed: int
    dead_letters: int
    not_yet_applied: int
    # --- from the log (added by "the log is the truth") ---
    records: int = 0                     # records in the log (valid or not)
    records_pending: int = 0             # records no group applying to this copy has consumed yet
    invalid_records: int = 0             # records that are not valid events: expected in the DLQ
    invalid_not_dead_lettered: int = 0   # invalid records consumed without reaching the DLQ
    sets_reapplied: int = 0              # sets applied more than once (regressed, changed, or the same row again)
    effects_without_record: int = 0      # effect rows no record in the log explains (added by hand)
    effects_not_yet_mirrored: int = 0    # effects of records the log reader has not mirrored yet
    balances_mismatched: int = 0
    statuses_mismatched: int = 0
    sets_regressed: int = 0              # sets applied after a newer set of their account: a regression
    reapplied_sets_regressed: int = 0    # of those, sets applied more than once (in sets_reapplied too)
    sets_changed_by_redelivery: int = 0  # sets applied again whose row changed: a value not from the event (now())
    audit_rows_duplicated: int = 0       # audit rows beyond one per transaction (an INSERT per execution)
    anomalies: tuple = field(default=(), compare=False)  # one dict per anomaly, with its "why"

    @property
    def pending(self) -> int:
        """Records (or effects) not settled yet: what "pending: N records not yet applied" counts."""
        return self.records_pending + self.effects_not_yet_mirrored

    @property
    def sets_reapplied_harmless(self) -> int:
        """Sets applied more than once with nothing newer applied before them, writing the same row
        again each time."""
        return self.sets_reapplied - self.reapplied_sets_regressed - self.sets_changed_by_redelivery

    @property
    def status(self) -> str:
        """``no-events``, ``anomalies`` (red), ``pending`` (neutral) or ``exactly-once`` (green)."""
        if self.duplicates_applied or self.effects_lost or self.effects_without_record or self.invalid_not_dead_lettered \
                or self.audit_rows_duplicated:
            return "anomalies"
        if self.pending or self.not_yet_applied:
            return "pending" if self.records or self.effects_not_yet_mirrored else "no-events"
        if self.balances_mismatched or self.statuses_mismatched or self.sets_changed_by_redelivery:
            return "anomalies"
        return "exactly-once" if self.records else "no-events"

    @property
    def exactly_once(self) -> bool:
        """Green: every record consumed, every transaction applied once, every balance and status right."""
        return self.status == "exactly-once"

    def as_dict(self) -> dict:
        data = asdict(self)
        data["anomalies"] = [dict(a) for a in self.anomalies]
        return {**data, "exactly_once": self.exactly_once, "status": self.status, "pending": self.pending,
                "sets_reapplied_harmless": self.sets_reapplied_harmless}


def _journal(journal_schema: str) -> str:
    return quoted(journal_schema)


def verdict(session: Session, journal_schema: str, explain: bool = True, exact: bool = False) -> Verdict:
    """The verdict of the current schema's copy of the accounts against the log of ``journal_schema``:
    from the running summaries, or (``exact``, or before they are built) computed whole."""
    values = None if exact else summary.verdict_values(session, journal_schema)
    summarized = values is not None
    if values is None:
        # The per-transaction hash table holds one entry per transaction: give it the memory to stay
        # off disk (100,000 transactions spill out of the default 4 MB).
        session.execute(text("SET LOCAL work_mem = '64MB'"))
        row = session.execute(text(VERDICT_SQL.format(journal=_journal(journal_schema)))).mappings().one()
        values = {key: int(value or 0) for key, value in row.items()}
    mismatch = session.execute(text(MISMATCHES_SQL.format(
        accounts=accounts_sql(session, journal_schema, exact)))).one()
    values["balances_mismatched"], values["statuses_mismatched"] = int(mismatch[0]), int(mismatch[1])
    if values["sets_reapplied"] or values["statuses_mismatched"]:
        # Looked for only then: an older set applied after a newer one either was applied twice
        # (a resend, a redelivery) or, applied once and not overwritten since, left a status wrong.
        regressed = session.execute(text(REGRESSED_SETS_SQL.format(journal=_journal(journal_schema)))).one()
        values["sets_regressed"], values["reapplied_sets_regressed"] = int(regressed[0]), int(regressed[1])
    if values["sets_reapplied"]:
        values["sets_changed_by_redelivery"] = int(session.execute(text(SETS_CHANGED_SQL.format(
            journal=_journal(journal_schema)))).scalar_one())
    values["audit_rows_duplicated"] = int(session.execute(text(AUDIT_DUPLICATED_SQL)).scalar_one())
    result = Verdict(**values)
    if explain and (result.status == "anomalies" or result.sets_reapplied or result.sets_regressed):
        anomalies = explain_anomalies(session, journal_schema, result, summarized=summarized)
        result = Verdict(**values, anomalies=tuple(anomalies))
    return result
