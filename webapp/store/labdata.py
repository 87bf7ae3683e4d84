"""A lab's own control rows: its settings, its consumer groups and its timeline entries.

Every function takes a connection that already works in the lab's schema (``store.schema``)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, select, update
from sqlalchemy.dialects.postgresql import insert

from . import timeline
from .tables import consumer_groups as groups_table, settings as settings_table



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
