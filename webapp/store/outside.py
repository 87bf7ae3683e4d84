"""The outside consumer's credentials ("your consumer"): one LOGIN role per outside lane, allowed to
read and write that lane's four tables and nothing else, its sessions bounded and ended on demand;
and the Kafka principal of the same name, which the learners' Kafka gateway checks.

A role is cluster-wide, so its name is the lane's schema name (``Lab.lane_role``): it names its lab.
New tables in PostgreSQL grant nothing to PUBLIC and a lab schema grants no USAGE to PUBLIC, so a
role given only the privileges below can read or write no other table of its lane, no other lane,
lab or control table. Its two passwords (PostgreSQL's, Kafka's) are kept encrypted at rest in
``lab_control.outside_roles``, the Kafka one also hashed, which is what the gateway checks
(domain/credentials.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, delete, select, text
from sqlalchemy.dialects.postgresql import insert

from ..domain import credentials
from ..domain.lab import Lab
from ..domain.vocabulary import LANE_ROLE_LIMITS, LANE_TABLES
from .schema import quoted
from .tables import outside_roles as roles_table

# What no lane role may do in the lab's database: temporary tables (a learner's own scratch space,
# beyond the lane's tables) and large objects (lo_create needs no privilege on any table by default).
# Revoked from PUBLIC by a superuser: the embedded server's start (dev/embedded.py), or grant_lane when
# the lab itself connects as one; the lab's owner role keeps TEMPORARY as the database's owner.
PUBLIC_REVOCATIONS = (
    "REVOKE TEMPORARY ON DATABASE {database} FROM PUBLIC",
    "REVOKE EXECUTE ON FUNCTION pg_catalog.lo_create(oid), pg_catalog.lo_creat(integer), "
    "pg_catalog.lo_from_bytea(oid, bytea), pg_catalog.lo_import(text), pg_catalog.lo_import(text, oid) FROM PUBLIC",
)


@dataclass(frozen=True)
class LaneCredentials:
    """What a learner's code signs in with: the role (also the Kafka user) and both passwords."""
    role: str
    database_password: str
    kafka_password: str


@dataclass(frozen=True)
class KafkaPrincipal:
    """A lane's Kafka user as the gateway checks it: its lab's topic and its lane's group."""
    username: str
    lab: str
    topic: str
    group_id: str
    password_hash: str


def _issue(conn: Connection, secret_key: str, lab: Lab, role: str) -> LaneCredentials:
    database_password, kafka_password = credentials.new_password(), credentials.new_password()
    values = dict(lab=lab.name, password_encrypted=credentials.encrypt(secret_key, database_password),
                  kafka_password_encrypted=credentials.encrypt(secret_key, kafka_password),
                  kafka_password_hash=credentials.hash_password(kafka_password))
    conn.execute(insert(roles_table).values(role=role, **values)
                 .on_conflict_do_update(index_elements=["role"], set_=values))
    return LaneCredentials(role, database_password, kafka_password)


def credentials_of(conn: Connection, secret_key: str, role: str) -> LaneCredentials | None:
    """The role's passwords, decrypted; None for a role never made, or whose passwords were stored
    under another SECRET_KEY (:func:`grant_lane` issues new ones then)."""
    row = conn.execute(select(roles_table).where(roles_table.c.role == role)).first()
    if row is None or row.password_encrypted is None:
        return None
    try:
        return LaneCredentials(role, credentials.decrypt(secret_key, row.password_encrypted),
                               credentials.decrypt(secret_key, row.kafka_password_encrypted))
    except credentials.UnreadableSecret:
        return None


def kafka_principal(conn: Connection, username: str) -> KafkaPrincipal | None:
    """The Kafka principal ``username`` (a lane role's name), or None when no such lane exists."""
    row = conn.execute(select(roles_table).where(roles_table.c.role == username)).first()
    if row is None or row.kafka_password_hash is None:
        return None
    lab = Lab(row.lab)
    lane = lab.lane_of(username)
    if lane is None:
        return None
    return KafkaPrincipal(username, lab.name, lab.topic, lab.group_id(lane), row.kafka_password_hash)


def forget_passwords(conn: Connection, lab: Lab) -> None:
    """A lab dropped for good: its roles' credentials go with it."""
    conn.execute(delete(roles_table).where(roles_table.c.lab == lab.name))


def other_lanes(conn: Connection, lab: Lab, lane: str) -> int:
    """How many lanes of ``lab`` but ``lane`` have credentials (the cap on lanes per lab counts these;
    a lab's reset keeps them, so a lane made again after one is no new lane)."""
    return len(conn.execute(select(roles_table.c.role).where(roles_table.c.lab == lab.name,
                                                             roles_table.c.role != lab.lane_role(lane))).all())


def _literal(conn: Connection, value: str) -> str:
    """``value`` as a quoted SQL literal, by PostgreSQL itself (DDL takes no bound parameters)."""
    return conn.execute(text("SELECT quote_literal(CAST(:v AS text))"), {"v": value}).scalar_one()


def _lane_sequences(conn: Connection, schema: str) -> list[str]:
    """The sequences owned by the lane's tables (``payments.id``'s, say)."""
    return list(conn.execute(text(
        "SELECT DISTINCT s.relname FROM pg_class s JOIN pg_depend d ON d.objid = s.oid AND d.deptype IN ('a', 'i') "
        "JOIN pg_class t ON t.oid = d.refobjid JOIN pg_namespace n ON n.oid = t.relnamespace "
        "WHERE s.relkind = 'S' AND n.nspname = :schema AND t.relname = ANY(:tables) ORDER BY 1"),
        {"schema": schema, "tables": list(LANE_TABLES)}).scalars())


def grant_lane(conn: Connection, lab: Lab, lane: str, secret_key: str, connection_limit: int) -> LaneCredentials:
    """Create (or refresh) the lane's role: LOGIN with its password, at most ``connection_limit``
    sessions, its search_path on the lane, the lane's bounds (LANE_ROLE_LIMITS), and
    SELECT/INSERT/UPDATE/DELETE on the lane's four tables (LANE_TABLES) and their sequences, nothing
    else. Its credentials: the stored ones, or new ones when there are none this key can read."""
    role, schema = lab.lane_role(lane), lab.lane_schema(lane)
    issued = credentials_of(conn, secret_key, role) or _issue(conn, secret_key, lab, role)
    exists = conn.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": role}).first() is not None
    verb = "ALTER" if exists else "CREATE"
    conn.execute(text("SET LOCAL password_encryption = 'scram-sha-256'"))
    # SUPERUSER, REPLICATION and BYPASSRLS are off from CREATE on (only a superuser may grant them).
    conn.execute(text(f"{verb} ROLE {quoted(role)} LOGIN NOCREATEDB NOCREATEROLE NOINHERIT "
                      f"CONNECTION LIMIT {int(connection_limit)} PASSWORD {_literal(conn, issued.database_password)}"))
    conn.execute(text(f"ALTER ROLE {quoted(role)} SET search_path = {quoted(schema)}"))
    for setting, value in LANE_ROLE_LIMITS.items():
        conn.execute(text(f"ALTER ROLE {quoted(role)} SET {setting} = {_literal(conn, value)}"))
    database, superuser = conn.execute(text("SELECT current_database(), rolsuper FROM pg_roles "
                                            "WHERE rolname = current_user")).one()
    if superuser:
        for statement in PUBLIC_REVOCATIONS:
            conn.execute(text(statement.format(database=quoted(database))))
    conn.execute(text(f"GRANT USAGE ON SCHEMA {quoted(schema)} TO {quoted(role)}"))
    tables = ", ".join(f"{quoted(schema)}.{quoted(table)}" for table in LANE_TABLES)
    conn.execute(text(f"GRANT SELECT, INSERT, UPDATE, DELETE ON {tables} TO {quoted(role)}"))
    sequences = _lane_sequences(conn, schema)
    if sequences:
        names = ", ".join(f"{quoted(schema)}.{quoted(name)}" for name in sequences)
        conn.execute(text(f"GRANT USAGE, SELECT, UPDATE ON SEQUENCE {names} TO {quoted(role)}"))
    return issued


def terminate_sessions(conn: Connection, role: str) -> int:
    """``pg_terminate_backend`` every session of ``role``: their open transactions roll back. How many."""
    return int(conn.execute(text("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                 "WHERE usename = :r AND pid <> pg_backend_pid()"), {"r": role}).scalar_one())


@dataclass(frozen=True)
class EndedSession:
    role: str
    lab: str
    pid: int
    why: str


def end_overrunning_sessions(conn: Connection, statement_seconds: float, idle_seconds: float) -> list[EndedSession]:
    """``pg_terminate_backend`` every lane role's session that has run one statement for longer than
    ``statement_seconds`` or sat idle in a transaction for longer than ``idle_seconds``: the bounds its
    role's defaults set (LANE_ROLE_LIMITS), which the role may lift in its own session. The ones ended."""
    rows = conn.execute(text(
        f"SELECT a.usename, r.lab, a.pid, CASE WHEN a.state = 'active' THEN 'ran one statement for over ' "
        f"|| :statement || ' s' ELSE 'sat idle in a transaction for over ' || :idle || ' s' END AS why "
        f"FROM pg_stat_activity a JOIN {roles_table.fullname} r ON r.role = a.usename "
        "WHERE a.pid <> pg_backend_pid() AND ("
        "  (a.state = 'active' AND a.query_start < now() - make_interval(secs => :statement))"
        "  OR (a.state LIKE 'idle in transaction%' AND a.state_change < now() - make_interval(secs => :idle)))"),
        {"statement": statement_seconds, "idle": idle_seconds}).all()
    ended = []
    for role, lab, pid, why in rows:
        if conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar():
            ended.append(EndedSession(role, lab, pid, why))
    return ended


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
