"""Connections to the lab's PostgreSQL, for every process: URLs in the forms SQLAlchemy and psycopg
want, and plain psycopg connections for the processes outside Flask (consumers, the agent).

Every lab lives in its own PostgreSQL schema (``schema.py`` enters one); the control plane lives
in ``lab_control``.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Any, Callable, TypeVar

import psycopg

log = logging.getLogger(__name__)
T = TypeVar("T")

CONTROL_SCHEMA = "lab_control"
# The backoff between attempts to reach PostgreSQL again: doubled after each failed attempt, from
# the first to the longest (a restart takes a second or two; nobody waits long once it is back).
FIRST_RECONNECT_DELAY = 0.1
LONGEST_RECONNECT_DELAY = 2.0
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


def with_reconnect_backoff(open_connection: Callable[[], T], *, wait: float | None = None,
                           going_on: Callable[[], bool] = lambda: True,
                           sleep: Callable[[float], Any] = time.sleep) -> T | None:
    """What ``open_connection()`` returns, called again after each ``psycopg.OperationalError``
    (PostgreSQL restarting, or not up yet) with a doubling backoff between attempts.

    Raises the last error once the next attempt would come after ``wait`` seconds (None: no limit);
    returns None once ``going_on()`` is false (the caller is stopping). ``sleep`` waits the backoff
    (an event's ``wait`` lets a stop cut it short)."""
    deadline = None if wait is None else time.monotonic() + wait
    delay = FIRST_RECONNECT_DELAY
    while going_on():
        try:
            return open_connection()
        except psycopg.OperationalError as error:
            if deadline is not None and time.monotonic() + delay > deadline:
                raise
            if delay == FIRST_RECONNECT_DELAY:
                log.warning("PostgreSQL does not answer (%s); waiting for it", str(error).splitlines()[0])
            sleep(delay)  # a backoff between connection attempts, not a guess at a condition
            delay = min(delay * 2, LONGEST_RECONNECT_DELAY)
    return None
