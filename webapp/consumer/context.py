"""What a strategy's ``apply`` gets from the consumer: the effects connection, the ledger, the crash points.

A strategy (webapp/strategies/) runs its SQL with ``execute`` inside ``transaction()`` on the
effects connection, writes the delivery's ledger row with ``record_delivery``, and passes the crash
points with ``checkpoint`` (strategies/base.Context). The effects connection is a session of its
own, named so in ``pg_stat_activity``, in the group's effects schema, quiet on the change feed (the
report announces the effects: report.py), with the lab's lock_timeout and
idle_in_transaction_session_timeout and a statement_timeout bounded below max.poll.interval.ms.

Crash points are real: ``crash`` is SIGKILL to ourselves (no commit, no group leave); ``freeze`` is
SIGSTOP to ourselves (a process pause like a long GC; the agent sends SIGCONT); step mode waits at
every point until the learner advances it, polling meanwhile so the consumer stays in its group.
"""
from __future__ import annotations

import os
import signal
from typing import Any

import psycopg

from ..domain import events
from ..domain.group_health import lock_timeout_ms as bounded_lock_timeout
from ..domain.group_health import statement_timeout_ms
from ..store.connection import connect
from ..store.lab_changes import QUIET_SESSION
from ..strategies.base import RECORD_DELIVERY, SESSION_SETTINGS


class EffectsContext:
    """One consumer process's context for its strategy. ``process`` is the consumer
    (loop.ConsumerProcess): the message it holds, its settings, control row, report and reporter."""

    def __init__(self, process: Any):
        self.process = process
        self.step_seen = process.desired.step_advance  # the last step advance this process acted on
        self.session_settings: tuple[int, int, int] | None = None
        self.conn: psycopg.Connection | None = self._connect()

    # --- the strategy's context ----------------------------------------------------------

    def execute(self, statement: str, params: dict[str, Any]) -> psycopg.Cursor:
        return self.conn.execute(statement, params)

    def transaction(self):
        return self.conn.transaction()

    def record_delivery(self, event: events.PaymentEvent | None, outcome: str, reason: str | None = None) -> None:
        """The ledger row of the message the consumer holds (its last statement before the commit)."""
        process = self.process
        message = process.current
        self.execute(RECORD_DELIVERY, {
            "group_id": process.group_id, "consumer": process.name, "partition": message.partition(),
            "offset": message.offset(), "generation": process.report.generation,
            "event_id": event.event_id if event else None, "transaction_id": event.transaction_id if event else None,
            "strategy": process.strategy_name, "outcome": outcome, "reason": reason})
        # The ledger row is the last statement of an effect's transaction: a notify before the commit goes here.
        process.notifier.before_commit(event, outcome)

    def checkpoint(self, point: str) -> None:
        """A crash point: die, freeze or wait for a step here when the lab asked for it."""
        process = self.process
        desired = process.desired
        if desired.step_mode:
            self._step(point)
        if desired.armed_point != point:
            return
        if not desired.armed_always:
            process.control.disarm()
            desired.armed_point = None
        where = self._where()
        report, reporter = process.report, process.reporter
        if desired.armed_action == "freeze":
            reporter.say("frozen", f"{process.name} froze itself at {point} {where}", point=point)
            report.state = "frozen"
            reporter.write()
            os.kill(os.getpid(), signal.SIGSTOP)
            # SIGCONT from the agent: carry on exactly where we were, as a paused JVM would.
            report.state = "running"
            reporter.write()
            return
        reporter.say("crashed", f"{process.name} crashed at {point} {where}", point=point)
        report.state = "crashed"
        report.step_at = point
        reporter.write()
        os.kill(os.getpid(), signal.SIGKILL)

    def _step(self, point: str) -> None:
        process = self.process
        process.report.step_at = point
        process.report.state = "stepping"
        process.reporter.write()
        self.step_seen = process.control.wait_for_advance(self.step_seen, lambda: not process.stopping,
                                                          wait=process.keep_alive)
        process.desired = process.control.read()
        process.report.state = "running"

    def _where(self) -> str:
        process = self.process
        if process.batch_span is not None:
            return process.batch_span
        message = process.current
        return f"(partition {message.partition()}, offset {message.offset()})" if message is not None else ""

    # --- the effects connection ------------------------------------------------------------

    def ensure_connected(self) -> None:
        """Reconnect after a lost session; raises OperationalError while the database is away."""
        conn = self.conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
                self.conn = None
            self.conn = self._connect()

    def usable(self) -> bool:
        """Whether the effects connection is open and not broken."""
        conn = self.conn
        return conn is not None and not (conn.closed or conn.broken)

    def apply_session_settings(self, lock_timeout_ms: int, idle_timeout_ms: int) -> None:
        """The lab's lock_timeout and idle_in_transaction_session_timeout on the effects connection,
        with a statement_timeout and a lock_timeout below max.poll.interval.ms whatever the lab's
        settings (domain/group_health.py): no statement keeps the consumer from polling that long."""
        poll_interval = self.process.group.max_poll_interval_ms
        wanted = (bounded_lock_timeout(lock_timeout_ms, poll_interval), statement_timeout_ms(poll_interval),
                  idle_timeout_ms)
        if wanted == self.session_settings:
            return
        self.conn.execute(SESSION_SETTINGS, {"lock_timeout": f"{wanted[0]}ms",
                                             "statement_timeout": f"{wanted[1]}ms",
                                             "idle_in_transaction_session_timeout": f"{idle_timeout_ms}ms"})
        self.session_settings = wanted

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()

    def _connect(self) -> psycopg.Connection:
        process = self.process
        self.session_settings = None  # a new session: the lab's settings are applied again
        # Named, so pg_stat_activity (and a person looking for who holds a lock) can tell it apart.
        conn = connect(process.database_url, schema=process.effects_schema, autocommit=True,
                       application_name=f"lab {process.lab.name} {process.name} effects")
        conn.execute(QUIET_SESSION)  # its effects are announced by the report (report.py)
        return conn
