"""The outbox relay: publish a lab's unsent outbox rows to Kafka, then mark them sent.

One cycle (store/outbox.py has the SQL, shown on screen as the plan):

1. ``BEGIN``; the unsent rows in order, ``FOR UPDATE SKIP LOCKED``;
2. crash point ``relay-before-publish``;
3. produce each row's payload (the event exactly as the payments service wrote it) with the
   lab's producer config, ``flush()`` and wait for every delivery report;
4. record each publish (``outbox_publishes``) on a second connection, committed at once;
5. crash point ``relay-after-publish-before-mark``;
6. ``UPDATE outbox SET published_at = now()``; ``COMMIT``.

Killed between 3 and 6, the relay leaves the rows unsent (PostgreSQL rolls its transaction back
when the connection drops); the agent starts it again and it publishes them again, with the same
event ids: the relay is at-least-once too. A crash point is a real SIGKILL to itself.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Producer

from ..domain.lab import Lab
from ..kafka.config import producer_config
from ..store import outbox as sql
from ..store import timeline
from ..store.connection import connect
from ..store.schema import enter_psycopg, quoted

log = logging.getLogger("idempotency_lab.outbox")

BATCH = 100
POLL_INTERVAL = 0.2    # seconds between looks at an empty outbox
BEAT_EVERY = 1.0
RETRY_AFTER = 1.0      # after a database or Kafka error
FLUSH_TIMEOUT = 30.0


@dataclass(frozen=True)
class Row:
    id: int
    event_id: str
    key: str
    payload: str
    published_before: int

    @property
    def summary(self) -> str:
        """``credit acc-1 +100.00 (event 1a2b3c4d)``, from the payload as published."""
        try:
            event = json.loads(self.payload)
            amount = f" +{event['amount_cents'] / 100:.2f}" if isinstance(event.get("amount_cents"), int) else ""
            return f"{event.get('type', 'event')} {event.get('account_id', self.key)}{amount} (event {self.event_id[:8]})"
        except (ValueError, TypeError, KeyError):
            return f"event {self.event_id[:8]}"


@dataclass(frozen=True)
class Delivery:
    partition: int | None
    offset: int | None
    error: str | None


class LabGone(Exception):
    """The lab's schema, or its wish for a relay, is gone (a reset, a removal): stop for good."""


class Relay:
    """Relay ``lab``'s outbox: ``Relay(database_url, bootstrap_servers, lab).run(stop_event)``."""

    def __init__(self, database_url: str, bootstrap_servers: str, lab: Lab, agent_id: str | None = None,
                 batch: int = BATCH, poll_interval: float = POLL_INTERVAL):
        self.database_url, self.lab, self.agent_id = database_url, lab, agent_id
        self.batch, self.poll_interval = batch, poll_interval
        # The lab's producer config: the relay's duplicates are not producer retries, so
        # enable.idempotence, on here, cannot stop them.
        self.producer = Producer(producer_config(bootstrap_servers, idempotent=True, client_id=lab.producer_client_id))
        self.pid = os.getpid()
        self.conn: psycopg.Connection | None = None     # the claim-publish-mark transaction
        self.reports: psycopg.Connection | None = None  # reports, committed at once

    # --- connections -------------------------------------------------------------------------

    def _connect(self) -> None:
        for conn in (self.conn, self.reports):
            if conn is not None and not conn.closed:
                conn.close()
        self.conn = connect(self.database_url, autocommit=True)
        self.reports = connect(self.database_url, autocommit=True)

    def _report(self, statement: str, params: dict[str, Any] | None = None, fetch: bool = False) -> list[tuple]:
        """Run one statement on the reporting connection in the lab's schema, committed now; its
        rows when ``fetch``."""
        with self.reports.transaction():
            enter_psycopg(self.reports, self.lab.schema)
            cursor = self.reports.execute(statement, params or {})
            return cursor.fetchall() if fetch else []

    def _say(self, summary: str, **detail: Any) -> None:
        with self.reports.transaction():
            enter_psycopg(self.reports, self.lab.schema)
            timeline.record(self.reports.execute, "outbox", summary, relay_pid=self.pid, **detail)

    def _alive(self, error: str | None = None) -> None:
        """Beat; raise LabGone when the lab no longer has a relay row (reset) or a schema."""
        gone = LabGone(f"lab {self.lab.name} no longer asks for a relay")
        try:
            exists = self.reports.execute("SELECT to_regclass(%s) IS NOT NULL",
                                          [f'{quoted(self.lab.schema)}.relay_state']).fetchone()[0]
            if not exists or not self._report(sql.BEAT, {"error": error}, fetch=True):
                raise gone
        except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName):
            raise gone from None  # dropped between the two statements: a reset under way

    # --- the loop ----------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> int:
        """Relay until ``stop`` is set (0) or the lab is gone (0)."""
        self._connect()
        try:
            started = self._report(sql.STARTED, {"pid": self.pid, "agent": self.agent_id}, fetch=True)[0]
        except psycopg.errors.UndefinedTable:
            log.info("lab %s has no outbox: nothing to relay", self.lab.name)
            return 0
        starts, unsent = started
        again = (f"; it publishes the {unsent} unsent row(s) now, whether or not an earlier relay published them "
                 "already" if starts > 1 and unsent else "")
        self._say(f"outbox relay started (pid {self.pid}, start #{starts}): {unsent} unsent row(s){again}",
                  action="started", starts=starts, unsent=unsent)
        log.info("relaying the outbox of lab %s", self.lab.name)
        last_beat, error = 0.0, None
        try:
            while not stop.is_set():
                if time.monotonic() - last_beat >= BEAT_EVERY:
                    self._alive(error)
                    last_beat = time.monotonic()
                try:
                    moved = self.cycle()
                    error = None
                except psycopg.OperationalError as failure:  # PostgreSQL restarting: connect again
                    error = f"database: {str(failure).splitlines()[0]}"
                    log.warning("%s", error)
                    stop.wait(RETRY_AFTER)
                    self._connect()
                    continue
                except (psycopg.Error, RelayError) as failure:
                    error = str(failure).splitlines()[0]
                    log.warning("%s", error)
                    stop.wait(RETRY_AFTER)
                    continue
                if not moved:
                    stop.wait(self.poll_interval)
        except LabGone as gone:
            log.info("%s: stopping", gone)
            return 0
        self._report(sql.STOPPED, {"pid": self.pid})
        self._say(f"outbox relay stopped (pid {self.pid})", action="stopped")
        self.producer.flush(5)
        return 0

    def cycle(self) -> int:
        """Claim, publish, record, mark: the number of rows marked sent (0: the outbox is empty)."""
        with self.conn.transaction():
            enter_psycopg(self.conn, self.lab.schema)
            rows = [Row(*r) for r in self.conn.execute(sql.CLAIM, {"batch": self.batch}).fetchall()]
            if not rows:
                return 0
            self._crash_if_armed("relay-before-publish", rows, "claimed, not published")
            deliveries = self._produce(rows)
            delivered = [(row, d) for row, d in zip(rows, deliveries) if d.error is None]
            self._record(delivered)
            self._crash_if_armed("relay-after-publish-before-mark", [row for row, _ in delivered],
                                 "published, not marked sent")
            if delivered:
                self.conn.execute(sql.MARK_SENT, {"ids": [row.id for row, _ in delivered]})
                timeline.record(self.conn.execute, "outbox",
                                f"outbox relay marked {len(delivered)} row(s) sent", action="marked",
                                relay_pid=self.pid, event_ids=[row.event_id for row, _ in delivered][:20])
        failed = [d.error for d in deliveries if d.error is not None]
        if failed:
            raise RelayError(f"Kafka refused {len(failed)} row(s): {failed[0]}; they stay unsent")
        return len(delivered)

    def _produce(self, rows: list[Row]) -> list[Delivery]:
        reports: list[Delivery | None] = [None] * len(rows)

        def on_delivery(index: int):
            def callback(error: KafkaError | None, message) -> None:
                offset = message.offset() if message is not None else None
                reports[index] = Delivery(message.partition() if message is not None else None,
                                          offset if offset is not None and offset >= 0 else None,
                                          error.str() if error is not None else None)
            return callback

        for index, row in enumerate(rows):
            while True:
                try:
                    self.producer.produce(self.lab.topic, key=row.key.encode(), value=row.payload.encode(),
                                          headers=[("source", b"outbox-relay"), ("outbox_id", str(row.id).encode())],
                                          on_delivery=on_delivery(index))
                    break
                except BufferError:
                    self.producer.poll(0.1)  # local queue full: serve delivery reports, then retry
        remaining = self.producer.flush(FLUSH_TIMEOUT)
        if remaining:
            raise RelayError(f"{remaining} row(s) not acknowledged by Kafka within {FLUSH_TIMEOUT:.0f}s; they stay unsent")
        return [report or Delivery(None, None, "no delivery report") for report in reports]

    def _record(self, delivered: list[tuple[Row, Delivery]]) -> None:
        """Each publish, its count and a timeline line, committed now (before the mark)."""
        if not delivered:
            return
        with self.reports.transaction():
            enter_psycopg(self.reports, self.lab.schema)
            for row, d in delivered:
                self.reports.execute(sql.RECORD_PUBLISH, {
                    "outbox_id": row.id, "event_id": row.event_id, "attempt": row.published_before + 1,
                    "partition": d.partition, "offset": d.offset, "pid": self.pid})
            republished = [row for row, _ in delivered if row.published_before]
            self.reports.execute(sql.COUNT_PUBLISH, {"published": len(delivered), "republished": len(republished),
                                                     "event_id": delivered[-1][0].event_id})
            for row, d in delivered[:20]:
                again = (f" again (publish #{row.published_before + 1}: an earlier relay published it and died "
                         "before marking it sent)" if row.published_before else "")
                timeline.record(self.reports.execute, "outbox",
                                f"outbox relay published {row.summary} to P{d.partition}@{d.offset}{again}",
                                action="republished" if row.published_before else "published", relay_pid=self.pid,
                                event_id=row.event_id, partition=d.partition, offset=d.offset)

    def _crash_if_armed(self, point: str, rows: list[Row], left: str) -> None:
        """At an armed crash point: say so, disarm (unless always), and SIGKILL this process."""
        armed = self._report(sql.ARMED, fetch=True)
        armed_point = armed[0][0] if armed else None
        if armed_point != point or not rows:
            return
        self._report(sql.DISARM)
        self._report(sql.CRASHING, {"point": point})
        self._say(f"outbox relay killed at {point} (SIGKILL): {len(rows)} row(s) {left}",
                  action="crashed", point=point, event_ids=[row.event_id for row in rows][:20])
        log.warning("crash point %s: SIGKILL", point)
        sys.stdout.flush()
        sys.stderr.flush()
        os.kill(self.pid, signal.SIGKILL)


class RelayError(Exception):
    """Kafka did not take some rows: they stay unsent, and the next cycle tries them again."""
