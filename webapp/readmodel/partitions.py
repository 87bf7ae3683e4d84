"""The partitions panel: each partition's log end (the log reader's, never the broker's high
watermark: wrong on Tansu for multi-record batches, docs/concepts/broker.md), committed offset per group, the
consumers' positions, and the strip of its newest offsets, each with what the group did with it and
what the lab's journal (``published_events``, "what the lab asked to publish") knows of it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..store.connection import CONTROL_SCHEMA
from ..store.consumers import LIVE_STATES
from ..store.schema import quoted
from . import ordering
from .groups import groups_list

STRIP_LENGTH = 24
C = CONTROL_SCHEMA


def settings(session: Session) -> dict[str, Any]:
    return dict(session.execute(text("SELECT key, value FROM settings")).all())


def partition_count(session: Session, default: int = 3) -> int:
    return int(settings(session).get("partitions", default))


@dataclass
class Cell:
    offset: int
    # pending | applied | applied-twice | re-applied | absorbed | dead-lettered | invalid | gap
    outcome: str
    event_id: str | None
    label: str
    deliveries: int
    # Same event id at another offset of this partition: a producer wrote the record twice (a
    # retry after a lost acknowledgement, a resend, another client).
    producer_retry: bool = False
    journaled: bool = False  # the lab's journal has a delivery report for this offset
    why: str | None = None
    # Why this record is out of order (its producer had already written a higher number here).
    out_of_order: str | None = None


@dataclass
class PartitionView:
    partition: int
    log_end: int
    committed: dict[str, int | None]
    positions: dict[str, int]
    cells: list[Cell] = field(default_factory=list)
    # The strip's records that landed out of order: offset -> why (also on their cells, if read).
    out_of_order: dict[int, str] = field(default_factory=dict)

    def lag(self, group_id: str) -> int:
        committed = self.committed.get(group_id)
        return self.log_end - (committed or 0)


# The newest offsets of one partition as the log holds them (log_records), each with what the
# group did with it (deliveries) and what the lab's journal knows of it (published_events).
CELLS_SQL = """
WITH window_ AS (
    SELECT generate_series(greatest(0, :log_end - :length), :log_end - 1) AS "offset"
),
delivered AS (
    SELECT "offset", count(*) FILTER (WHERE outcome = 'applied') AS applied,
           count(*) FILTER (WHERE outcome = 'absorbed') AS absorbed,
           count(*) FILTER (WHERE outcome = 'dead-lettered') AS dead,
           count(*) AS n
    FROM {effects}.deliveries WHERE partition = :partition AND group_id = :group
      AND "offset" >= :log_end - :length
    GROUP BY "offset"
)
SELECT w."offset", r.event_id::text AS event_id, r.type, r.account_id, r.amount_cents, r.status, r.balance_cents,
       r.score, r.invalid_reason, j.mode,
       coalesce(d.applied, 0) AS applied, coalesce(d.absorbed, 0) AS absorbed, coalesce(d.dead, 0) AS dead,
       coalesce(d.n, 0) AS n,
       -- another effect row of the same credit transaction (index lookups: no scan of all payments)
       r.type = 'credit' AND (SELECT count(*) FROM {effects}.payments p
                              WHERE p.transaction_id = r.transaction_id) > 1 AS doubled,
       r."offset" IS NOT NULL AS mirrored,
       j.mode IS NOT NULL AS journaled,
       -- every offset of this partition holding the same event, and which of them the journal knows
       c.copies,
       -- only for a record written more than once: the journal's event-id index is cold for new
       -- ids, and 24 random reads of it per partition were most of this query's time under load
       CASE WHEN cardinality(c.copies) > 1 THEN
           ARRAY(SELECT p."offset" FROM published_events p WHERE p.partition = :partition AND p."offset" IS NOT NULL
                 AND p.event_id = r.event_id ORDER BY 1)
       END AS journaled_at
FROM window_ w
LEFT JOIN log_records r ON r.partition = :partition AND r."offset" = w."offset"
LEFT JOIN LATERAL (SELECT ARRAY(SELECT x."offset" FROM log_records x
                                WHERE x.partition = :partition AND x.event_id = r.event_id ORDER BY 1) AS copies) c
       ON true
LEFT JOIN delivered d ON d."offset" = w."offset"
LEFT JOIN LATERAL (SELECT mode FROM published_events p WHERE p.partition = :partition AND p."offset" = w."offset"
                   ORDER BY p.id LIMIT 1) j ON true
ORDER BY w."offset"
"""

LABELS = {
    "credit": lambda r: f"credit {r.account_id} +{(r.amount_cents or 0) / 100:.2f}",
    "set_status": lambda r: f"status {r.account_id} = {r.status}",
    "set_balance": lambda r: f"balance {r.account_id} = {(r.balance_cents or 0) / 100:.2f}",
    "set_score": lambda r: f"score {r.account_id} = {r.score}",
}


def _cell(row) -> Cell:
    if not row.mirrored:
        # An offset with no record: a transaction marker or a compacted record (Kafka leaves gaps).
        return Cell(offset=row.offset, outcome="gap", event_id=None, label="no record at this offset",
                    deliveries=row.n)
    if row.dead:
        outcome = "dead-lettered"
    elif row.applied > 1 or (row.applied and row.doubled):
        # Red only for a delta really applied twice; a set written again changes nothing.
        outcome = "applied-twice" if row.type == "credit" else "re-applied"
    elif row.applied:
        outcome = "applied"
    elif row.absorbed:
        outcome = "absorbed"
    else:
        outcome = "pending"
    if row.invalid_reason is not None:
        label = ("poison pill: " if row.mode == "poison" else "invalid: ") + row.invalid_reason
    else:
        label = LABELS.get(row.type, lambda r: str(r.type))(row)
    if not row.journaled:
        label += " · not in the lab's journal (another producer, a raw record, or an ack that was lost)"
    copies = sorted(set(row.copies or []) | {row.offset}) if row.event_id else [row.offset]
    producer_retry = len(copies) > 1
    if producer_retry:
        others = ", ".join(str(o) for o in copies if o != row.offset)
        journaled_at = set(row.journaled_at or [])
        if journaled_at and any(o not in journaled_at for o in copies):
            label += (f" · record written by a producer retry (same event at offset {others}): an ack was lost "
                      "and the producer wrote it again")
        else:
            label += f" · the same event is also at offset {others}: written twice by its producer"
    return Cell(offset=row.offset, outcome=outcome, event_id=row.event_id, label=label, deliveries=row.n,
                producer_retry=producer_retry, journaled=bool(row.journaled))


# The log end per partition: where the log reader's mirror ends (the primary key answers).
LOG_ENDS_SQL = """
SELECT p, (SELECT max("offset") FROM log_records WHERE partition = p) + 1
FROM generate_series(0, :n - 1) AS p
"""


def log_ends(session: Session, effects_schema: str) -> dict[int, int]:
    """Each partition's log end as the log reader saw it (``effects_schema`` kept for callers)."""
    rows = session.execute(text(LOG_ENDS_SQL), {"n": partition_count(session)}).all()
    return {int(p): int(end) for p, end in rows if end is not None}


def partitions(session: Session, lab: Lab, group_id: str | None = None, cells: bool = True) -> list[PartitionView]:
    """Each partition's log end, committed offset per group, consumer positions, and its strip's
    records that landed out of order; with ``cells``, each of the strip's offsets too."""
    groups = groups_list(session)
    group = group_id or (groups[0]["group_id"] if groups else lab.group_id("payments"))
    effects = next((g["effects_schema"] for g in groups if g["group_id"] == group), lab.schema)
    ends = log_ends(session, effects)
    committed: dict[int, dict[str, int | None]] = {}
    for gid, partition, offset in session.execute(text("SELECT group_id, partition, committed FROM group_offsets")):
        committed.setdefault(partition, {})[gid] = offset
    positions: dict[int, dict[str, int]] = {}
    for name, pos in session.execute(text(
            f"SELECT name, positions FROM {C}.consumers WHERE lab = :lab AND state = ANY(:live)"),
            {"lab": lab.name, "live": list(LIVE_STATES)}):
        for partition, offset in (pos or {}).items():
            positions.setdefault(int(partition), {})[name] = offset
    views = []
    cells_sql = text(CELLS_SQL.format(effects=quoted(effects)))
    for partition in range(partition_count(session)):
        end = ends.get(partition, 0)
        view = PartitionView(partition, end, committed.get(partition, {}), positions.get(partition, {}))
        if end:
            found = ordering.out_of_order(session, partition, max(0, end - STRIP_LENGTH), end - 1)
            view.out_of_order = {offset: record.why for offset, record in found.items()}
        if end and cells:
            rows = session.execute(cells_sql, {"partition": partition, "log_end": end, "length": STRIP_LENGTH,
                                               "group": group}).all()
            view.cells = [_cell(row) for row in rows]
            for cell in view.cells:
                cell.out_of_order = view.out_of_order.get(cell.offset)
        views.append(view)
    return views
