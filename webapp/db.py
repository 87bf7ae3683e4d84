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
    """A psycopg connection for processes outside Flask (consumers, the lab agent)."""
    options = f"-c search_path={schema}" if schema else None
    return psycopg.connect(psycopg_conninfo(url), options=options, **kwargs)


@contextmanager
def lab_session(schema: str) -> Iterator[Session]:
    """An ORM session on the app's engine whose every transaction works in ``schema``."""
    from .store.schema import session_in

    with session_in(db.engine, schema) as session:
        yield session


def init_app(app: Flask) -> None:
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(app.config["DATABASE_URL"])
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", {"pool_pre_ping": True, "pool_size": 5,
                                                        "connect_args": {"connect_timeout": 3}})
    db.init_app(app)
