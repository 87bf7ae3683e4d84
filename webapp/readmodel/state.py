"""The read model: what the panels and ``GET /api/v1/state`` show, read from PostgreSQL only.

Kafka facts arrive here through the lab agent (committed offsets in ``group_offsets``), the
consumers (positions in their control rows) and the log reader (``log_records``: every record of
the topic, whoever wrote it). The log-end offset is the log reader's: the last record it fetched,
never the broker's high watermark (wrong on Tansu for multi-record batches, BROKER.md). The
journal (``published_events``) is shown beside the log as "what the lab asked to publish".
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from . import verdict as verdict_module
from ..summary import reads as summary
from . import why as why_module
from . import ordering
from . import outbox as outbox_readmodel
from . import notifications as notifications_readmodel
from . import scale as scale_readmodel
from ..store.connection import CONTROL_SCHEMA
from ..domain.vocabulary import AGENT_FRESH_SECONDS, DEDUP_TABLES, EXACT_COUNT_BELOW
from ..store.labs import Lab
from ..store import faultproxies
from ..store.consumers import LIVE_STATES
from ..store.schema import enter, quoted

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
    cells_sql = text(CELLS_SQL.format(effects=f'"{effects}"'))
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


def groups_list(session: Session) -> list[dict[str, Any]]:
    rows = session.execute(text("SELECT group_id, strategy, effects_schema FROM consumer_groups ORDER BY created_at"))
    return [dict(row._mapping) for row in rows]


def groups_kafka_settings(session: Session) -> list[dict[str, Any]]:
    """Each group's throughput settings (ops/throughput.py): batch size, commit mode, static membership."""
    rows = session.execute(text("SELECT group_id, strategy, batch_size, commit_mode, static_membership "
                                "FROM consumer_groups ORDER BY created_at"))
    return [dict(row._mapping) for row in rows]


# Consumers blocked on a lock, and who holds it: backends of this lab's consumers (their effects
# connections are named "lab <lab> <consumer> effects") waiting on a lock, each with the backends
# that block it and how long it has waited (pg_locks.waitstart).
LOCK_WAITS_SQL = """
SELECT split_part(w.application_name, ' ', 3) AS consumer, w.pid,
       extract(epoch FROM now() - (SELECT min(l.waitstart) FROM pg_locks l WHERE l.pid = w.pid AND NOT l.granted))
           AS seconds,
       h.pid AS holder_pid, h.application_name AS holder_application, h.state AS holder_state,
       extract(epoch FROM now() - h.xact_start) AS holder_transaction_seconds
FROM pg_stat_activity w
CROSS JOIN LATERAL unnest(pg_blocking_pids(w.pid)) AS blocker(pid)
JOIN pg_stat_activity h ON h.pid = blocker.pid
WHERE w.application_name LIKE :prefix AND w.wait_event_type = 'Lock'
ORDER BY w.pid, h.pid
"""


def lock_waits(session: Session, lab: Lab, states: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """Per consumer name: what it waits on, e.g. "waiting on a lock held by c1 (frozen) for 12 s"."""
    prefix = f"lab {lab.name} "
    result: dict[str, dict[str, Any]] = {}
    for row in session.execute(text(LOCK_WAITS_SQL), {"prefix": prefix.replace("_", "\\_") + "%"}).mappings():
        holder_app = row["holder_application"] or ""
        holder = holder_app.split(" ")[2] if holder_app.startswith(prefix) and holder_app.count(" ") >= 2 else None
        holder_state = (states or {}).get(holder) if holder else None
        seconds = float(row["seconds"]) if row["seconds"] is not None else None
        who = (f"{holder} ({holder_state})" if holder and holder_state else holder) or \
            f"another session (pid {row['holder_pid']}, {row['holder_state']})"
        text_ = f"waiting on a lock held by {who}" + (f" for {int(seconds)} s" if seconds is not None else "")
        result.setdefault(row["consumer"], {"holder": holder, "holder_pid": row["holder_pid"],
                                            "holder_state": holder_state, "seconds": seconds, "text": text_})
    return result


def consumers(session: Session, lab: Lab) -> list[dict[str, Any]]:
    rows = session.execute(text(
        f"SELECT c.*, extract(epoch FROM now() - c.heartbeat_at) AS heartbeat_age, g.strategy "
        f"FROM {C}.consumers c LEFT JOIN consumer_groups g USING (group_id) WHERE c.lab = :lab ORDER BY c.id"),
        {"lab": lab.name}).mappings().all()
    committed = {(g, p): o for g, p, o in session.execute(text("SELECT group_id, partition, committed FROM group_offsets"))}
    blocked = commit_blocks(session, lab)
    result = []
    for row in rows:
        item = dict(row)
        # Redelivery window: already-applied records that come back if this consumer dies now.
        item["redelivery_window"] = sum(
            max(0, int(applied) - (committed.get((row["group_id"], int(p))) or 0))
            for p, applied in (row["applied_positions"] or {}).items() if int(p) in (row["assigned"] or []))
        item["heartbeat_age"] = float(row["heartbeat_age"]) if row["heartbeat_age"] is not None else None
        item["commits_blocked_for"] = blocked.get(row["name"])  # seconds left, or None
        result.append(item)
    if any(item["state"] in LIVE_STATES for item in result):
        waits = lock_waits(session, lab, {item["name"]: item["state"] for item in result})
        for item in result:
            item["waiting_on"] = waits.get(item["name"])
    return result


# A dedup table's size, with its partitions' (a partitioned processed_events keeps its rows in them;
# a plain table has no partition tree): the catalog's row estimate, the bytes of tables and indexes.
DEDUP_SIZE_SQL = """
SELECT coalesce(sum(greatest(c.reltuples, 0)), 0)::bigint, coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint
FROM pg_class c WHERE c.oid IN (SELECT relid FROM pg_partition_tree(CAST(:table AS regclass))
                                UNION SELECT CAST(:table AS regclass))
"""


def dedup_tables(session: Session, ttl_seconds: float | None, exact: bool = False) -> list[dict[str, Any]]:
    """Each dedup table's keys (counted exactly while small or when ``exact``, else the catalog's
    estimate, marked), size, oldest key's age and newest keys."""
    tables = []
    for table, key in DEDUP_TABLES.items():
        # Rows and bytes (table and indexes) grow with every event until a TTL cleanup deletes old keys.
        estimate, size = session.execute(text(DEDUP_SIZE_SQL), {"table": table}).one()
        estimated = not exact and estimate >= EXACT_COUNT_BELOW
        count = estimate if estimated else session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()
        oldest = session.execute(text(f"SELECT extract(epoch FROM now() - min(processed_at)) FROM {table}")).scalar()
        newest = session.execute(text(
            f"SELECT {key}::text AS key, processed_at FROM {table} ORDER BY processed_at DESC LIMIT 5")).all()
        tables.append({"table": table, "key": key, "count": count, "count_estimated": estimated, "size_bytes": size,
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
    """The report that matters most: among agents that reported lately, one that cannot reach Kafka
    (several agents may serve one database); else the newest report."""
    row = session.execute(text(
        f"SELECT id, kafka_ok, kafka_error, extract(epoch FROM now() - heartbeat_at) AS age FROM {C}.agents "
        "ORDER BY heartbeat_at > now() - make_interval(secs => :fresh) DESC, kafka_ok, heartbeat_at DESC LIMIT 1"),
        {"fresh": AGENT_FRESH_SECONDS}).mappings().first()
    return dict(row) if row else {}


def accounts(session: Session, lab: Lab, exact: bool = False) -> list[verdict_module.AccountLine]:
    return verdict_module.accounts(session, lab.schema, exact=exact)


def verdict(session: Session, lab: Lab, exact: bool = False) -> verdict_module.Verdict:
    return verdict_module.verdict(session, lab.schema, exact=exact)


# Records in the log whose event id is at more than one offset, as the log reader saw them. The
# journal knows each record the lab's producer got a delivery report for: an event at several
# offsets with some of them unknown to the journal (and one known) was written again by the
# producer's retry after a lost ack; resends are journaled each time; another producer's
# records are in no journal at all. ``repeated``: the events at several offsets (REPEATED_EVENTS_SQL,
# or their running summary, summary.REPEATED_EVENTS_SQL).
PRODUCER_DUPLICATES_SQL = """
WITH {repeated}
SELECT x.event_id::text, count(*) AS records,
       count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM published_events j WHERE j.partition = r.partition
                                          AND j."offset" = r."offset")) AS unreported,
       array_agg(r.partition || '@' || r."offset" ORDER BY r.partition, r."offset") AS positions
FROM repeated x JOIN log_records r ON r.event_id = x.event_id
GROUP BY x.event_id ORDER BY min(r.partition), min(r."offset")
"""


# Events at more than one offset: few, found by one pass over the event ids.
REPEATED_EVENTS_SQL = """
repeated AS (
    SELECT event_id FROM log_records WHERE event_id IS NOT NULL GROUP BY event_id HAVING count(*) > 1
)"""


def producer_duplicates(session: Session, lab: Lab, listed: int = 20, exact: bool = False) -> dict[str, Any]:
    """Producer-side duplicates: records in the log with an event id at more than one offset.

    ``producer_retry_duplicates`` counts the records written by a producer retry after a lost
    ack (the lab's journal has a report for another copy, none for these); ``extra_records``
    counts every record beyond the first of an event (resends, other producers' repeats).
    """
    # The events at several offsets, from the running summary when it can be read (summary/reads.py).
    summarized = not exact and session.execute(text(summary.JOURNAL_READY_SQL)).scalar()
    repeated = summary.REPEATED_EVENTS_SQL if summarized else REPEATED_EVENTS_SQL
    rows = session.execute(text(PRODUCER_DUPLICATES_SQL.format(repeated=repeated))).all()
    retried = [row for row in rows if 0 < row.unreported < row.records]
    return {
        "producer_retry_duplicates": sum(row.unreported for row in retried),
        "events_at_several_offsets": len(rows),
        "extra_records": sum(row.records - 1 for row in rows),
        "events": [{"event_id": row.event_id, "positions": row.positions, "written_by_retry": row.unreported}
                   for row in retried[:listed]],
    }


def now() -> datetime:
    return datetime.now(timezone.utc)


# --- the live dashboard's additions: change fingerprints, lanes, chart series, drill-down ------

def effects_schemas(session: Session, lab: Lab) -> list[str]:
    """The lab's own schema first, then each strategy lane's copy of the accounts."""
    rows = session.execute(text("SELECT DISTINCT effects_schema FROM consumer_groups")).scalars()
    return [lab.schema] + sorted(s for s in rows if s != lab.schema and lab.owns_schema(s))


FINGERPRINT_SQL = """
SELECT
  (SELECT oid::text FROM pg_namespace WHERE nspname = current_schema()) AS schema,
  -- what the lab asked to publish, and what the log holds (the reader's newest batch)
  concat_ws(':', (SELECT coalesce(max(id), 0) FROM published_events),
            (SELECT max(read_at) FROM log_records)) AS journal,
  (SELECT coalesce(max(id), 0) FROM timeline) AS timeline,
  (SELECT md5(coalesce(string_agg(concat_ws(':', group_id, strategy, effects_schema, batch_size, commit_mode, static_membership), ',' ORDER BY group_id), ''))
     FROM consumer_groups) AS groups,
  (SELECT md5(coalesce(string_agg(concat_ws(':', group_id, partition, committed), ',' ORDER BY group_id, partition), ''))
     FROM group_offsets) AS offsets,
  (SELECT md5(coalesce(string_agg(key || '=' || value::text, ',' ORDER BY key), '')) FROM settings) AS settings
"""

# Heartbeats land every second; only a stale one (a frozen process) changes what the consumers
# panel shows, so a fresh heartbeat, or a dead process's last one, does not count as a change.
CONSUMERS_FINGERPRINT_SQL = f"""
SELECT md5(coalesce(string_agg(concat_ws('|', id, name, group_id, pid, state, armed_point, armed_action, armed_always,
       step_mode, step_at, assigned::text, positions::text, applied_positions::text, generation, applied, absorbed,
       dead_lettered, commit_failures, last_error, exit_code,
       CASE WHEN heartbeat_at IS NULL OR state <> ALL(:live) THEN 'none'
            WHEN now() - heartbeat_at < interval '3 seconds' THEN 'fresh'
            ELSE floor(extract(epoch FROM now() - heartbeat_at))::text END), ',' ORDER BY id), ''))
FROM {C}.consumers WHERE lab = :lab
"""

# Effects, deliveries and dedup keys of one schema. Effects and ledger rows are written in the
# delivery's transaction, so the newest delivery id covers them; a dedup key can be committed
# alone (eventid-split), and TTL cleanup deletes the oldest keys, hence min and max.
EFFECTS_FINGERPRINT_SQL = (
    "SELECT concat_ws(':', (SELECT max(id) FROM {s}.deliveries), (SELECT max(id) FROM {s}.payments), "
    + ", ".join(f"(SELECT max(processed_at) FROM {{s}}.{table}), (SELECT min(processed_at) FROM {{s}}.{table})"
                for table in DEDUP_TABLES) + ")")
# The oldest key of every dedup table: the same arithmetic as dedup_tables, so the age shown and the
# age fingerprinted agree.
OLDEST_KEY_AGE_SQL = ("SELECT extract(epoch FROM now() - least("
                      + ", ".join(f"(SELECT min(processed_at) FROM {table})" for table in DEDUP_TABLES) + "))")


AGENT_STALE_SECONDS = 5.0


def commit_blocks(session: Session, lab: Lab) -> dict[str, float]:
    """The lab's consumers whose offset commits the fault proxy keeps from the broker, with the
    seconds left (webapp/faultproxy/control.py); across every proxy row, the default one in practice."""
    return faultproxies.blocked_commits_of(session.connection(), None, lab.client_id(""))


def fingerprint_parts(session: Session, lab: Lab) -> dict[str, Any]:
    """Cheap facts that change whenever something a panel shows changes (a few index lookups)."""
    parts = dict(session.execute(text(FINGERPRINT_SQL)).mappings().one())
    parts["consumers"] = (session.execute(text(CONSUMERS_FINGERPRINT_SQL),
                                          {"lab": lab.name, "live": list(LIVE_STATES)}).scalar_one()
                          + "|" + ",".join(sorted(commit_blocks(session, lab))))  # a block set or ended
    agent = agent_health(session)
    parts["agent"] = (bool(agent) and agent["age"] is not None and float(agent["age"]) < AGENT_STALE_SECONDS,
                      agent.get("kafka_ok"), agent.get("kafka_error"))
    parts["effects"] = ";".join(
        session.execute(text(EFFECTS_FINGERPRINT_SQL.format(s=quoted(schema)))).scalar_one() or ""
        for schema in effects_schemas(session, lab))
    oldest_age = session.execute(text(OLDEST_KEY_AGE_SQL)).scalar_one()
    parts["oldest_key_age"] = float(oldest_age) if oldest_age is not None else None
    parts["outbox"] = outbox_readmodel.fingerprint(session)
    parts["notifications"] = notifications_readmodel.fingerprint(session)
    parts.update(scale_readmodel.fingerprint_parts(session))  # load runs, dedup tables at scale
    return parts


@dataclass
class Lane:
    """One copy of the accounts and the groups applying to it."""
    schema: str
    name: str
    groups: list[dict[str, Any]]
    balances: dict[str, int]  # account id -> actual cents
    first_divergence: dict[str, Any] | None

    @property
    def strategies(self) -> str:
        return ", ".join(sorted({g["strategy"] for g in self.groups})) or "no group"


def lanes(session: Session, lab: Lab, exact: bool = False) -> list[Lane]:
    """Every copy of the accounts (the lab's own and each lane's), balances side by side, each with
    its first divergent event (summary.first_divergence: from the running summaries when
    they are built, else, or when ``exact``, judged whole)."""
    groups = groups_list(session)
    schemas = effects_schemas(session, lab)
    summarized = not exact and summary.ready(session, lab.schema, schemas)
    result = []
    connection = session.connection()
    try:
        for schema in schemas:
            balances = dict(session.execute(text(
                f"SELECT a.id, (a.balance + coalesce((SELECT sum(amount_cents) FROM {quoted(schema)}.ledger l "
                f"WHERE l.account_id = a.id), 0))::bigint FROM {quoted(schema)}.accounts a ORDER BY a.id")).all())
            enter(connection, schema)  # the copy's own effects and summary
            first = summary.first_divergence(session, lab.schema, exact=not summarized)
            name = "lab" if schema == lab.schema else lab.lane_of(schema)
            result.append(Lane(schema, name, [g for g in groups if g["effects_schema"] == schema], balances, first))
    finally:
        enter(connection, lab.schema)
    return result


CHART_BUCKETS = 240

# Cumulative credited cents over time: ``truth`` (each transaction once, when the log reader saw its
# first record: the same clock as the effects' rows)
# and the effects of each copy of the accounts, summed into time buckets of ``:width`` seconds.
CHART_TRUTH_SQL = """
SELECT floor(date_part('epoch', at) / :width) * :width AS t, sum(amount_cents) FROM (
    SELECT amount_cents, read_at AS at FROM log_records WHERE first_of_transaction AND type = 'credit'
) truth GROUP BY 1 ORDER BY 1
"""
CHART_EFFECTS_SQL = """
SELECT floor(date_part('epoch', at) / :width) * :width AS t, sum(amount_cents) FROM (
    SELECT applied_at AS at, amount_cents FROM {s}.payments
    UNION ALL SELECT recorded_at, amount_cents FROM {s}.ledger
) effects GROUP BY 1 ORDER BY 1
"""
# The time span, to choose the bucket width: ids grow with time, so the first and last rows by
# id (index lookups) stand for the earliest and latest; buckets are cut from the data itself,
# so a row just outside this span still lands in a bucket of its own.
CHART_SPAN_SQL = """
SELECT extract(epoch FROM least((SELECT min(read_at) FROM log_records){lanes_min})),
       extract(epoch FROM greatest((SELECT max(read_at) FROM log_records){lanes_max}))
"""


def chart_series(session: Session, lab: Lab, exact: bool = False) -> dict[str, Any]:
    """Expected (exactly-once) vs actual credited total over time, one actual line per copy."""
    schemas = effects_schemas(session, lab)
    lanes_min = "".join(f", (SELECT applied_at FROM {quoted(s)}.payments ORDER BY id LIMIT 1)" for s in schemas)
    lanes_max = "".join(f", (SELECT applied_at FROM {quoted(s)}.payments ORDER BY id DESC LIMIT 1)" for s in schemas)
    low, high = session.execute(text(CHART_SPAN_SQL.format(lanes_min=lanes_min, lanes_max=lanes_max))).one()
    if low is None:
        return {"x": [], "series": []}
    low, high = float(low), float(high)
    width = max(0.05, (high - low) / CHART_BUCKETS)
    truth_sql, effects_sql = CHART_TRUTH_SQL, CHART_EFFECTS_SQL
    if width >= 1:
        # Buckets of whole seconds: the running sums per second (summary/reads.py) add up to the
        # same buckets as the rows themselves, so either may answer.
        width = float(math.ceil(width))
        if not exact and summary.ready(session, lab.schema, schemas):
            truth_sql, effects_sql = summary.CHART_TRUTH_SQL, summary.CHART_EFFECTS_SQL
    steps = {"expected": dict(session.execute(text(truth_sql.format(journal=quoted(lab.schema))), {"width": width}).all())}
    for schema in schemas:
        label = "actual" if schema == lab.schema else f"actual · lane {lab.lane_of(schema)}"
        steps[label] = dict(session.execute(text(effects_sql.format(s=quoted(schema))), {"width": width}).all())
    times = sorted({float(t) for amounts in steps.values() for t in amounts})
    if not times:  # records, but no credit and no effect yet: nothing to draw
        return {"x": [], "series": []}
    # One point a bucket before the first, so every line starts from zero.
    x = [times[0] - width] + times
    series = []
    for label, amounts in steps.items():
        total, values = 0, [0]
        by_time = {float(t): int(cents) for t, cents in amounts.items()}
        for t in times:
            total += by_time.get(t, 0)
            values.append(total)
        series.append({"label": label, "values": values})
    return {"x": x, "series": series}


def event_drilldown(session: Session, lab: Lab, event_id: str | None = None,
                    position: tuple[int, int] | None = None) -> dict[str, Any]:
    """Everything about one event (or one record, by partition and offset): journal rows, every
    delivery in every copy of the accounts, the effect rows of its transaction, its dedup keys."""
    journal_where = "event_id = CAST(:event AS uuid)" if event_id else 'partition = :partition AND "offset" = :offset'
    params = {"event": event_id, "partition": position[0] if position else None,
              "offset": position[1] if position else None}
    # What the log holds: the record at that position, or every record of the event.
    log = [dict(r) for r in session.execute(text(
        'SELECT partition, "offset", "timestamp", key, headers, value, event_id::text AS event_id, transaction_id, '
        "type, account_id, amount_cents, status, balance_cents, score, invalid_reason, read_at "
        f"FROM log_records WHERE {journal_where} ORDER BY partition, \"offset\""), params).mappings()]
    if event_id is None and log and log[0]["event_id"]:
        event_id = params["event"] = log[0]["event_id"]
        journal_where = "event_id = CAST(:event AS uuid)"
    journal = [dict(r) for r in session.execute(text(
        "SELECT id, event_id::text AS event_id, transaction_id, type, account_id, amount_cents, status, mode, "
        f'idempotent_producer, partition, "offset", error, published_at FROM published_events WHERE {journal_where} '
        "ORDER BY id"), params).mappings()]
    if event_id is None and journal and journal[0]["event_id"]:
        event_id = params["event"] = journal[0]["event_id"]
    transaction_ids = sorted({j["transaction_id"] for j in journal + log if j["transaction_id"]})
    deliveries, effects, keys, why = [], [], [], []
    for schema in effects_schemas(session, lab):
        copy = "lab" if schema == lab.schema else lab.lane_of(schema)
        where = "event_id = CAST(:event AS uuid)" if event_id else 'partition = :partition AND "offset" = :offset'
        deliveries += [{"lane": copy, **r} for r in session.execute(text(
            f'SELECT id, group_id, consumer, partition, "offset", generation, attempt, strategy, outcome, reason, '
            f"delivered_at FROM {quoted(schema)}.deliveries WHERE {where} ORDER BY delivered_at, id"), params).mappings()]
        if transaction_ids:
            effects += [{"lane": copy, "table": "payments", **r} for r in session.execute(text(
                f"SELECT id::text AS id, event_id::text AS event_id, transaction_id, account_id, amount_cents, "
                f"applied_at AS at FROM {quoted(schema)}.payments WHERE transaction_id = ANY(:tx) ORDER BY applied_at"),
                {"tx": transaction_ids}).mappings()]
            keys += [{"lane": copy, "table": "processed_transactions", "key": k, "at": at} for k, at in session.execute(
                text(f"SELECT transaction_id, processed_at FROM {quoted(schema)}.processed_transactions "
                     "WHERE transaction_id = ANY(:tx)"), {"tx": transaction_ids})]
        if event_id:
            effects += [{"lane": copy, "table": "ledger", "id": "–", "transaction_id": None, **r} for r in session.execute(
                text(f"SELECT event_id::text AS event_id, account_id, amount_cents, recorded_at AS at "
                     f"FROM {quoted(schema)}.ledger WHERE event_id = CAST(:event AS uuid)"), params).mappings()]
            for table in ("processed_events", "seen_events"):  # the unique key table, and check-then-act's
                keys += [{"lane": copy, "table": table, "key": k, "at": at} for k, at in session.execute(
                    text(f"SELECT event_id::text, processed_at FROM {quoted(schema)}.{table} "
                         "WHERE event_id = CAST(:event AS uuid)"), params)]
        # Why, for an anomaly of this transaction in this copy: read from its ledger and the timeline.
        enter(session.connection(), schema)
        for transaction_id in transaction_ids:
            why += [{"lane": copy, **item} for item in why_module.explain_transaction(session, lab.schema, transaction_id)]
        enter(session.connection(), lab.schema)
    return {"event_id": event_id, "position": position, "log": log, "journal": journal,
            "transaction_ids": transaction_ids, "deliveries": deliveries, "effects": effects, "dedup_keys": keys,
            "why": why}
