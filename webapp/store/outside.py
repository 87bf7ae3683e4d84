"""The outside consumer's PostgreSQL role (issue 34, "your consumer"): one LOGIN role per outside
lane, allowed to read and write that lane's tables and nothing else; its sessions ended on demand.

A role is cluster-wide, so its name is the lane's schema name (``Lab.lane_role``): it names its lab.
New tables in PostgreSQL grant nothing to PUBLIC and a lab schema grants no USAGE to PUBLIC, so a
role given only the privileges below can read or write no other lane, lab or control table.
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, delete, select, text
from sqlalchemy.dialects.postgresql import insert

from ..domain.lab import Lab
from .connection import CONTROL_SCHEMA
from .schema import quoted
from .tables import outside_roles as roles_table

PASSWORD_BYTES = 16  # 32 hex characters


def password_for(conn: Connection, lab: Lab, role: str) -> str:
    """The role's password: made at random the first time, then the same one (lab_control.outside_roles),
    so a reset, which drops and re-creates the role, leaves the URL a learner copied valid."""
    conn.execute(insert(roles_table).values(role=role, lab=lab.name, password=secrets.token_hex(PASSWORD_BYTES))
                 .on_conflict_do_nothing(index_elements=["role"]))
    return conn.execute(select(roles_table.c.password).where(roles_table.c.role == role)).scalar_one()


def password_of(conn: Connection, role: str) -> str | None:
    """The role's password, as made by :func:`password_for`; None for a role never made."""
    return conn.execute(select(roles_table.c.password).where(roles_table.c.role == role)).scalar()


def forget_passwords(conn: Connection, lab: Lab) -> None:
    """A lab dropped for good: its roles' passwords go with it."""
    conn.execute(delete(roles_table).where(roles_table.c.lab == lab.name))


def _literal(conn: Connection, value: str) -> str:
    """``value`` as a quoted SQL literal, by PostgreSQL itself (DDL takes no bound parameters)."""
    return conn.execute(text("SELECT quote_literal(CAST(:v AS text))"), {"v": value}).scalar_one()


def grant_lane(conn: Connection, lab: Lab, lane: str) -> str:
    """Create (or refresh) the lane's role: LOGIN with its password (:func:`password_for`), its
    search_path on the lane, SELECT/INSERT/UPDATE/DELETE on every table of the lane and its
    sequences. The role's name."""
    role, schema = lab.lane_role(lane), lab.lane_schema(lane)
    password = password_for(conn, lab, role)
    exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is not None
    verb = "ALTER" if exists else "CREATE"
    conn.execute(text(f"{verb} ROLE {quoted(role)} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
                      f"PASSWORD {_literal(conn, password)}"))
    conn.execute(text(f"ALTER ROLE {quoted(role)} SET search_path = {quoted(schema)}"))
    conn.execute(text(f"GRANT USAGE ON SCHEMA {quoted(schema)} TO {quoted(role)}"))
    conn.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {quoted(schema)} TO {quoted(role)}"))
    conn.execute(text(f"GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {quoted(schema)} TO {quoted(role)}"))
    return role


def terminate_sessions(conn: Connection, role: str) -> int:
    """``pg_terminate_backend`` every session of ``role``: their open transactions roll back. How many."""
    return int(conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                 "WHERE usename = :r AND pid <> pg_backend_pid()"), {"r": role}).scalar_one())


def sessions(conn: Connection, role: str) -> int:
    """How many sessions ``role`` has open now."""
    return int(conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE usename = :r"), {"r": role}).scalar_one())


def lab_roles(conn: Connection, lab: Lab) -> list[str]:
    """The outside lanes' roles of ``lab`` that exist now."""
    return list(conn.execute(text("SELECT rolname FROM pg_roles WHERE rolname LIKE :p ORDER BY rolname"),
                             {"p": lab.schema.replace("_", "\\_") + "\\_\\_%"}).scalars())


def drop_roles(conn: Connection, lab: Lab) -> list[str]:
    """End the sessions of the lab's outside roles and drop them (their schemas are dropped already,
    and their privileges with them). The roles dropped."""
    roles = lab_roles(conn, lab)
    for role in roles:
        terminate_sessions(conn, role)
        conn.execute(text(f"DROP OWNED BY {quoted(role)}"))
        conn.execute(text(f"DROP ROLE {quoted(role)}"))
    return roles


@dataclass(frozen=True)
class KafkaPrincipal:
    """A lane's Kafka credentials and what they grant: read ``topic``, use ``group_id``."""
    username: str
    lab: str
    topic: str
    group_id: str
    password_hash: str


def kafka_principal(conn: Connection, username: str) -> KafkaPrincipal | None:
    """The Kafka principal named ``username`` (a lane's role name); None when there is none."""
    row = conn.execute(text(f"SELECT username, lab, topic, group_id, password_hash FROM {CONTROL_SCHEMA}"
                            ".kafka_principals WHERE username = :u"), {"u": username}).first()
    return KafkaPrincipal(*row) if row is not None else None
