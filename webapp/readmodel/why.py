"""Why, for every anomaly: one sentence a class can read aloud, built from the delivery ledger
(``deliveries``, in the effects schema) and the timeline (``timeline``, in the lab's schema).
A "generation" is the group's (the coordinator's epoch, bumped at every rebalance, the same for
every member of it), as each consumer read it at its last assignment.

Called by ``verdict.verdict`` only when the verdict has anomalies (or harmless re-applied sets),
for the first few of each kind: a handful of index lookups, never a scan of the log.
"""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.vocabulary import OUTSIDE_STRATEGY
from ..store.schema import quoted
from ..summary.reads import APPLIED_TWICE_SQL
from .accounts import accounts
from .outbox import republish_origin
from .regressions import CHANGED_SETS, REGRESSED_SETS

LIMIT = 10
CLOCK_STRATEGY = "natural-clock"  # writes status_at = now() (strategies/natural_clock.py)

# Transactions with more than one audit row (audit_events, the natural-audit strategies); ``:tx``
# narrows them to one (the drill-down).
AUDIT_DUPLICATED_SQL = """
SELECT transaction_id, count(*) AS audit_rows, count(DISTINCT event_id) AS events, min(account_id) AS account_id,
       min(action) AS action
FROM audit_events WHERE CAST(:tx AS text) IS NULL OR transaction_id = :tx
GROUP BY transaction_id HAVING count(*) > 1 ORDER BY transaction_id LIMIT :limit
"""

# Transactions whose delta was applied more than once in this copy (payment rows and ledger rows):
# a scan of every effect, for a lab without running summaries (summary.reads.APPLIED_TWICE_SQL
# finds them by index lookups).
DOUBLED_SQL = """
SELECT transaction_id, count(*) AS effects FROM (
    SELECT transaction_id FROM payments
    UNION ALL
    SELECT r.transaction_id FROM ledger l JOIN LATERAL (
        SELECT transaction_id FROM {journal}.log_records x WHERE x.event_id = l.event_id LIMIT 1) r ON true
) e GROUP BY transaction_id HAVING count(*) > 1 LIMIT :limit
"""

# The valid records of some transactions, in log order, with what the lab's journal knows of each.
RECORDS_SQL = """
SELECT r.transaction_id, r.partition, r."offset", r.event_id::text AS event_id, r.type, r.account_id,
       r.amount_cents, r.status, r.balance_cents, r.score,
       (SELECT j.mode FROM {journal}.published_events j WHERE j.partition = r.partition AND j."offset" = r."offset"
        ORDER BY j.id LIMIT 1) AS journal_mode
FROM {journal}.log_records r
WHERE r.transaction_id = ANY(:tx) AND r.invalid_reason IS NULL
ORDER BY r.transaction_id, r.partition, r."offset"
"""

# Every delivery of some records (by position) in this copy, oldest first.
DELIVERIES_SQL = """
SELECT d.id, d.group_id, d.consumer, d.partition, d."offset", d.generation, d.attempt, d.event_id::text AS event_id,
       d.transaction_id, d.strategy, d.outcome, d.reason, d.delivered_at
FROM deliveries d
WHERE d.event_id = ANY(CAST(:events AS uuid[]))
ORDER BY d.id  -- the order they were written (a zombie's transaction may have begun long before)
"""

# What happened to the consumers around those deliveries.
TIMELINE_SQL = """
SELECT at, kind, summary, detail FROM {journal}.timeline
WHERE at >= :since
  AND kind IN ('crashed', 'killed', 'frozen', 'thawed', 'rebalanced', 'offsets-reset', 'ttl', 'commit-failed',
               'started', 'stopped', 'error')
ORDER BY at, id LIMIT 2000
"""

# Transactions consumed with no effect (and not dead-lettered): the lost ones.
LOST_SQL = """
WITH committed AS (
    SELECT g.partition, max(g.committed) AS committed FROM {journal}.group_offsets g
    JOIN {journal}.consumer_groups cg ON cg.group_id = g.group_id AND cg.effects_schema = current_schema()
    GROUP BY g.partition
),
rec AS (
    SELECT r.transaction_id,
           coalesce(c.committed > r."offset", false)
           OR EXISTS (SELECT 1 FROM deliveries d WHERE d.partition = r.partition AND d."offset" = r."offset") AS consumed,
           EXISTS (SELECT 1 FROM deliveries d WHERE d.partition = r.partition AND d."offset" = r."offset"
                   AND d.outcome IN ('applied', 'dead-lettered')) AS settled
    FROM {journal}.log_records r LEFT JOIN committed c ON c.partition = r.partition
    WHERE r.invalid_reason IS NULL
)
SELECT transaction_id FROM rec GROUP BY transaction_id
HAVING bool_or(consumed) AND NOT bool_or(settled)
   AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.transaction_id = rec.transaction_id)
LIMIT :limit
"""

REAPPLIED_SQL = """
SELECT d.transaction_id, count(*) AS applied FROM deliveries d
WHERE d.outcome = 'applied' AND d.transaction_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM {journal}.log_records r WHERE r.transaction_id = d.transaction_id
                  AND r.invalid_reason IS NULL AND r.type = 'credit')
GROUP BY d.transaction_id HAVING count(*) > 1 LIMIT :limit
"""

# The sets a redelivery changed (regressions.py), with each application's time: the last one's is the
# row's status_at when the strategy wrote now() (deliveries.delivered_at is now() in local time, in
# the same transaction).
CHANGED_SQL = "WITH " + CHANGED_SETS + """
SELECT c.account_id, c.transaction_id, c.status, c.occurred_at, c.partition, c."offset", c.status_at,
       c.applications, last.consumer, last.generation, last.strategy,
       c.status_at = last.delivered_at::timestamptz AS written_at_application
FROM changed c
CROSS JOIN LATERAL (SELECT d.consumer, d.generation, d.strategy, d.delivered_at FROM deliveries d
                    WHERE d.transaction_id = c.transaction_id AND d.outcome = 'applied'
                    ORDER BY d.id DESC LIMIT 1) last
WHERE c.applications > 1 AND (CAST(:tx AS text) IS NULL OR c.transaction_id = :tx) LIMIT :limit
"""

ORPHANS_SQL = """
SELECT p.id, p.transaction_id, p.account_id, p.amount_cents, p.event_id::text AS event_id FROM payments p
WHERE NOT EXISTS (SELECT 1 FROM {journal}.log_records r WHERE r.transaction_id = p.transaction_id
                  AND r.invalid_reason IS NULL)
  AND NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.event_id = p.event_id)
ORDER BY p.id LIMIT :limit
"""

INVALID_KEPT_SQL = """
SELECT r.partition, r."offset", r.invalid_reason, d.consumer, d.outcome FROM {journal}.log_records r
JOIN LATERAL (SELECT consumer, outcome FROM deliveries x WHERE x.partition = r.partition AND x."offset" = r."offset"
              ORDER BY x.id DESC LIMIT 1) d ON true
WHERE r.invalid_reason IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM deliveries x WHERE x.partition = r.partition AND x."offset" = r."offset"
                  AND x.outcome = 'dead-lettered')
ORDER BY r.partition, r."offset" LIMIT :limit
"""

# The first regression of a few regressed set transactions (REGRESSED_SETS, verdict.py): the
# newer set it was written over, and the newer set applied after it again, if one was.
REGRESSED_SQL = "WITH " + REGRESSED_SETS + """
SELECT g.transaction_id, g.consumer, g.generation, g.strategy, g.partition, g."offset", g.type, g.account_id,
       g.status, g.balance_cents, g.score,
       (g.newest_before >> 40)::int AS newer_partition, g.newest_before & 1099511627775 AS newer_offset,
       n.status AS newer_status, n.balance_cents AS newer_balance_cents, n.score AS newer_score,
       o.partition AS overwritten_by_partition, o."offset" AS overwritten_by_offset
FROM (SELECT DISTINCT ON (transaction_id) * FROM regressions
      WHERE CAST(:tx AS text) IS NULL OR transaction_id = :tx ORDER BY transaction_id, id) g
JOIN {journal}.log_records n ON n.partition = (g.newest_before >> 40)::int
                            AND n."offset" = g.newest_before & 1099511627775
LEFT JOIN LATERAL (SELECT a.partition, a."offset" FROM applied a
                   WHERE a.account_id = g.account_id AND a.type = g.type AND a.id > g.id AND a.place >= g.newest_before
                   ORDER BY a.id LIMIT 1) o ON true
ORDER BY g.id LIMIT :limit
"""

# For an account whose status differs from the truth: the set delivery applied last.
LAST_SET_SQL = """
SELECT d.consumer, d.generation, d.strategy, d.partition, d."offset", r.status, r.transaction_id
FROM deliveries d JOIN {journal}.log_records r ON r.partition = d.partition AND r."offset" = d."offset"
WHERE d.outcome = 'applied' AND r.type = 'set_status' AND r.account_id = :account
ORDER BY d.id DESC LIMIT 1
"""
LATEST_STATUS_SQL = """
SELECT partition, "offset", status, transaction_id FROM (
    SELECT DISTINCT ON (transaction_id) partition, "offset", status, transaction_id FROM {journal}.log_records
    WHERE invalid_reason IS NULL AND type = 'set_status' AND account_id = :account
    ORDER BY transaction_id, partition, "offset") firsts
ORDER BY partition DESC, "offset" DESC LIMIT 1
"""


OUTSIDE_LANE_SQL = """
SELECT EXISTS (SELECT 1 FROM {journal}.consumer_groups
               WHERE effects_schema = current_schema() AND strategy = :strategy)
"""

# A learner's rows of one transaction, per event id (a learner's consumer writes payments rows).
OUTSIDE_ROWS_SQL = """
SELECT event_id::text AS event_id, count(*) AS rows FROM payments WHERE transaction_id = :tx GROUP BY event_id
"""


def _at(partition: int, offset: int) -> str:
    return f"P{partition}@{offset}"


def _describe(record: dict[str, Any]) -> str:
    kind = record.get("type")
    if kind == "credit":
        return f"credit {record['account_id']} +{(record['amount_cents'] or 0) / 100:.2f}"
    if kind == "set_status":
        return f"status {record['account_id']} = {record['status']}"
    if kind == "set_balance":
        return f"balance {record['account_id']} = {(record['balance_cents'] or 0) / 100:.2f}"
    if kind == "set_score":
        return f"score {record['account_id']} = {record['score']}"
    return kind or "record"


class _Context:
    """The records, deliveries and timeline of a few transactions, fetched once."""

    def __init__(self, session: Session, journal: str, transaction_ids: list[str]):
        self.session, self.journal = session, journal
        self._outside: bool | None = None
        rows = session.execute(text(RECORDS_SQL.format(journal=journal)), {"tx": transaction_ids}).mappings()
        self.records: dict[str, list[dict]] = {}
        for row in rows:
            self.records.setdefault(row["transaction_id"], []).append(dict(row))
        events = sorted({r["event_id"] for rs in self.records.values() for r in rs})
        self.deliveries: list[dict] = [dict(r) for r in session.execute(text(DELIVERIES_SQL), {"events": events}).mappings()] \
            if events else []
        self.timeline: list[dict] = []
        if self.deliveries:
            since = min(d["delivered_at"] for d in self.deliveries)
            self.timeline = [dict(r) for r in session.execute(text(TIMELINE_SQL.format(journal=journal)), {
                "since": since - _minutes(30)}).mappings()]

    @property
    def outside(self) -> bool:
        """The current effects schema is a learner's own consumer's lane: the lab writes no delivery
        rows there (it does not run that consumer), so a why reads the log and the effect rows."""
        if self._outside is None:
            self._outside = bool(self.session.execute(text(OUTSIDE_LANE_SQL.format(journal=self.journal)),
                                                      {"strategy": OUTSIDE_STRATEGY}).scalar())
        return self._outside

    def of(self, transaction_id: str) -> tuple[list[dict], list[dict]]:
        records = self.records.get(transaction_id, [])
        events = {r["event_id"] for r in records}
        return records, [d for d in self.deliveries if d["event_id"] in events or d["transaction_id"] == transaction_id]

    def happened(self, consumer: str | None, kinds: tuple[str, ...], after, before) -> list[dict]:
        return [t for t in self.timeline if t["kind"] in kinds and after <= t["at"] <= before
                and (consumer is None or (t["detail"] or {}).get("consumer") == consumer
                     or str(t["summary"]).startswith(f"{consumer} "))]


def _minutes(n: int) -> timedelta:
    return timedelta(minutes=n)


def _fault(entry: dict, consumer: str) -> str:
    detail = entry["detail"] or {}
    point = detail.get("point")
    if entry["kind"] == "crashed":
        return f"{consumer} was killed at {point or 'a crash point'} before its offset commit"
    if entry["kind"] == "killed":
        return f"{consumer} was killed (SIGKILL) before its offset commit"
    if entry["kind"] == "frozen":
        return f"{consumer} froze{f' at {point}' if point else ''} (SIGSTOP) before its offset commit"
    if entry["kind"] == "offsets-reset":
        return f"the group's offsets were reset ({entry['summary']})"
    if entry["kind"] == "ttl":
        return f"a TTL cleanup deleted its dedup key ({entry['summary']})"
    if entry["kind"] == "commit-failed":
        return f"{consumer}'s offset commit failed"
    return str(entry["summary"])


def why_applied_twice(ctx: _Context, transaction_id: str, effects: int) -> dict[str, Any]:
    records, deliveries = ctx.of(transaction_id)
    applied = [d for d in deliveries if d["outcome"] == "applied"]
    first = records[0] if records else None
    where = _at(first["partition"], first["offset"]) if first else f"transaction {transaction_id}"
    item = {"kind": "applied-twice", "severity": "bad", "transaction_id": transaction_id,
            "partition": first["partition"] if first else None, "offset": first["offset"] if first else None}
    if len(applied) < 2 and ctx.outside:
        item["why"] = why_outside_applied_twice(ctx, transaction_id, records, effects)
        return item
    if len(applied) < 2:
        extra = effects - len(applied)
        item["why"] = (f"{where} ({_describe(first) if first else transaction_id}) has {effects} effect rows but "
                       f"{len(applied)} delivery applied it: {extra} row(s) were written outside the consumers "
                       "(by hand in SQL?)")
        return item
    d1, d2 = applied[0], applied[1]
    p1, p2 = _at(d1["partition"], d1["offset"]), _at(d2["partition"], d2["offset"])
    strategy = d2["strategy"]
    if (d1["partition"], d1["offset"]) == (d2["partition"], d2["offset"]):
        # A zombie: frozen holding the record, its successor applied it, thawed it applied it again
        # (its delivery row is written after the thaw, though its transaction may have begun before).
        thawed = ctx.happened(d2["consumer"], ("thawed",), d1["delivered_at"], datetime.max)
        if d2["consumer"] != d1["consumer"] and thawed:
            frozen = ctx.happened(d2["consumer"], ("frozen",), d1["delivered_at"] - _minutes(30), d1["delivered_at"])
            point = (frozen[-1]["detail"] or {}).get("point") if frozen else None
            item["why"] = (f"{p1} was applied by {d1['consumer']} (generation {d1['generation']}) while "
                           f"{d2['consumer']} was frozen{f' at {point}' if point else ''} holding it; "
                           f"{d2['consumer']} thawed and, a zombie holding the group's stale generation "
                           f"{d2['generation']}, applied it again (`{strategy}`): the broker refuses a stale "
                           "generation's offset commit, not its write to PostgreSQL")
            return item
        faults = (ctx.happened(d1["consumer"], ("crashed", "killed", "frozen", "commit-failed"),
                               d1["delivered_at"], d2["delivered_at"])
                  or ctx.happened(None, ("offsets-reset", "ttl"), d1["delivered_at"], d2["delivered_at"]))
        resets = ctx.happened(None, ("offsets-reset",), d1["delivered_at"], d2["delivered_at"])
        ttl = ctx.happened(None, ("ttl",), d1["delivered_at"], d2["delivered_at"])
        if ttl and resets:
            reason = f"{_fault(ttl[-1], d1['consumer'])}, then {_fault(resets[-1], d1['consumer'])}"
        elif faults:
            reason = _fault(faults[0], d1["consumer"])
        else:
            reason = "its offset was not committed"
        if d2["consumer"] == d1["consumer"]:
            back = f"{d2['consumer']} rejoined the group (generation {d2['generation']})"
        else:
            back = f"{d2['consumer']} was assigned P{d2['partition']} (generation {d2['generation']})"
        item["why"] = (f"{p1} was applied by {d1['consumer']} (generation {d1['generation']}); {reason}; {back}, "
                       f"offset {d2['offset']} came back and `{strategy}` applied it again")
        return item
    if d1["event_id"] == d2["event_id"]:
        modes = {(r["partition"], r["offset"]): r["journal_mode"] for r in records}
        unjournaled = [pos for pos, mode in modes.items() if mode is None]
        relayed_twice = republish_origin(ctx.session, ctx.journal, d1["event_id"])
        if relayed_twice:
            origin = relayed_twice
        elif unjournaled and len(unjournaled) < len(modes):
            origin = "a producer retry after a lost ack wrote it again"
        elif "resend" in modes.values():
            origin = "the lab resent it (an application-level retry)"
        else:
            origin = "a producer wrote it twice"
        item["why"] = (f"the log holds the same event twice ({p1} and {p2}): {origin}; `{strategy}` applied both "
                       f"records ({d1['consumer']}, then {d2['consumer']})")
        return item
    item["why"] = (f"transaction {transaction_id} is in the log under two event ids ({p1} and {p2}): a source "
                   f"duplicate; `{strategy}` does not key on the transaction, so {d2['consumer']} applied it again")
    return item


def _same_event_origin(ctx: _Context, record: dict, records: list[dict]) -> str:
    """Why the log holds ``record``'s event again: the outbox relay, the lab's resend, or a producer's
    retry (a copy the lab's journal does not know, beside one it does)."""
    relayed_twice = republish_origin(ctx.session, ctx.journal, record["event_id"])
    if relayed_twice:
        return "the outbox relay published it again"
    if record["journal_mode"] == "resend":
        return "the lab resent it, an application's retry"
    same = [r for r in records if r["event_id"] == record["event_id"]]
    if any(r["journal_mode"] is None for r in same) and any(r["journal_mode"] is not None for r in same):
        return "a producer's retry after a lost ack"
    return "written again by a producer"


def why_outside_applied_twice(ctx: _Context, transaction_id: str, records: list[dict], effects: int) -> str:
    """A transaction a learner's consumer applied more than once. The lab has no delivery rows of a
    consumer it does not run: read which records of the transaction the log holds (the same event_id
    again, or a new one: a source duplicate) against the lane's rows per event_id, and say which key
    would have absorbed each extra row."""
    rows = dict(ctx.session.execute(text(OUTSIDE_ROWS_SQL), {"tx": transaction_id}).all())
    first = records[0] if records else None
    head = (f"{_at(first['partition'], first['offset'])} ({_describe(first)})" if first
            else f"transaction {transaction_id}")
    copies, seen = [], []
    for record in records:
        at = _at(record["partition"], record["offset"])
        if record["event_id"] in seen:
            copies.append(f"{at}, the same event_id again ({_same_event_origin(ctx, record, records)})")
        elif seen:
            copies.append(f"{at}, a new event_id for the same transaction_id (a source duplicate)")
        else:
            copies.append(f"{at}, event {record['event_id'][:8]}")
        seen.append(record["event_id"])
    in_log = {e: seen.count(e) for e in seen}
    applied = ", ".join(f"{n} of event {e[:8]}" for e, n in rows.items())
    by_event_id = sum(n - 1 for n in rows.values() if n > 1)
    past_event_id = max(0, sum(1 for n in rows.values() if n) - 1)
    redelivered = [e for e, n in rows.items() if n > in_log.get(e, 0)]
    keys = []
    if by_event_id:
        keys.append(f"{by_event_id} repeat{'s' if by_event_id == 1 else ''} an event_id already applied (a key on "
                    f"event_id would have absorbed {'it' if by_event_id == 1 else 'them'}"
                    + ("; more rows than the log holds copies: a redelivery before the offset commit"
                       if redelivered else "") + ")")
    if past_event_id:
        keys.append(f"{past_event_id} carr{'ies' if past_event_id == 1 else 'y'} a new event_id (only a key on "
                    f"transaction_id absorbs {'it' if past_event_id == 1 else 'them'})")
    key = "transaction_id" if past_event_id else "event_id (or transaction_id)"
    return (f"{head} has {effects} effect rows in your lane ({applied}); the lab records no deliveries of your "
            f"consumer, so from the log: transaction {transaction_id} is there {len(records)} "
            f"time{'s' if len(records) != 1 else ''}: {'; '.join(copies)}. Of the {effects - 1} extra "
            f"row{'s' if effects != 2 else ''}, " + "; ".join(keys)
            + f". A key on {key}, claimed in the same database transaction as the effect, absorbs every copy")


def why_lost(ctx: _Context, transaction_id: str) -> dict[str, Any]:
    records, deliveries = ctx.of(transaction_id)
    first = records[0] if records else None
    where = _at(first["partition"], first["offset"]) if first else transaction_id
    item = {"kind": "effect-lost", "severity": "bad", "transaction_id": transaction_id,
            "partition": first["partition"] if first else None, "offset": first["offset"] if first else None}
    absorbed = [d for d in deliveries if d["outcome"] == "absorbed"]
    if not deliveries and ctx.outside:
        item["why"] = (f"{where} ({_describe(first) if first else ''}) has no effect row in your lane, and your "
                       "consumer's group committed an offset past it: the offset commit went ahead of the effect "
                       "(or an effect's transaction rolled back after its offset was committed)")
        return item
    if not deliveries:
        item["why"] = (f"{where} ({_describe(first) if first else ''}) was never delivered to this copy: the group's "
                       "committed offset moved past it (an offset reset skipped it, or the topic's retention deleted it before "
                       "this group read it, and the group began at the log's new start)")
        return item
    d = absorbed[0] if absorbed else deliveries[0]
    faults = ctx.happened(None, ("crashed", "killed", "frozen"), d["delivered_at"] - _minutes(30), d["delivered_at"])
    own_faults = [f for f in faults if f"(partition {d['partition']}, offset {d['offset']})" in str(f["summary"])]
    if d["outcome"] == "absorbed" and d["attempt"] == 1 and not own_faults:
        # Its first delivery found the key taken, and nothing happened to it before: not a
        # redelivery, another record with the same key (a key that merges two real facts, like a
        # payload hash of two identical payments).
        item["why"] = (f"{where} ({_describe(first) if first else ''}) was never applied: on its first delivery "
                       f"{d['consumer']} (generation {d['generation']}) found its key already taken and "
                       f"`{d['strategy']}` absorbed it as already processed ({d['reason'] or 'no reason given'}): "
                       "a different fact with the same key, and the effect was lost")
        return item
    faults = own_faults or faults
    before = f"{_fault(faults[-1], (faults[-1]['detail'] or {}).get('consumer') or 'a consumer')}; " if faults else ""
    before = before.replace(" before its offset commit", " after its key was committed and before the effect")
    item["why"] = (f"{where} ({_describe(first) if first else ''}) was never applied: {before}when offset {d['offset']} "
                   f"came back, {d['consumer']} (generation {d['generation']}) found its key and `{d['strategy']}` "
                   "absorbed it as already processed: the effect was lost")
    return item


def why_reapplied(ctx: _Context, transaction_id: str, applied: int) -> dict[str, Any]:
    """A set applied more than once that neither regressed nor (as the verdict reads the row) changed:
    say what each application wrote, and whether that left the row as one application would."""
    records, deliveries = ctx.of(transaction_id)
    first = records[0] if records else None
    last = [d for d in deliveries if d["outcome"] == "applied"][-1:] or [None]
    d = last[0]
    who = f", last by {d['consumer']} (generation {d['generation']}, `{d['strategy']}`)" if d else ""
    where = _at(first["partition"], first["offset"]) if first else transaction_id
    if d is not None and d["strategy"] == CLOCK_STRATEGY and first and first["type"] == "set_status":
        # The verdict reads only each account's latest status: a clock's time a newer status has
        # overwritten since is no longer in the row, but the redelivery did change it then.
        outcome = ("each application wrote the status and its own time (`status_at = now()`), so the redelivery "
                   "changed the row when it ran; a newer status has overwritten both since")
    else:
        values = _describe(first) if first else "its values"
        from_event = f"{values}, status_at = its occurred_at" if first and first["type"] == "set_status" else values
        outcome = (f"each application wrote only values its event carries ({from_event}) and no newer set of the "
                   "account came between, so the row is what one application leaves: re-applied, unchanged")
    return {"kind": "re-applied", "severity": "neutral", "transaction_id": transaction_id,
            "partition": first["partition"] if first else None, "offset": first["offset"] if first else None,
            "why": (f"{where} ({_describe(first) if first else 'a set'}) was applied {applied} times{who}: {outcome}")}


def why_audit_duplicated(ctx: _Context, row: dict[str, Any]) -> dict[str, Any]:
    """A transaction with more than one audit row: each application's INSERT added one (a new id per
    execution), or its transaction came as several events (keyed on the event, each has its row)."""
    transaction_id = row["transaction_id"]
    records, deliveries = ctx.of(transaction_id)
    first = records[0] if records else None
    where = _at(first["partition"], first["offset"]) if first else f"transaction {transaction_id}"
    what = _describe(first) if first else f"{row['action']} on {row['account_id']}"
    applied = [d for d in deliveries if d["outcome"] == "applied"]
    who = ", ".join(f"{d['consumer']} (generation {d['generation']}, `{d['strategy']}`)" for d in applied[:4])
    by = f" by {who}" if who else ""
    extra = row["audit_rows"] - 1
    if row["events"] > 1:
        cause = (f"its transaction came as {row['events']} events with different event_ids (a source duplicate: the "
                 "same payment published again under a new event_id), and each event got its audit row — a key on "
                 "the event absorbs a redelivery of one event, not a new event; only a key on transaction_id "
                 "(business-key) absorbs it")
    else:
        cause = ("each application's INSERT INTO audit_events took a new id (gen_random_uuid()), so nothing "
                 "conflicted and every application of the same event_id added a row, while the set beside it wrote "
                 "the same account row again. Keyed on the event (id = event_id, ON CONFLICT (id) DO NOTHING, "
                 "natural-audit-keyed), every application after the first would have added none — an INSERT of "
                 "an audit event is not idempotent: each execution creates a new row")
    return {"kind": "audit-duplicated", "severity": "bad", "transaction_id": transaction_id,
            "partition": first["partition"] if first else None, "offset": first["offset"] if first else None,
            "why": (f"{where} ({what}) has {row['audit_rows']} audit rows, {extra} more than one per transaction: it was "
                    f"applied {len(applied)} time(s){by}; {cause}")}


def why_changed(row: dict[str, Any]) -> dict[str, Any]:
    """A set applied again whose row changed: a value it writes does not come from its event."""
    where = _at(row["partition"], row["offset"])
    source = ("each application wrote its own time (`status_at = now()`), not the event's"
              if row["written_at_application"] else "the row holds a time its event does not carry")
    return {"kind": "set-changed", "severity": "bad", "transaction_id": row["transaction_id"],
            "partition": row["partition"], "offset": row["offset"],
            "why": (f"{where} (status {row['account_id']} = {row['status']}, occurred_at {row['occurred_at']}) was "
                    f"applied {row['applications']} times, last by {row['consumer']} (generation {row['generation']}, "
                    f"`{row['strategy']}`): {row['account_id']}'s status_at is now {row['status_at']}, and {source}, so "
                    "the redelivery changed the row — a set is idempotent only if every value it writes comes from "
                    "the event")}


def why_regressed(row: dict[str, Any]) -> dict[str, Any]:
    """An older set applied after a newer one of the same account: a regression, lasting unless a
    newer set was applied again after it (a replay in log order converges)."""
    older = _describe(row)
    newer = _describe({**row, "status": row["newer_status"], "balance_cents": row["newer_balance_cents"],
                       "score": row["newer_score"]})
    until = (f"until {_at(row['overwritten_by_partition'], row['overwritten_by_offset'])} was applied again after it "
             "(a replay in log order converges)") if row["overwritten_by_partition"] is not None \
        else "and nothing newer was applied since: the account keeps the older value"
    return {"kind": "set-regressed", "severity": "bad" if row["overwritten_by_partition"] is None else "neutral",
            "transaction_id": row["transaction_id"], "partition": row["partition"], "offset": row["offset"],
            "why": (f"{_at(row['partition'], row['offset'])} ({older}) was applied by {row['consumer']} "
                    f"(generation {row['generation']}, `{row['strategy']}`) after the newer "
                    f"{_at(row['newer_partition'], row['newer_offset'])} ({newer}) had been: an older set written over "
                    f"a newer one, a regression, {until} — a set is idempotent, not commutative")}


def explain(session: Session, journal_schema: str, verdict, summarized: bool = False) -> list[dict[str, Any]]:
    """The anomalies of ``verdict`` (first few of each kind), each with its one-sentence ``why``;
    ``summarized``: the verdict was read from the running summaries, which can name them too."""
    journal = quoted(journal_schema)
    fmt = {"journal": journal}
    doubled_sql = APPLIED_TWICE_SQL if summarized else DOUBLED_SQL
    doubled = [] if not verdict.duplicates_applied else \
        session.execute(text(doubled_sql.format(**fmt)), {"limit": LIMIT}).all()
    lost = [] if not verdict.effects_lost else \
        session.execute(text(LOST_SQL.format(**fmt)), {"limit": LIMIT}).scalars().all()
    regressed = [] if not verdict.sets_regressed else \
        [dict(r) for r in session.execute(text(REGRESSED_SQL.format(**fmt)), {"limit": LIMIT, "tx": None}).mappings()]
    reapplied = [] if not verdict.sets_reapplied else \
        session.execute(text(REAPPLIED_SQL.format(**fmt)), {"limit": LIMIT}).all()
    changed = [] if not verdict.sets_changed_by_redelivery else \
        [dict(r) for r in session.execute(text(CHANGED_SQL.format(**fmt)), {"limit": LIMIT, "tx": None}).mappings()]
    audited = [] if not getattr(verdict, "audit_rows_duplicated", 0) else \
        [dict(r) for r in session.execute(text(AUDIT_DUPLICATED_SQL), {"limit": LIMIT, "tx": None}).mappings()]
    explained = {r["transaction_id"] for r in regressed} | {r["transaction_id"] for r in changed} \
        | {r["transaction_id"] for r in audited}
    reapplied = [(tx, n) for tx, n in reapplied if tx not in explained]
    ids = sorted({t for t, _ in doubled} | set(lost) | {t for t, _ in reapplied} | {r["transaction_id"] for r in audited})
    ctx = _Context(session, journal, ids) if ids else None
    result = [why_applied_twice(ctx, tx, n) for tx, n in doubled]
    result += [why_lost(ctx, tx) for tx in lost]
    if verdict.effects_without_record:
        for row in session.execute(text(ORPHANS_SQL.format(**fmt)), {"limit": LIMIT}).mappings():
            result.append({"kind": "effect-without-record", "severity": "bad", "transaction_id": row["transaction_id"],
                           "partition": None, "offset": None,
                           "why": (f"payment row #{row['id']} ({row['account_id']} +{row['amount_cents'] / 100:.2f}, "
                                   f"transaction {row['transaction_id']}) has no record in the log and no delivery: "
                                   "no consumer wrote it (a row added by hand in SQL)")})
    if verdict.invalid_not_dead_lettered:
        for row in session.execute(text(INVALID_KEPT_SQL.format(**fmt)), {"limit": LIMIT}).mappings():
            result.append({"kind": "not-dead-lettered", "severity": "bad", "transaction_id": None,
                           "partition": row["partition"], "offset": row["offset"],
                           "why": (f"{_at(row['partition'], row['offset'])} is invalid ({row['invalid_reason']}) and "
                                   f"{row['consumer']} {row['outcome']} it instead of sending it to the DLQ")})
    if verdict.statuses_mismatched and not verdict.pending:
        for line in accounts(session, journal_schema):
            if line.status == line.expected_status:
                continue
            latest = session.execute(text(LATEST_STATUS_SQL.format(**fmt)), {"account": line.id}).mappings().first()
            last = session.execute(text(LAST_SET_SQL.format(**fmt)), {"account": line.id}).mappings().first()
            said = f" ({_at(latest['partition'], latest['offset'])})" if latest else ""
            cause = (f": {_at(last['partition'], last['offset'])} (status {last['status']}) was applied last, by "
                     f"{last['consumer']} (generation {last['generation']}, `{last['strategy']}`) — a plain set is "
                     "idempotent, not commutative") if last else ""
            result.append({"kind": "status-mismatch", "severity": "bad", "transaction_id": None,
                           "partition": latest["partition"] if latest else None,
                           "offset": latest["offset"] if latest else None,
                           "why": f"{line.id} is {line.status} but its latest status transaction in the log{said} "
                                  f"sets {line.expected_status}{cause}"})
    result += [why_regressed(row) for row in regressed]
    result += [why_changed(row) for row in changed]
    result += [why_audit_duplicated(ctx, row) for row in audited]
    result += [why_reapplied(ctx, tx, n) for tx, n in reapplied]
    return result


EFFECTS_OF_SQL = """
SELECT (SELECT count(*) FROM payments WHERE transaction_id = :tx)
     + (SELECT count(*) FROM ledger WHERE event_id = ANY(CAST(:events AS uuid[])))
"""


def explain_transaction(session: Session, journal_schema: str, transaction_id: str) -> list[dict[str, Any]]:
    """The anomaly of one transaction in the session's current effects schema, if it has one."""
    journal = quoted(journal_schema)
    ctx = _Context(session, journal, [transaction_id])
    records, deliveries = ctx.of(transaction_id)
    if not records:
        return []
    applied = [d for d in deliveries if d["outcome"] == "applied"]
    if records[0]["type"] != "credit":
        audited = session.execute(text(AUDIT_DUPLICATED_SQL), {"limit": 1, "tx": transaction_id}).mappings().first()
        if audited:
            return [why_audit_duplicated(ctx, dict(audited))]
        if len(applied) < 2:
            return []
        fmt, params = {"journal": journal}, {"limit": 1, "tx": transaction_id}
        regressed = session.execute(text(REGRESSED_SQL.format(**fmt)), params).mappings().first()
        if regressed:
            return [why_regressed(dict(regressed))]
        changed = session.execute(text(CHANGED_SQL.format(**fmt)), params).mappings().first()
        if changed:
            return [why_changed(dict(changed))]
        return [why_reapplied(ctx, transaction_id, len(applied))]
    effects = session.execute(text(EFFECTS_OF_SQL), {"tx": transaction_id,
                                                     "events": [r["event_id"] for r in records]}).scalar()
    if effects > 1:
        return [why_applied_twice(ctx, transaction_id, effects)]
    if effects == 0 and deliveries and not any(d["outcome"] == "dead-lettered" for d in deliveries):
        return [why_lost(ctx, transaction_id)]
    return []
