"""The dedup panel: each dedup table's keys (counted exactly while small, else the catalog's
estimate), size, oldest key's age and newest keys.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.vocabulary import DEDUP_TABLES, EXACT_COUNT_BELOW

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


# Every dedup table's exact count and oldest key's age in one round trip: what a scenario waits on.
DEDUP_COUNTS_SQL = " UNION ALL ".join(
    f"SELECT '{table}' AS dedup_table, count(*) AS keys, extract(epoch FROM now() - min(processed_at)) AS oldest_age "
    f"FROM {table}" for table in DEDUP_TABLES)


def dedup_counts(session: Session) -> dict[str, dict[str, Any]]:
    """Per dedup table: its keys, counted exactly, and the oldest key's age in seconds (None: empty)."""
    return {row.dedup_table: {"rows": row.keys, "oldest_age": float(row.oldest_age) if row.oldest_age is not None
                              else None}
            for row in session.execute(text(DEDUP_COUNTS_SQL))}
