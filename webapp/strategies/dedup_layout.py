"""The layout of ``processed_events``: plain, or range-partitioned by day of the event's own time.

Partitioned, the table is ``PARTITION BY RANGE (occurred_at)`` with ``PRIMARY KEY (event_id,
occurred_at)``: PostgreSQL requires a unique key on a partitioned table to hold the partition
key. That still catches every redelivery, because ``occurred_at`` is part of the event: a
redelivered record, a resend and a producer retry carry the same value, so the same event always
lands on the same key in the same partition. Processing time would not: a redelivery processed
after midnight would go to the next day's partition, whose key index has never seen the event,
and be applied twice. The TTL then drops whole days (``DROP TABLE`` of a partition: a catalog
change, whatever its rows) instead of deleting row by row, at the price of a day's granularity:
a key lives until its whole day is older than the TTL. Two more prices: the TTL counts from the
event's time, so consumer lag eats into it; and ``DROP TABLE`` of a partition takes an ACCESS
EXCLUSIVE lock on the parent, so it waits behind an open transaction on the table (a frozen
zombie) and the key inserts queued behind it wait too.

Day partitions are named ``processed_events_pYYYYMMDD`` (UTC days) and created ahead by the
agent's housekeeping; a ``DEFAULT`` partition takes an event time outside them (an old event re-sent,
a clock far off) and is cleaned by ``DELETE``.

Every function takes ``execute(statement, params)`` of a connection already in the schema
(psycopg's ``conn.execute`` or SQLAlchemy's ``conn.exec_driver_sql``), like ``ttl.cleanup``.
"""
from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone
from typing import Any, Callable

from ..store.schema import quoted

PLAIN = "plain"
PARTITIONED = "partitioned-by-day"
LAYOUTS = (PLAIN, PARTITIONED)
DAYS_AHEAD = 3
DAYS_BACK = 1
# At most this many day partitions are made for the days existing keys span when converting; keys
# of other days go to the default partition.
MAX_CONVERTED_DAYS = 400
PARTITION_NAME = re.compile(r"^processed_events_p(\d{8})$")

Execute = Callable[..., Any]

LAYOUT_SQL = "SELECT relkind FROM pg_class WHERE oid = to_regclass('processed_events')"

# The store's plain table (tables.processed_events), with the names SQLAlchemy gives it.
PLAIN_DDL = (
    "CREATE TABLE processed_events (\n"
    "    event_id UUID NOT NULL,\n"
    "    processed_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,\n"
    "    PRIMARY KEY (event_id)\n"
    ")",
    "CREATE INDEX ix_processed_events_processed_at ON processed_events (processed_at)",
)
PARTITIONED_DDL = (
    "CREATE TABLE processed_events (\n"
    "    event_id UUID NOT NULL,\n"
    "    occurred_at TIMESTAMP WITH TIME ZONE NOT NULL,\n"
    "    processed_at TIMESTAMP WITH TIME ZONE DEFAULT now() NOT NULL,\n"
    "    PRIMARY KEY (event_id, occurred_at)\n"
    ") PARTITION BY RANGE (occurred_at)",
    "CREATE INDEX ix_processed_events_processed_at ON processed_events (processed_at)",
    "CREATE TABLE processed_events_default PARTITION OF processed_events DEFAULT",
)
DAY_PARTITION_DDL = ("CREATE TABLE IF NOT EXISTS {name} PARTITION OF processed_events "
                     "FOR VALUES FROM ('{start} 00:00:00+00') TO ('{end} 00:00:00+00')")
DROP_PARTITION_SQL = "DROP TABLE {name}"
DEFAULT_CLEANUP_SQL = ("DELETE FROM processed_events_default "
                       "WHERE occurred_at < now() - make_interval(secs => %(seconds)s)")


class LayoutError(ValueError):
    """The layout cannot be changed now; the message names the field."""


def layout(execute: Execute) -> str:
    row = execute(LAYOUT_SQL, {}).fetchone()
    return PARTITIONED if row and row[0] == "p" else PLAIN


def partition_name(day: date) -> str:
    return f"processed_events_p{day:%Y%m%d}"


def day_of(name: str) -> date | None:
    match = PARTITION_NAME.match(name)
    return datetime.strptime(match.group(1), "%Y%m%d").date() if match else None


def day_partitions(execute: Execute) -> list[str]:
    """The day partitions that exist, oldest first."""
    rows = execute("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                   "WHERE i.inhparent = to_regclass('processed_events')", {}).fetchall()
    return sorted(name for (name,) in rows if day_of(name) is not None)


def create_day_partition(execute: Execute, day: date) -> bool:
    """Create ``day``'s partition unless it exists or the default partition already holds keys of that
    day (PostgreSQL would refuse: they stay in the default one, which the TTL cleans by DELETE)."""
    name = partition_name(day)
    if name in day_partitions(execute):
        return False
    start, end = day.isoformat(), (day + timedelta(days=1)).isoformat()
    held = execute("SELECT 1 FROM processed_events_default WHERE occurred_at >= %(start)s::timestamptz "
                   "AND occurred_at < %(end)s::timestamptz LIMIT 1",
                   {"start": f"{start} 00:00:00+00", "end": f"{end} 00:00:00+00"}).fetchone()
    if held:
        return False
    execute(DAY_PARTITION_DDL.format(name=name, start=start, end=end), {})
    return True


def ensure_partitions(execute: Execute, today: date | None = None) -> list[str]:
    """Day partitions from DAYS_BACK before ``today`` (UTC) to DAYS_AHEAD after it; the names created."""
    if layout(execute) != PARTITIONED:
        return []
    today = today or datetime.now(timezone.utc).date()
    days = [today + timedelta(days=n) for n in range(-DAYS_BACK, DAYS_AHEAD + 1)]
    return [partition_name(day) for day in days if create_day_partition(execute, day)]


def drop_expired(execute: Execute, seconds: float) -> int:
    """The TTL in the partitioned layout: drop every day partition whose whole day is older than
    ``seconds``, and delete the default partition's expired keys. Returns the keys removed (the
    dropped partitions' row estimates from the catalog: counting them would read them all)."""
    cutoff = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    removed = 0
    for name in day_partitions(execute):
        if datetime.combine(day_of(name) + timedelta(days=1), datetime.min.time(), timezone.utc) <= cutoff:
            estimate = execute("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE oid = to_regclass(%(name)s)",
                               {"name": name}).fetchone()[0]
            execute(DROP_PARTITION_SQL.format(name=name), {})
            removed += int(estimate or 0)
    return removed + execute(DEFAULT_CLEANUP_SQL, {"seconds": seconds}).rowcount


def convert(execute: Execute, target: str, log_schema: str) -> dict[str, int]:
    """Rebuild ``processed_events`` in the ``target`` layout, keys kept. Only while no consumer
    writes to it (the caller checks): the table is renamed, rebuilt, copied and dropped in the
    caller's transaction.

    To partitioned: each key's event time comes from the log mirror (``log_schema``.log_records);
    a key with no record there (a synthetic warm-up key, a record not mirrored yet) keeps its
    processing time as event time, and is counted as ``without_event_time``.
    """
    if target not in LAYOUTS:
        raise LayoutError(f"layout must be one of {', '.join(LAYOUTS)}")
    if layout(execute) == target:
        return {"keys": 0, "without_event_time": 0}
    execute("ALTER TABLE processed_events RENAME TO processed_events_old", {})
    execute("ALTER TABLE processed_events_old RENAME CONSTRAINT processed_events_pkey TO processed_events_old_pkey", {})
    execute("ALTER INDEX ix_processed_events_processed_at RENAME TO ix_processed_events_old_processed_at", {})
    if target == PLAIN:
        for statement in PLAIN_DDL:
            execute(statement, {})
        keys = execute("INSERT INTO processed_events (event_id, processed_at) "
                       "SELECT event_id, min(processed_at) FROM processed_events_old GROUP BY event_id", {}).rowcount
        execute("DROP TABLE processed_events_old CASCADE", {})
        return {"keys": keys, "without_event_time": 0}
    for statement in PARTITIONED_DDL:
        execute(statement, {})
    log_records = f'{quoted(log_schema)}.log_records'
    execute("CREATE TEMPORARY TABLE converted_keys ON COMMIT DROP AS "
            "SELECT k.event_id, coalesce(r.occurred_at::timestamptz, k.processed_at) AS occurred_at, "
            "       k.processed_at, r.occurred_at IS NULL AS without_event_time "
            # (validity tested outside the lookup by event id: summary/triggers.py's DIRTY says why)
            f"FROM processed_events_old k LEFT JOIN LATERAL (SELECT occurred_at FROM (SELECT occurred_at, invalid_reason "
            f"  FROM {log_records} l WHERE l.event_id = k.event_id OFFSET 0) l WHERE l.invalid_reason IS NULL LIMIT 1) r ON true",
            {})
    days = [day for (day,) in execute(
        "SELECT DISTINCT (occurred_at AT TIME ZONE 'UTC')::date FROM converted_keys ORDER BY 1 DESC LIMIT %(n)s",
        {"n": MAX_CONVERTED_DAYS}).fetchall()]
    for day in days:
        create_day_partition(execute, day)
    ensure_partitions(execute)
    keys = execute("INSERT INTO processed_events (event_id, occurred_at, processed_at) "
                   "SELECT event_id, occurred_at, processed_at FROM converted_keys", {}).rowcount
    without = execute("SELECT count(*) FROM converted_keys WHERE without_event_time", {}).fetchone()[0]
    # Dropped now, not only at commit: the caller converts the lab's lanes in the same transaction.
    execute("DROP TABLE converted_keys", {})
    execute("DROP TABLE processed_events_old CASCADE", {})
    return {"keys": keys, "without_event_time": int(without)}


# Synthetic keys for the dedup-at-scale exercise: set-based, no events, spread evenly over the last
# ``days`` days of event time (and processing time, so a plain table's TTL sees the same ages).
WARMUP_PLAIN_SQL = """
INSERT INTO processed_events (event_id, processed_at)
SELECT gen_random_uuid(), now() - make_interval(secs => %(span)s * n / %(keys)s)
FROM generate_series(%(first)s::bigint, %(last)s::bigint) n
"""
WARMUP_PARTITIONED_SQL = """
INSERT INTO processed_events (event_id, occurred_at, processed_at)
SELECT gen_random_uuid(), now() - make_interval(secs => %(span)s * n / %(keys)s),
       now() - make_interval(secs => %(span)s * n / %(keys)s)
FROM generate_series(%(first)s::bigint, %(last)s::bigint) n
"""


def prepare_warm_up(execute: Execute, days: int) -> bool:
    """Before a warm-up: in the partitioned layout, the day partitions its keys fall in. Whether
    the table is partitioned."""
    partitioned = layout(execute) == PARTITIONED
    if partitioned:
        today = datetime.now(timezone.utc).date()
        for n in range(days + 1):
            create_day_partition(execute, today - timedelta(days=n))
    return partitioned


def insert_warm_up_keys(execute: Execute, partitioned: bool, keys: int, days: int, first: int, last: int) -> int:
    """Keys ``first`` … ``last`` (1-based) of a warm-up of ``keys`` over ``days``: a slice, so that a
    long warm-up reports progress and can stop between slices; the keys inserted."""
    statement = WARMUP_PARTITIONED_SQL if partitioned else WARMUP_PLAIN_SQL
    return execute(statement, {"keys": keys, "span": days * 86400.0, "first": first, "last": last}).rowcount


def warm_up(execute: Execute, keys: int, days: int) -> int:
    """Insert ``keys`` synthetic keys spread over the last ``days`` days at once; the keys inserted."""
    return insert_warm_up_keys(execute, prepare_warm_up(execute, days), keys, days, 1, keys)
