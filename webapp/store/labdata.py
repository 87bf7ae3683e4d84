"""A lab's own control rows: its settings, its consumer groups and its timeline entries.

Every function takes a connection that already works in the lab's schema (``store.schema``)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.dialects.postgresql import insert

from . import timeline
from .tables import consumer_groups as groups_table
from .tables import settings as settings_table


def settings(conn: Connection, prefix: str = "") -> dict[str, Any]:
    query = select(settings_table.c.key, settings_table.c.value)
    if prefix:
        query = query.where(settings_table.c.key.startswith(prefix))
    return {key: value for key, value in conn.execute(query)}


def put_setting(conn: Connection, key: str, value: Any) -> None:
    statement = insert(settings_table).values(key=key, value=value)
    conn.execute(statement.on_conflict_do_update(index_elements=[settings_table.c.key],
                                                 set_={"value": statement.excluded.value}))


def add_group(conn: Connection, group_id: str, strategy: str, effects_schema: str) -> bool:
    """Create a consumer group row; False when it exists already."""
    created = conn.execute(insert(groups_table).values(group_id=group_id, strategy=strategy,
                                                       effects_schema=effects_schema)
                           .on_conflict_do_nothing(index_elements=[groups_table.c.group_id])
                           .returning(groups_table.c.group_id)).first()
    return created is not None


def group(conn: Connection, group_id: str) -> Any:
    """A consumer group's row (its settings), or None."""
    return conn.execute(select(groups_table).where(groups_table.c.group_id == group_id)).first()


def update_group(conn: Connection, group_id: str, **values: Any) -> bool:
    """Change a group's settings; False when there is no such group."""
    changed = conn.execute(update(groups_table).where(groups_table.c.group_id == group_id).values(**values)
                           .returning(groups_table.c.group_id)).first()
    return changed is not None


def say(conn: Connection, kind: str, summary: str, **detail: Any) -> None:
    """Append a timeline entry (the timeline module owns the statement, shared with psycopg writers)."""
    timeline.record(conn.exec_driver_sql, kind, summary, **detail)


MIRRORED = ('SELECT count(*) FROM log_records WHERE (partition, "offset") IN '
            "(SELECT * FROM unnest(CAST(:partitions AS int[]), CAST(:offsets AS bigint[])))")


def wait_mirrored(engine, schema_name: str, records: list[dict[str, Any]], timeout: float = 5.0,
                  interval: float = 0.02) -> bool:
    """Wait until the log reader mirrored every record (``partition``, ``offset``) just produced
    to the lab whose schema is ``schema_name``, so the caller's next read of the lab includes
    them. False after ``timeout`` seconds (the reader is behind or stopped): never raises for it.
    Each look borrows a connection for one statement."""
    from sqlalchemy import text

    from ..domain.waits import WaitTimeout, wait_until
    from .schema import connect_in
    wanted = sorted({(int(r["partition"]), int(r["offset"])) for r in records
                     if r.get("partition") is not None and r.get("offset") is not None})
    if not wanted:
        return True
    params = {"partitions": [p for p, _ in wanted], "offsets": [o for _, o in wanted]}

    def mirrored() -> bool:
        with connect_in(engine, schema_name) as conn:
            return conn.execute(text(MIRRORED), params).scalar_one() >= len(wanted)
    try:
        return wait_until(mirrored, timeout=timeout, interval=interval, message="")
    except WaitTimeout:
        return False
