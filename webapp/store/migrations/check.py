"""Compare a migrated database with the store's tables (webapp/store/tables.py), and draft the next revision.

``differences`` is what ``tests/test_migrations.py`` asserts empty: after ``upgrade head`` from
the baseline, every table of ``lab_control`` and of a lab schema has the tables' columns (type,
nullability, whether it has a default), indexes and unique constraints, and no others.

``python -m webapp.store.migrations.check DATABASE_URL`` builds a database of the baseline (one lab
schema with a row) in a scratch database on that server, upgrades it to head, and prints the
statements a new revision needs for what the tables have and it lacks (``IF NOT EXISTS`` where
PostgreSQL has it); what cannot be drafted (a changed type, a dropped column) is printed as a
comment to write by hand. Paste the lists into a new file under ``versions/`` made from
``script.py.mako`` (``down_revision`` = the current head), then run the test.
"""
from __future__ import annotations

import sys
import uuid
from typing import Iterable

from sqlalchemy import Column, Connection, Index, Table, create_engine, inspect
from sqlalchemy.dialects import postgresql
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable

from ..connection import CONTROL_SCHEMA, sqlalchemy_url
from ..schema import enter, quoted
from . import BASELINE, VERSION_TABLE, alembic_config, upgrade_connection

DIALECT = postgresql.dialect()
DRAFT_LAB = "lab_draft"


def baseline_statements() -> tuple[list[str], list[str]]:
    """The baseline revision's frozen DDL: (control, lab)."""
    from alembic.script import ScriptDirectory

    module = ScriptDirectory.from_config(alembic_config()).get_revision(BASELINE).module
    return list(module.CONTROL), list(module.LAB)


def build_baseline(conn: Connection, lab_schemas: Iterable[str]) -> None:
    """The schema as the release before migrations left it: control tables, lab schemas, no
    version table."""
    control, lab = baseline_statements()
    conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted(CONTROL_SCHEMA)}")
    for statement in control:
        conn.exec_driver_sql(statement)
    for schema in lab_schemas:
        conn.exec_driver_sql(f"CREATE SCHEMA IF NOT EXISTS {quoted(schema)}")
        enter(conn, schema)
        for statement in lab:
            conn.exec_driver_sql(statement)
    enter(conn, "public")


def _type(type_) -> str:
    return str(type_.compile(dialect=DIALECT))


def _has_default(column: Column) -> bool:
    return column.server_default is not None


def _db_has_default(info: dict) -> bool:
    default = info.get("default")
    return default is not None and not str(default).startswith("nextval(")


def _index_shape(info: dict) -> tuple:
    options = info.get("dialect_options", {})
    return (tuple(info["column_names"]), bool(info["unique"]), tuple(options.get("postgresql_include") or ()),
            options.get("postgresql_where") is not None)


def _model_index_shape(index: Index) -> tuple:
    options = index.dialect_options["postgresql"]
    return (tuple(c.name for c in index.columns), bool(index.unique),
            tuple(str(c) for c in options.get("include") or ()), options.get("where") is not None)


def differences(conn: Connection, schema: str, tables: list[Table]) -> list[tuple[str, str, str]]:
    """What ``schema`` lacks or has more than ``tables`` (the store's lab or control tables):
    (kind, table, detail) tuples, empty when they agree."""
    inspector = inspect(conn)
    found = set(inspector.get_table_names(schema=schema)) - {VERSION_TABLE}
    diffs: list[tuple[str, str, str]] = []
    for name in sorted(found - {t.name for t in tables}):
        diffs.append(("extra table", name, ""))
    for table in tables:
        if table.name not in found:
            diffs.append(("missing table", table.name, ""))
            continue
        columns = {c["name"]: c for c in inspector.get_columns(table.name, schema=schema)}
        for column in table.columns:
            info = columns.pop(column.name, None)
            if info is None:
                diffs.append(("missing column", table.name, column.name))
                continue
            if _type(column.type) != _type(info["type"]):
                diffs.append(("type", table.name, f"{column.name}: models {_type(column.type)}, "
                                                  f"database {_type(info['type'])}"))
            if column.nullable != info["nullable"]:
                diffs.append(("nullable", table.name, f"{column.name}: models {column.nullable}, "
                                                      f"database {info['nullable']}"))
            if _has_default(column) != _db_has_default(info):
                diffs.append(("default", table.name, f"{column.name}: models {column.server_default!r}, "
                                                     f"database {info.get('default')!r}"))
        for name in columns:
            diffs.append(("extra column", table.name, name))
        indexes = {i["name"]: _index_shape(i) for i in inspector.get_indexes(table.name, schema=schema)
                   if not i.get("duplicates_constraint")}
        for index in table.indexes:
            shape = indexes.pop(index.name, None)
            if shape is None:
                diffs.append(("missing index", table.name, index.name))
            elif shape != _model_index_shape(index):
                # The WHERE of a partial index is compared for presence only: PostgreSQL rewrites it.
                diffs.append(("index", table.name, f"{index.name}: models {_model_index_shape(index)}, "
                                                   f"database {shape}"))
        for name in indexes:
            diffs.append(("extra index", table.name, name))
        uniques = {tuple(u["column_names"]) for u in inspector.get_unique_constraints(table.name, schema=schema)}
        wanted = {tuple(c.name for c in constraint.columns) for constraint in table.constraints
                  if constraint.__class__.__name__ == "UniqueConstraint"}
        wanted |= {(c.name,) for c in table.columns if c.unique}
        for columns_ in sorted(wanted - uniques):
            diffs.append(("missing unique", table.name, ",".join(columns_)))
        for columns_ in sorted(uniques - wanted):
            diffs.append(("extra unique", table.name, ",".join(columns_)))
    return diffs


def draft(diffs: list[tuple[str, str, str]], tables: list[Table]) -> list[str]:
    """Statements for a revision that adds what ``diffs`` says is missing."""
    by_name = {t.name: t for t in tables}
    statements: list[str] = []
    for kind, name, detail in diffs:
        table = by_name.get(name)
        if kind == "missing table":
            statements.append(str(CreateTable(table, if_not_exists=True).compile(dialect=DIALECT)).strip())
            statements += [str(CreateIndex(i, if_not_exists=True).compile(dialect=DIALECT)).strip()
                           for i in sorted(table.indexes, key=lambda i: i.name)]
        elif kind == "missing column":
            column = table.columns[detail]
            spec = str(CreateColumn(column).compile(dialect=DIALECT)).strip()
            if not column.nullable and column.server_default is None:
                statements.append(f"-- {name}.{detail} is NOT NULL without a server default: existing rows "
                                  "need a value (add a server_default, or fill it and then SET NOT NULL)")
            qualified = f'{table.schema}.{name}' if table.schema else name
            statements.append(f"ALTER TABLE {qualified} ADD COLUMN IF NOT EXISTS {spec}")
        elif kind == "missing index":
            index = next(i for i in table.indexes if i.name == detail)
            statements.append(str(CreateIndex(index, if_not_exists=True).compile(dialect=DIALECT)).strip())
        else:
            statements.append(f"-- by hand: {kind} {name} {detail}".rstrip())
    return statements


def _format(name: str, statements: list[str]) -> str:
    lines = [f"{name} = ["]
    for statement in statements:
        if statement.startswith("--"):
            lines.append(f"    # {statement[3:]}")
        else:
            body = "\n".join(line.rstrip() for line in statement.replace("\t", "    ").split("\n"))
            lines.append(f'    """{body}""",')
    lines.append("]")
    return "\n".join(lines)


def migrated_differences(url: str) -> tuple[list, list]:
    """(control, lab) differences of a baseline database upgraded to head from the tables, in a
    scratch database on the server of ``url``."""
    from ..tables import control_tables, lab_tables

    server = make_url(sqlalchemy_url(url))
    scratch = f"lab_migrations_draft_{uuid.uuid4().hex[:8]}"
    admin = create_engine(server, poolclass=NullPool, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f"CREATE DATABASE {quoted(scratch)}")
    engine = create_engine(server.set(database=scratch), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            build_baseline(conn, [DRAFT_LAB])
            upgrade_connection(conn)
        with engine.connect() as conn:
            return (differences(conn, CONTROL_SCHEMA, control_tables()),
                    differences(conn, DRAFT_LAB, lab_tables()))
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.exec_driver_sql(f"DROP DATABASE IF EXISTS {quoted(scratch)} WITH (FORCE)")
        admin.dispose()


def main(argv: list[str] | None = None) -> int:
    from ..tables import control_tables, lab_tables

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m webapp.store.migrations.check DATABASE_URL  (any database on the server)", file=sys.stderr)
        return 2
    control, lab = migrated_differences(args[0])
    if not control and not lab:
        print("# the migrations reach the tables: no revision needed")
        return 0
    print(_format("CONTROL", draft(control, control_tables())))
    print(_format("LAB", draft(lab, lab_tables())))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
