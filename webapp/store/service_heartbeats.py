"""Statements on ``lab_control.service_heartbeats``, and the beating thread of a helper process.

The log reader and the notification service each run a :class:`Beater`: every
SERVICE_BEAT_SECONDS it refreshes the row of its service on its host, if the part of the process
that does the work still turns (``alive``: a log reader whose reading loop stopped turning does not
beat, though its process lives). The row is the process's own (service, host, pid); a graceful
stop deletes it, and the rows of killed processes are deleted by a later one after ten minutes.
The beat is one UPDATE on a connection of its own, so it never waits for the work's connection;
a database that does not answer is tried again at the next beat.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Callable

import psycopg

from ..domain.vocabulary import SERVICE_BEAT_SECONDS
from .connection import CONTROL_SCHEMA, connect

log = logging.getLogger("idempotency_lab.heartbeat")

TABLE = f"{CONTROL_SCHEMA}.service_heartbeats"
LOG_READER = "log reader"
NOTIFICATION_SERVICE = "notification service"
SERVICES = (LOG_READER, NOTIFICATION_SERVICE)

BEAT_SQL = (f"INSERT INTO {TABLE} (service, host, pid) VALUES (%s, %s, %s) "
            "ON CONFLICT (service, host, pid) DO UPDATE SET heartbeat_at = now()")
# A killed process leaves its row: the next of its service deletes those silent for this long.
FORGET_AFTER_SECONDS = 600
FORGET_SQL = (f"DELETE FROM {TABLE} WHERE service = %s "
              f"AND heartbeat_at < now() - make_interval(secs => {FORGET_AFTER_SECONDS})")
REMOVE_SQL = f"DELETE FROM {TABLE} WHERE service = %s AND host = %s AND pid = %s"


class Beater:
    """Beat for ``service`` on a daemon thread until :meth:`stop`."""

    def __init__(self, database_url: str, service: str, alive: Callable[[], bool] = lambda: True,
                 every: float = SERVICE_BEAT_SECONDS):
        self.database_url, self.service, self.alive, self.every = database_url, service, alive, every
        self.host, self.pid = socket.gethostname(), os.getpid()
        self._conn: psycopg.Connection | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"{service} heartbeat", daemon=True)

    def start(self) -> "Beater":
        self._thread.start()
        return self

    def beat(self) -> None:
        """One beat, if the work still turns; a failure is logged and the connection dropped."""
        if not self.alive():
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.database_url, autocommit=True, connect_timeout=2)
            self._conn.execute(BEAT_SQL, (self.service, self.host, self.pid))
        except psycopg.Error as error:
            log.warning("%s heartbeat: %s", self.service, str(error).splitlines()[0] if str(error) else error)
            self._close()

    def _loop(self) -> None:
        self.beat()
        try:
            if self._conn is not None:
                self._conn.execute(FORGET_SQL, (self.service,))
        except psycopg.Error as error:
            log.warning("%s heartbeat: %s", self.service, error)
            self._close()
        while not self._stop.wait(self.every):
            self.beat()

    def stop(self) -> None:
        """Stop beating and delete our row: a graceful stop is not shown as a silent death."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            if self._conn is None or self._conn.closed:
                self._conn = connect(self.database_url, autocommit=True, connect_timeout=2)
            self._conn.execute(REMOVE_SQL, (self.service, self.host, self.pid))
        except psycopg.Error as error:
            log.warning("%s heartbeat: could not remove its row: %s", self.service, error)
        finally:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None
