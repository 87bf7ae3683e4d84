"""The lab namespace: one PostgreSQL schema and one topic prefix.

The default lab, each scenario run and each strategy lane is a Lab. Nothing else names a
schema or a topic: everything takes the Lab it works in.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import Connection, text

from .db import CONTROL_SCHEMA
from .models import control_tables, lab_tables

NAME = re.compile(r"^[a-z][a-z0-9_]{0,23}$")
SEED_ACCOUNTS = [
    ("acc-1", "Ana"), ("acc-2", "Bruno"), ("acc-3", "Carla"), ("acc-4", "Diego"), ("acc-5", "Elisa"),
]


class InvalidLabName(ValueError):
    pass


@dataclass(frozen=True)
class Lab:
    name: str

    def __post_init__(self):
        if not NAME.match(self.name):
            raise InvalidLabName(
                f"lab name must start with a letter and hold 1-24 lowercase letters, digits or _: {self.name!r}")

    @property
    def schema(self) -> str:
        return f"lab_{self.name}"

    @property
    def topic(self) -> str:
        return f"{self.name}.payments"

    @property
    def dlq_topic(self) -> str:
        return f"{self.name}.payments.dlq"

    def group_id(self, group: str) -> str:
        """The Kafka group id of a group name local to this lab."""
        return group if group.startswith(f"{self.name}.") else f"{self.name}.{group}"

    def lane_schema(self, lane: str) -> str:
        """The schema of a strategy lane: its own copy of the accounts."""
        if not NAME.match(lane):
            raise InvalidLabName(f"lane name must be lowercase letters, digits or _: {lane!r}")
        return f"{self.schema}__{lane}"

    def owns_schema(self, schema: str) -> bool:
        return schema == self.schema or schema.startswith(f"{self.schema}__")


def ensure_control_schema(conn: Connection) -> None:
    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{CONTROL_SCHEMA}"'))
    for table in control_tables():
        table.create(conn, checkfirst=True)


def ensure_schema(conn: Connection, schema: str) -> bool:
    """Create ``schema`` with every lab table if missing. True when it was created."""
    exists = conn.execute(text("SELECT 1 FROM information_schema.schemata WHERE schema_name = :s"),
                          {"s": schema}).first()
    conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
    conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": schema})
    for table in lab_tables():
        table.create(conn, checkfirst=True)
    return exists is None


def seed_accounts(conn: Connection, schema: str) -> None:
    conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": schema})
    for account_id, owner in SEED_ACCOUNTS:
        conn.execute(text("INSERT INTO accounts (id, owner, balance, status) VALUES (:id, :owner, 0, 'ACTIVE') "
                          "ON CONFLICT (id) DO NOTHING"), {"id": account_id, "owner": owner})


def lab_schemas(conn: Connection, lab: Lab) -> list[str]:
    """The lab's schema and its lanes' schemas that exist now."""
    rows = conn.execute(text("SELECT schema_name FROM information_schema.schemata "
                             "WHERE schema_name = :s OR schema_name LIKE :lanes"),
                        {"s": lab.schema, "lanes": f"{lab.schema}\\_\\_%"}).scalars()
    return sorted(rows)


def drop_database_state(conn: Connection, lab: Lab) -> None:
    """Drop every schema of the lab and its control rows. Kafka topics are kafka.py's."""
    for schema in lab_schemas(conn, lab):
        conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    conn.execute(text(f'DELETE FROM "{CONTROL_SCHEMA}".consumers WHERE lab = :lab'), {"lab": lab.name})
    conn.execute(text(f"DELETE FROM \"{CONTROL_SCHEMA}\".commands WHERE lab = :lab AND status IN ('done', 'failed')"),
                 {"lab": lab.name})


DEFAULT_GROUP = "payments"
DEFAULT_STRATEGY = "none"


def create_database_state(conn: Connection, lab: Lab, partitions: int) -> None:
    """A fresh lab schema: seed accounts, the partition count, the default group."""
    ensure_schema(conn, lab.schema)
    seed_accounts(conn, lab.schema)
    conn.execute(text("INSERT INTO settings (key, value) VALUES ('partitions', CAST(:p AS jsonb)) "
                      "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"), {"p": str(partitions)})
    conn.execute(text("INSERT INTO consumer_groups (group_id, strategy, effects_schema) VALUES (:g, :s, :e) "
                      "ON CONFLICT (group_id) DO NOTHING"),
                 {"g": lab.group_id(DEFAULT_GROUP), "s": DEFAULT_STRATEGY, "e": lab.schema})
