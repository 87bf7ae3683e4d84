"""Connections to the lab's PostgreSQL, for every process: URLs in the forms SQLAlchemy and psycopg
want, and plain psycopg connections for the processes outside Flask (consumers, the agent).

Every lab lives in its own PostgreSQL schema (``schema.py`` enters one); the control plane lives
in ``lab_control``.
"""
from __future__ import annotations

import re

import psycopg

CONTROL_SCHEMA = "lab_control"
# A SQLAlchemy URL's scheme, with or without a driver (postgresql+psycopg://): libpq wants postgresql://.
DRIVER_SCHEME = re.compile(r"^postgres(?:ql)?(?:\+\w+)?://")


def sqlalchemy_url(url: str) -> str:
    """Any PostgreSQL URL as the psycopg-3 SQLAlchemy dialect wants it."""
    # Imported here: a consumer process connects with psycopg alone and never loads SQLAlchemy.
    from sqlalchemy.engine import make_url
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise ValueError(f"DATABASE_URL must be a PostgreSQL URL, got {parsed.drivername}")
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def psycopg_conninfo(url: str) -> str:
    """The same URL as plain psycopg (libpq) accepts it: the scheme without a driver name."""
    if not DRIVER_SCHEME.match(url):
        raise ValueError(f"DATABASE_URL must be a PostgreSQL URL, got {url.split('://', 1)[0]}://…")
    return DRIVER_SCHEME.sub("postgresql://", url, count=1)


def connect(url: str, schema: str | None = None, **kwargs) -> psycopg.Connection:
    """A psycopg connection for processes outside Flask (consumers, the lab agent)."""
    options = f"-c search_path={schema}" if schema else None
    return psycopg.connect(psycopg_conninfo(url), options=options, **kwargs)
