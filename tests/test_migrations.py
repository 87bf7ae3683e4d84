"""Schema changes through Alembic: a database of the release before migrations upgrades in place,
upgrading twice changes nothing, and a migrated database has exactly the models' tables.

Each test works on its own database, created on the session's embedded PostgreSQL and dropped
at the end.
"""
from __future__ import annotations

import threading
import uuid

import pytest
from sqlalchemy import create_engine, insert, inspect, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from webapp.domain.lab import Lab
from webapp.store import migrations
from webapp.store.connection import CONTROL_SCHEMA, sqlalchemy_url
from webapp.store.labs import create_database_state, ensure_control_schema, ensure_schema
from webapp.store.migrations.check import build_baseline, differences
from webapp.store.tables import accounts, commands, consumers, control_tables, lab_tables

OLD_LAB = "lab_old"
OLD_LANE = "lab_old__fast"


@pytest.fixture
def database(services):
    """A fresh, empty database on the embedded server: its URL."""
    name = f"migrations_{uuid.uuid4().hex[:10]}"
    admin = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(services.database_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def engine_for(url: str, schema: str | None = None):
    connect_args = {"options": f"-c search_path={schema}"} if schema else {}
    return create_engine(sqlalchemy_url(url), poolclass=NullPool, connect_args=connect_args)


def build_previous_release(url: str) -> None:
    """The schema the release before migrations created (its frozen DDL), with a few rows."""
    engine = engine_for(url)
    with engine.begin() as conn:
        build_baseline(conn, [OLD_LAB, OLD_LANE])
        for schema in (OLD_LAB, OLD_LANE):
            conn.exec_driver_sql(f"INSERT INTO {schema}.accounts (id, owner, balance, status) "
                                 "VALUES ('acc-1', 'Ana', 1500, 'ACTIVE')")
        conn.exec_driver_sql(f"INSERT INTO {OLD_LAB}.settings (key, value) VALUES ('partitions', '3')")
        conn.exec_driver_sql(f"INSERT INTO {OLD_LAB}.consumer_groups (group_id, strategy, effects_schema) "
                             f"VALUES ('old.payments', 'none', '{OLD_LAB}')")
        conn.exec_driver_sql(f"INSERT INTO {OLD_LAB}.payments (event_id, transaction_id, account_id, amount_cents) "
                             "VALUES ('5f0c3a52-8d7e-4c1e-9a53-0f2b7f2d3c11', 'tx-1', 'acc-1', 1500)")
        conn.exec_driver_sql(f"INSERT INTO {CONTROL_SCHEMA}.commands (lab, verb, status) VALUES ('old', 'lab.ensure', 'done')")
        conn.exec_driver_sql(f"INSERT INTO {CONTROL_SCHEMA}.consumers (lab, name, group_id, state) "
                             "VALUES ('old', 'c1', 'old.payments', 'gone')")
        conn.exec_driver_sql(f"INSERT INTO {CONTROL_SCHEMA}.agents (id, host, pid) VALUES ('h:1', 'h', 1)")
    engine.dispose()


def columns(url: str) -> dict[tuple[str, str], set[str]]:
    """(schema, table) -> column names, for the control schema and the old lab's."""
    engine = engine_for(url)
    with engine.connect() as conn:
        inspector = inspect(conn)
        found = {(schema, table): {c["name"] for c in inspector.get_columns(table, schema=schema)}
                 for schema in (CONTROL_SCHEMA, OLD_LAB) for table in inspector.get_table_names(schema=schema)}
    engine.dispose()
    return found


def version(url: str) -> str | None:
    engine = engine_for(url)
    with engine.connect() as conn:
        found = migrations.current(conn)
    engine.dispose()
    return found


def assert_matches_models(url: str, *lab_schemas: str) -> None:
    engine = engine_for(url)
    with engine.connect() as conn:
        assert differences(conn, CONTROL_SCHEMA, control_tables()) == []
        for schema in lab_schemas:
            assert differences(conn, schema, lab_tables()) == [], schema
    engine.dispose()


def test_a_database_of_the_previous_release_upgrades_in_place_and_works(database):
    build_previous_release(database)
    before = columns(database)
    assert version(database) is None

    assert migrations.upgrade(database) == "adopted"
    assert version(database) == migrations.head()

    engine = engine_for(database)
    with engine.connect() as conn:
        # The old rows are all there.
        for schema in (OLD_LAB, OLD_LANE):
            assert conn.exec_driver_sql(f"SELECT owner, balance FROM {schema}.accounts").all() == [("Ana", 1500)]
        assert conn.exec_driver_sql(f"SELECT transaction_id, amount_cents FROM {OLD_LAB}.payments").all() == [("tx-1", 1500)]
        assert conn.exec_driver_sql(f"SELECT value FROM {OLD_LAB}.settings").scalar() == 3
        assert conn.exec_driver_sql(f"SELECT verb, status FROM {CONTROL_SCHEMA}.commands").all() == [("lab.ensure", "done")]
        assert conn.exec_driver_sql(f"SELECT name, state FROM {CONTROL_SCHEMA}.consumers").all() == [("c1", "gone")]
        # Every column the upgrade added is there, and the old rows hold its default.
        after = columns(database)
        tables = {(t.schema or OLD_LAB, t.name): t for t in control_tables() + lab_tables()}
        for key, table in tables.items():
            assert after.get(key) == {c.name for c in table.columns}, key
            added = [table.columns[name] for name in after[key] - before.get(key, set())]
            rows = conn.exec_driver_sql(f'SELECT count(*) FROM {key[0]}."{key[1]}"').scalar()
            for column in added:
                if column.server_default is not None and rows:
                    nulls = conn.exec_driver_sql(
                        f'SELECT count(*) FROM {key[0]}."{key[1]}" WHERE "{column.name}" IS NULL').scalar()
                    assert nulls == 0, f"{key}.{column.name}: old rows lack the default"
    engine.dispose()

    # The store's tables read and write the upgraded tables: the control schema...
    control = engine_for(database)
    with control.begin() as conn:
        conn.execute(insert(consumers).values(lab="old", name="c2", group_id="old.payments", agent_id="h:1"))
        conn.execute(insert(commands).values(lab="old", verb="consumer.start", args={"name": "c2"}))
    with control.connect() as conn:
        rows = conn.execute(select(consumers.c.name, consumers.c.state, consumers.c.assigned)
                            .order_by(consumers.c.id)).all()
        assert [tuple(row) for row in rows] == [("c1", "gone", []), ("c2", "starting", [])]
        assert conn.execute(select(commands.c.status).order_by(commands.c.id)).scalars().all() == ["done", "pending"]
    control.dispose()
    # ...and a lab schema.
    lab = engine_for(database, OLD_LAB)
    with lab.begin() as conn:
        conn.execute(update(accounts).where(accounts.c.id == "acc-1")
                     .values(balance=accounts.c.balance + 250, status="FROZEN"))
    with lab.connect() as conn:
        row = conn.execute(select(accounts.c.owner, accounts.c.balance, accounts.c.status)
                           .where(accounts.c.id == "acc-1")).one()
        assert tuple(row) == ("Ana", 1750, "FROZEN")
    lab.dispose()
    # Every table selects every column it declares from the upgraded tables.
    for table in control_tables() + lab_tables():
        engine = engine_for(database, None if table.schema else OLD_LAB)
        with engine.connect() as conn:
            conn.execute(select(table).limit(1)).all()
        engine.dispose()

    # A lab created now, after the upgrade, is at head too and takes its seed.
    engine = engine_for(database)
    with engine.begin() as conn:
        ensure_control_schema(conn)
        create_database_state(conn, Lab("fresh"), 3)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM lab_fresh.accounts").scalar() == 5
    engine.dispose()
    assert_matches_models(database, OLD_LAB, OLD_LANE, "lab_fresh")


def test_upgrade_is_idempotent(database):
    build_previous_release(database)
    assert migrations.upgrade(database) == "adopted"
    assert migrations.upgrade(database) == "current"
    # Every revision after the baseline again, over tables that have its changes already.
    engine = engine_for(database)
    with engine.begin() as conn:
        from alembic import command
        command.stamp(migrations.alembic_config(conn), migrations.BASELINE)
    engine.dispose()
    assert migrations.upgrade(database) == "upgraded"
    assert version(database) == migrations.head()
    assert_matches_models(database, OLD_LAB, OLD_LANE)
    # A database a newer release upgraded is left alone, and says why.
    engine = engine_for(database)
    with engine.begin() as conn:
        conn.exec_driver_sql(f"UPDATE {CONTROL_SCHEMA}.alembic_version SET version_num = '9999'")
    engine.dispose()
    with pytest.raises(RuntimeError, match="revision 9999, which this release does not know"):
        migrations.upgrade(database)


def test_a_fresh_database_is_created_at_head_and_processes_starting_together_agree(database):
    results: list[str] = []
    errors: list[BaseException] = []

    def start():
        try:
            results.append(migrations.upgrade(database))
        except BaseException as error:  # noqa: BLE001 - reported by the assertion below
            errors.append(error)
    threads = [threading.Thread(target=start) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sorted(results) == ["created", "current", "current"]
    assert version(database) == migrations.head()
    engine = engine_for(database)
    with engine.begin() as conn:
        assert ensure_schema(conn, "lab_new") is True
        assert ensure_schema(conn, "lab_new") is False
    engine.dispose()
    assert_matches_models(database, "lab_new")


def test_the_migrations_reach_the_models(database):
    """A model changed without a revision fails here: add one (``python -m webapp.store.migrations.check``
    drafts it)."""
    build_previous_release(database)
    migrations.upgrade(database)
    assert_matches_models(database, OLD_LAB, OLD_LANE)
