"""Alembic's environment: online only, on the connection ``webapp.store.migrations`` hands over (or
on ``sqlalchemy.url``/``DATABASE_URL`` when run from the ``alembic`` command line)."""
from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from webapp.store.connection import CONTROL_SCHEMA, sqlalchemy_url
from webapp.store.migrations import VERSION_TABLE
from webapp.store.tables import metadata

config = context.config


def run(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata,
                      version_table=VERSION_TABLE, version_table_schema=CONTROL_SCHEMA,
                      transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("the lab's migrations run online only: each revision looks up the lab schemas that exist")

connection = config.attributes.get("connection")
if connection is not None:
    run(connection)
else:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("DATABASE_URL")
    if not url:
        raise SystemExit("set DATABASE_URL (or sqlalchemy.url) to migrate")
    engine = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            run(conn)
    finally:
        engine.dispose()
