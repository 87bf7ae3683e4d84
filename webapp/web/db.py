"""The web app's database integration (flaskr's ``db.py``): Flask-SQLAlchemy, given the store's
MetaData, hands out the engine and sessions inside Flask; a session can work in a lab's schema.

Every lab lives in its own PostgreSQL schema. A session sets ``search_path`` at the start of
each transaction, so the store's statements, raw SQL and the strategies' SQL all name plain tables
(``accounts``, ``processed_events``) and land in the lab they work in.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy.orm import Session

from ..store.connection import sqlalchemy_url
from ..store.schema import session_in
from ..store.tables import metadata

db = SQLAlchemy(metadata=metadata)


@contextmanager
def lab_session(schema: str) -> Iterator[Session]:
    """An ORM session on the app's engine whose every transaction works in ``schema``."""
    with session_in(db.engine, schema) as session:
        yield session


def init_app(app: Flask) -> None:
    app.config["SQLALCHEMY_DATABASE_URI"] = sqlalchemy_url(app.config["DATABASE_URL"])
    app.config.setdefault("SQLALCHEMY_ENGINE_OPTIONS", {"pool_pre_ping": True, "pool_size": 5,
                                                        "connect_args": {"connect_timeout": 3}})
    db.init_app(app)
