"""The read model: what the panels and ``GET /api/v1/state`` show, read from PostgreSQL only.

Kafka facts arrive here through the lab agent (committed offsets in ``group_offsets``) and the
consumers (positions in their control rows); the log-end offset comes from the journal of
delivery reports and from deliveries, not from the broker's high watermark (BROKER.md).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from . import verdict as verdict_module
from .db import CONTROL_SCHEMA
from .labs import Lab

STRIP_LENGTH = 24
C = CONTROL_SCHEMA
LIVE_STATES = ("starting", "running", "frozen", "stepping")


def settings(session: Session) -> dict[str, Any]:
    return dict(session.execute(text("SELECT key, value FROM settings")).all())


def partition_count(session: Session, default: int = 3) -> int:
    return int(settings(session).get("partitions", default))


@dataclass
class Cell:
    offset: int
    outcome: str  # pending | applied | applied-twice | absorbed | dead-lettered | lost
    event_id: str | None
    label: str
    deliveries: int


@dataclass
class PartitionView:
    partition: int
    log_end: int
    committed: dict[str, int | None]
    positions: dict[str, int]
    cells: list[Cell] = field(default_factory=list)

    def lag(self, group_id: str) -> int:
        committed = self.committed.get(group_id)
        return self.log_end - (committed or 0)


CELLS_SQL = """
WITH window_ AS (
    SELECT :partition AS partition, generate_series(greatest(0, :log_end - :length), :log_end - 1) AS "offset"
),
journal AS (
    SELECT DISTINCT ON ("offset") "offset", event_id, type, account_id, amount_cents, status, mode
    FROM published_events WHERE partition = :partition AND "offset" >= :log_end - :length
    ORDER BY "offset", id
),
delivered AS (
    SELECT "offset", max(event_id::text) AS event_id,
           count(*) FILTER (WHERE outcome = 'applied') AS applied,
           count(*) FILTER (WHERE outcome = 'absorbed') AS absorbed,
           count(*) FILTER (WHERE outcome = 'dead-lettered') AS dead,
           count(*) AS n
    FROM {effects}.deliveries WHERE partition = :partition AND group_id = :group
      AND "offset" >= :log_end - :length
    GROUP BY "offset"
),
twice AS (
    SELECT transaction_id FROM {effects}.payments GROUP BY transaction_id HAVING count(*) > 1
)
SELECT w."offset", coalesce(j.event_id::text, d.event_id) AS event_id, j.type, j.account_id, j.amount_cents,
       j.status, j.mode, coalesce(d.applied, 0), coalesce(d.absorbed, 0), coalesce(d.dead, 0), coalesce(d.n, 0),
       EXISTS (SELECT 1 FROM {effects}.payments p JOIN twice t USING (transaction_id)
               WHERE p.event_id::text = coalesce(j.event_id::text, d.event_id)) AS doubled
FROM window_ w LEFT JOIN journal j USING ("offset") LEFT JOIN delivered d USING ("offset")
ORDER BY w."offset"
"""


def _cell(row) -> Cell:
    offset, event_id, type_, account, amount, status, mode, applied, absorbed, dead, n, doubled = row
    if dead:
        outcome = "dead-lettered"
    elif applied > 1 or (applied and doubled):
        outcome = "applied-twice"
    elif applied:
        outcome = "applied"
    elif absorbed:
        outcome = "absorbed"
    else:
        outcome = "pending"
    if mode == "poison":
        label = "poison pill"
    elif type_ == "credit":
        label = f"credit {account} +{amount / 100:.2f}"
    elif type_ == "set_status":
        label = f"status {account} = {status}"
    else:
        label = "record written by a producer retry" if event_id else "record"
    return Cell(offset=offset, outcome=outcome, event_id=event_id, label=label, deliveries=n)


def log_ends(session: Session, effects_schema: str) -> dict[int, int]:
    rows = session.execute(text(
        f'SELECT partition, max("offset") + 1 FROM ('
        f'  SELECT partition, "offset" FROM published_events WHERE "offset" IS NOT NULL'
        f'  UNION ALL SELECT partition, "offset" FROM "{effects_schema}".deliveries) o GROUP BY partition')).all()
    return {int(p): int(end) for p, end in rows}


def partitions(session: Session, lab: Lab, group_id: str | None = None) -> list[PartitionView]:
    """Each partition's recent offsets, log end, committed offset per group, consumer positions."""
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
    cells_sql = text(CELLS_SQL.format(effects=f'"{effects}"'))
    for partition in range(partition_count(session)):
        end = ends.get(partition, 0)
        view = PartitionView(partition, end, committed.get(partition, {}), positions.get(partition, {}))
        if end:
            rows = session.execute(cells_sql, {"partition": partition, "log_end": end, "length": STRIP_LENGTH,
                                               "group": group})
            view.cells = [_cell(row) for row in rows]
        views.append(view)
    return views


def groups_list(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(text("SELECT group_id, strategy, effects_schema FROM consumer_groups ORDER BY created_at"))
    return [dict(row._mapping) for row in rows]


def consumers(session: Session, lab: Lab) -> list[dict[str, Any]]:
    rows = session.execute(text(
        f"SELECT c.*, extract(epoch FROM now() - c.heartbeat_at) AS heartbeat_age, g.strategy "
        f"FROM {C}.consumers c LEFT JOIN consumer_groups g USING (group_id) WHERE c.lab = :lab ORDER BY c.id"),
        {"lab": lab.name}).mappings().all()
    committed = {(g, p): o for g, p, o in session.execute(text("SELECT group_id, partition, committed FROM group_offsets"))}
    result = []
    for row in rows:
        item = dict(row)
        # Redelivery window: already-applied records that come back if this consumer dies now.
        item["redelivery_window"] = sum(
            max(0, int(applied) - (committed.get((row["group_id"], int(p))) or 0))
            for p, applied in (row["applied_positions"] or {}).items() if int(p) in (row["assigned"] or []))
        item["heartbeat_age"] = float(row["heartbeat_age"]) if row["heartbeat_age"] is not None else None
        result.append(item)
    return result


def dedup_tables(session: Session, ttl_seconds: float | None) -> list[dict[str, Any]]:
    tables = []
    for table, key in (("processed_events", "event_id"), ("processed_transactions", "transaction_id")):
        count, oldest = session.execute(text(
            f"SELECT count(*), extract(epoch FROM now() - min(processed_at)) FROM {table}")).one()
        newest = session.execute(text(
            f"SELECT {key}::text AS key, processed_at FROM {table} ORDER BY processed_at DESC LIMIT 5")).all()
        tables.append({"table": table, "key": key, "count": count,
                       "oldest_age": float(oldest) if oldest is not None else None,
                       "newest": [{"key": k, "processed_at": at} for k, at in newest], "ttl_seconds": ttl_seconds})
    return tables


TIMELINE_SQL = """
SELECT at, kind, summary FROM (
    SELECT at, kind, summary FROM timeline
    UNION ALL
    SELECT delivered_at, outcome,
           consumer || ' ' || outcome || ' p' || partition || '@' || "offset"
           || CASE WHEN attempt > 1 THEN ' (delivery #' || attempt || ')' ELSE '' END
           || coalesce(': ' || reason, '')
    FROM deliveries
) t ORDER BY at DESC LIMIT :limit
"""


def timeline(session: Session, limit: int = 30) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in session.execute(text(TIMELINE_SQL), {"limit": limit})]


def agent_health(session: Session) -> dict[str, Any]:
    row = session.execute(text(
        f"SELECT id, kafka_ok, kafka_error, extract(epoch FROM now() - heartbeat_at) AS age "
        f"FROM {C}.agents ORDER BY heartbeat_at DESC LIMIT 1")).mappings().first()
    return dict(row) if row else {}


def accounts(session: Session, lab: Lab) -> list[verdict_module.AccountLine]:
    return verdict_module.accounts(session, lab.schema)


def verdict(session: Session, lab: Lab) -> verdict_module.Verdict:
    return verdict_module.verdict(session, lab.schema)


def now() -> datetime:
    return datetime.now(timezone.utc)
