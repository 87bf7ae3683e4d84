"""The database integration: the Flask-SQLAlchemy instance and sessions bound to a lab's schema.

Every lab lives in its own PostgreSQL schema. A session sets ``search_path`` at the start of
each transaction, so the ORM, raw SQL and the strategies' SQL all name plain tables
(``accounts``, ``processed_events``) and land in the lab they work in.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import psycopg
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import DeclarativeBase, Session


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)

CONTROL_SCHEMA = "lab_control"


def sqlalchemy_url(url: str) -> str:
    """Any PostgreSQL URL as the psycopg-3 SQLAlchemy dialect wants it."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"DATABASE_URL must be a PostgreSQL URL, got {parsed.drivername}")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def psycopg_conninfo(url: str) -> str:
    """The same URL as plain psycopg (libpq) accepts it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def connect(url: str, schema: str | None = None, **kwargs) -> psycopg.Connection:
    """A psycopg connection for processes outside Flask (consumers, supervisor)."""
    options = f"-c search_path={schema}" if schema else None
    return psycopg.connect(psycopg_conninfo(url), options=options, **kwargs)


def _set_search_path(schema: str):
    def after_begin(session, transaction, connection):
        # set_config(..., true) is SET LOCAL: it ends with the transaction, so a pooled
        # connection never carries one lab's search_path into another's request.
        connection.exec_driver_sql("SELECT set_config('search_path', %(schema)s, true)", {"schema": schema})
    return after_begin


@contextmanager
def lab_session(schema: str) -> Iterator[Session]:
    """An ORM session whose every transaction works in ``schema``."""
    session = Session(db.engine, expire_on_commit=False)
    event.listen(session, "after_begin", _set_search_path(schema))
    try:
        yield session
    finally:
        session.close()


def init_app(app: Flask) -> None:
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(app.config["DATABASE_URL"])
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", {"pool_pre_ping": True, "pool_size": 5,
                                                        "connect_args": {"connect_timeout": 3}})
    db.init_app(app)
