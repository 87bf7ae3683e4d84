"""The consumer process: poll, validate, apply the group's strategy, commit the offset.

Shaped like confluent-kafka-python's examples: poll with a timeout, tell fatal errors from
passing ones, handle bad records explicitly (dead-letter topic, never a silent skip), process,
then commit, close in ``finally``. The offset is committed only after the database
transaction has committed. First SIGTERM: finish the message, commit, leave the group.
Second SIGTERM: exit at once.

What it applies (its control row, its group's settings: settings.py) is read when it starts, on
its heartbeat, and before a message whenever a change was notified since (settings_changes.py:
every change NOTIFYs, and the consumer looks at what its control connection already received,
no round trip); the report is written on the heartbeat's cadence. A group with a batch size
above 1 runs batch mode instead (batch.py): consume(n), one transaction, one offset commit per
batch.

The effect transactions announce nothing on the live panels' change feed (store/lab_changes.py:
the effects connection is a quiet session): a transaction that NOTIFYs takes PostgreSQL's
cluster-wide notify lock at commit and wakes every listener, once per record. The report
announces the lab instead: written at once after the first effect that follows a quiet spell of
HEARTBEAT_EVERY, then on the heartbeat's cadence while effects keep coming.

Offsets are committed in the group's commit mode: ``sync``, ``async``, or ``transactional``: a
Kafka transaction of the consumer's own (``transactional.id`` per consumer, stable across its
restarts) carries them (``send_offsets_to_transaction``, then ``commit_transaction``), the
consume-transform-produce half that Kafka's exactly-once is made of. The PostgreSQL effect is
committed before that transaction begins and is never part of it; a crash inside it leaves it
open until the next process with the same ``transactional.id`` fences it and aborts it at
``init_transactions`` (or ``transaction.timeout.ms`` passes), so the offset is not committed and
the record comes back.

Crash points are real: ``crash`` is SIGKILL to ourselves (no commit, no group leave);
``freeze`` is SIGSTOP to ourselves (a process pause like a long GC; the agent sends SIGCONT).

Every error class has a defined, visible outcome; none ends the process (ERROR_OUTCOMES):

- an invalid record (undecodable, invalid field, unknown account): the dead-letter topic with its
  reason at once, the offset committed;
- ``UniqueViolation`` with the group's ``on_unique_violation = already-processed`` (the default,
  the 001 seed's way): the transaction is rolled back, the delivery recorded as absorbed
  ("unique violation: already processed") in a new transaction, the offset committed;
- any other database error, and ``UniqueViolation`` under ``retry``: rolled back, recorded as a
  ``failed`` delivery, retried after a backoff while its partition is paused (it stalls, its lag
  grows; other partitions flow), and after MAX_ATTEMPTS attempts dead-lettered with the reason;
- a transaction PostgreSQL rolled back because of a concurrent one (``SerializationFailure``,
  40001, under REPEATABLE READ; ``DeadlockDetected``, 40P01): recorded as a ``failed`` delivery
  and retried in a new transaction as long as it takes, never dead-lettered;
- a lost connection or a timeout (``OperationalError``: session terminated, PostgreSQL down,
  lock_timeout): transient, retried with a growing backoff as long as it takes, never
  dead-lettered (a record is not bad because the database is away).
"""
from __future__ import annotations

import logging
import os
import signal
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from .. import strategies
from ..domain import events
from ..domain.group_health import lock_timeout_ms as bounded_lock_timeout
from ..domain.group_health import statement_timeout_ms
from ..domain.lab import Lab
from ..domain.vocabulary import AGENT_PID, KAFKA_DEBUG, SETTINGS_CHANNEL
from ..kafka.config import consumer_config, producer_config
from ..kafka.group import group_generation
from ..store import schema, timeline
from ..store.connection import connect
from ..store.lab_changes import QUIET_SESSION
from ..strategies.base import (
    ABSORBED,
    APPLIED,
    DEAD_LETTERED,
    FAILED,
    RECORD_DELIVERY,
    SESSION_SETTINGS,
    UNIQUE_VIOLATION_REASON,
)
from . import settings as group_settings
from .batch import BatchLoop
from .control import ControlRow, Report
from .notify import NotificationStopped, Notifier

log = logging.getLogger("idempotency_lab.consumer")

POLL_TIMEOUT = 0.2
HEARTBEAT_EVERY = 0.5
# A failing record is attempted this many times in all, then dead-lettered; between attempts its
# partition waits BACKOFF_SECONDS[attempt - 1] (the last value for every later transient retry).
MAX_ATTEMPTS = 3
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 5.0)
# A synchronous commit that failed on its way to the group coordinator (the path is down, the
# coordinator moved) is tried again before the next record, like the Java client's commitSync: the
# offsets are still ours to commit. A failure that fences us (a new generation) is not retried.
RETRIABLE_COMMIT_ERRORS = frozenset({
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
COMMIT_RETRY_PAUSE = 0.2
# How long each call of a Kafka transaction waits (init, send_offsets_to_transaction, commit, abort).
TRANSACTION_TIMEOUT = 15.0
# SQLSTATE class 40 as PostgreSQL raises it between sessions (psycopg 3 derives these from
# OperationalError directly, not from its TransactionRollback class).
ROLLED_BACK_BY_A_CONCURRENT_TRANSACTION = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
ERROR_OUTCOMES = (
    ("invalid record (events.InvalidEvent: undecodable, invalid field, unknown account)",
     "dead-lettered at once with its reason; offset committed"),
    ("psycopg.errors.UniqueViolation, on_unique_violation = already-processed",
     f"rolled back; delivery recorded as absorbed ('{UNIQUE_VIOLATION_REASON}'); offset committed"),
    ("psycopg.errors.UniqueViolation, on_unique_violation = retry",
     f"as any other database error: failed, retried with backoff, dead-lettered after {MAX_ATTEMPTS} attempts"),
    ("other database error (psycopg.Error: data, integrity, programming, internal)",
     f"rolled back; 'failed' delivery; partition paused for a backoff, retried; after {MAX_ATTEMPTS} attempts "
     "dead-lettered with the error; offset committed"),
    ("psycopg.errors.SerializationFailure (40001) or DeadlockDetected (40P01)",
     "rolled back by a concurrent transaction; 'failed' delivery; partition paused for a backoff, retried in a "
     "new transaction, as often as it takes, never dead-lettered; offset not committed"),
    ("psycopg.OperationalError or a closed connection (session terminated, database down, lock_timeout)",
     "transient: reconnect and retry with a growing backoff, never dead-lettered; offset not committed"),
)


class Stop(Exception):
    """Raised inside processing when the consumer was asked to stop mid-step."""


@dataclass
class Retry:
    """A record of one partition that failed: how often, and when its partition resumes."""
    offset: int
    attempts: int = 0
    resume_at: float = 0.0
    paused: bool = False


class ConsumerProcess:
    def __init__(self, *, lab: Lab, consumer_id: int, name: str, group_id: str, database_url: str,
                 bootstrap_servers: str):
        self.lab = lab
        self.consumer_id = consumer_id
        self.name = name
        self.group_id = group_id
        self.database_url = database_url
        self.bootstrap_servers = bootstrap_servers
        self.report = Report()
        self.stopping = False
        self.current: Message | None = None
        self._last_heartbeat = 0.0
        # The report announces the effects on the change feed (the effect transactions do not):
        # whether an effect was committed since the last report, and when one was last reported.
        self._effects_unreported = False
        self._effects_reported_at = 0.0
        self._dlq: Producer | None = None
        self._offsets_producer: Producer | None = None  # commit mode transactional: its own producer
        # Its parent is the agent's fork server, which exits with the agent: a new parent means
        # the agent is gone. The agent's own pid comes in the environment, to name it.
        self._parent_pid = os.getppid()
        self._agent_pid = int(os.environ.get(AGENT_PID) or self._parent_pid)
        self.orphaned = False  # its agent died: it stops itself and reports "gone"
        self.control_broken: psycopg.OperationalError | None = None  # noted in a rebalance callback
        self.retrying: dict[tuple[str, int], Retry] = {}

        self.control_conn = connect(database_url, autocommit=True, application_name=f"lab {lab.name} {name} control")
        self.settings_notified = False
        self._listen(self.control_conn)  # before the first read: a change after it is notified
        self.control = ControlRow(self.control_conn, consumer_id)
        self.desired = self.control.read()
        self.step_seen = self.desired.step_advance
        # Counts are the consumer's over all its processes: a restart carries on from them. The
        # generation is the group's (read at each assignment); until then, the last one reported.
        self.report.counts = self.control.counts()
        self.report.generation = self.control.generation()
        self.strategy_name, self.effects_schema = self._group_settings()
        self.desired, self.group = self._read_settings()
        self.batch_span: str | None = None  # where a batch is, for the timeline, while one is applied
        self.batches = BatchLoop(self)
        self.notifier = Notifier(self)  # the external side effect, when the group asks for it
        self.effects_conn: psycopg.Connection | None = self._connect_effects()
        # The group's Kafka id: its own, or the fresh one a recovery moved it to (ops/groups.py recover).
        self.kafka_group_id = self.group.kafka_group_id or group_id
        self._holding = 0  # keep_alive's depth: partitions paused while the process waits
        self.consumer = Consumer({**consumer_config(bootstrap_servers, self.kafka_group_id,
                                                    client_id=lab.client_id(name),
                                                    max_poll_interval_ms=self.group.max_poll_interval_ms,
                                                    debug=os.environ.get(KAFKA_DEBUG, "")),
                                  **group_settings.client_settings(self.group, group_id, name),
                                  "on_commit": self._on_commit})
        if self.group.transactional_commits:
            # At once, not at the first commit: init_transactions aborts a transaction the previous
            # process under this transactional.id left open (a crash inside it), so the group's
            # committed offset is settled before this process reads it.
            self._transactional_producer()

    # --- settings ----------------------------------------------------------------------

    def _group_settings(self) -> tuple[str, str]:
        row = self.control_conn.execute(
            f'SELECT strategy, effects_schema FROM "{self.lab.schema}".consumer_groups WHERE group_id = %s',
            [self.group_id]).fetchone()
        if row is None:
            raise RuntimeError(f"group {self.group_id} is not defined in lab {self.lab.name}")
        return row

    def _on_unique_violation(self) -> str:
        row = self.control_conn.execute(
            f'SELECT on_unique_violation FROM "{self.lab.schema}".consumer_groups WHERE group_id = %s',
            [self.group_id]).fetchone()
        return row[0] if row and row[0] in strategies.ON_UNIQUE_VIOLATION else "already-processed"

    def _read_settings(self) -> tuple:
        """The control row and the group's settings, in one query (consumer/settings.py)."""
        return group_settings.read(self.control_conn, self.lab.schema, self.group_id, self.consumer_id)

    def _listen(self, conn: psycopg.Connection) -> None:
        """Be told on ``conn`` of every change of what this consumer applies (settings_changes.py)."""
        conn.add_notify_handler(self._on_notify)
        conn.execute(f"LISTEN {SETTINGS_CHANNEL}")

    def _on_notify(self, notify: psycopg.Notify) -> None:
        if notify.channel == SETTINGS_CHANNEL and notify.payload == self.lab.name:
            self.settings_notified = True

    def refresh_settings(self) -> None:
        """Read the settings again when a change was notified since the last look.

        The look costs no round trip: it takes what PostgreSQL already sent to the control
        connection. A change committed before this look was sent at its commit; an operation
        that made it waits for this read's acknowledgement (settings_changes.settle)."""
        pgconn = self.control_conn.pgconn
        pgconn.consume_input()  # never blocks; raises OperationalError on a lost connection
        while (notify := pgconn.notifies()) is not None:
            pgconn.notify_handler(notify)  # psycopg's dispatch to _on_notify, as during a query
        if self.settings_notified:
            self.settings_notified = False
            self.desired, self.group = self._read_settings()

    def _current_strategy(self) -> strategies.Strategy:
        # The group's settings as they stood when this message was polled (refresh_settings): a
        # strategy switch (or new database settings) applies from the next message on.
        self.strategy_name = self.group.strategy
        self.notifier.use(self.group.notify, self.group.notify_idempotency_key)
        self._apply_session_settings(self.group.lock_timeout_ms, self.group.idle_in_transaction_session_timeout_ms)
        return strategies.get(self.strategy_name, partitioned=self._partitioned_dedup_table())

    def _partitioned_dedup_table(self) -> bool:
        """Whether the effects schema's processed_events is partitioned (webapp/strategies/dedup_layout.py), read
        from the catalog once per process: the layout changes only while the lab's consumers are stopped."""
        schema = self.group.effects_schema
        if getattr(self, "_dedup_layout", (None, False))[0] != schema:
            row = self.control_conn.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)",
                                            [f'"{schema}".processed_events']).fetchone()
            self._dedup_layout = (schema, bool(row and row[0]))
        return self._dedup_layout[1]

    def _apply_session_settings(self, lock_timeout_ms: int, idle_timeout_ms: int) -> None:
        """The lab's lock_timeout and idle_in_transaction_session_timeout on the effects connection,
        with a statement_timeout and a lock_timeout below max.poll.interval.ms whatever the lab's
        settings (domain/group_health.py): no statement keeps the consumer from polling that long."""
        poll_interval = self.group.max_poll_interval_ms
        wanted = (bounded_lock_timeout(lock_timeout_ms, poll_interval), statement_timeout_ms(poll_interval),
                  idle_timeout_ms)
        if wanted == self.session_settings:
            return
        self.effects_conn.execute(SESSION_SETTINGS, {"lock_timeout": f"{wanted[0]}ms",
                                                     "statement_timeout": f"{wanted[1]}ms",
                                                     "idle_in_transaction_session_timeout": f"{idle_timeout_ms}ms"})
        self.session_settings = wanted

    # --- the strategy's context ----------------------------------------------------------

    def execute(self, statement: str, params: dict[str, Any]) -> psycopg.Cursor:
        return self.effects_conn.execute(statement, params)

    def transaction(self):
        return self.effects_conn.transaction()

    def record_delivery(self, event: events.PaymentEvent | None, outcome: str, reason: str | None = None) -> None:
        message = self.current
        self.execute(RECORD_DELIVERY, {
            "group_id": self.group_id, "consumer": self.name, "partition": message.partition(),
            "offset": message.offset(), "generation": self.report.generation,
            "event_id": event.event_id if event else None, "transaction_id": event.transaction_id if event else None,
            "strategy": self.strategy_name, "outcome": outcome, "reason": reason})
        # The ledger row is the last statement of an effect's transaction: a notify before the commit goes here.
        self.notifier.before_commit(event, outcome)

    def checkpoint(self, point: str) -> None:
        """A crash point: die, freeze or wait for a step here when the lab asked for it."""
        desired = self.desired
        if desired.step_mode:
            self._step(point)
        if desired.armed_point != point:
            return
        if not desired.armed_always:
            self.control.disarm()
            desired.armed_point = None
        where = self._where()
        if desired.armed_action == "freeze":
            self._say("frozen", f"{self.name} froze itself at {point} {where}", point=point)
            self.report.state = "frozen"
            self.control.write(self.report)
            os.kill(os.getpid(), signal.SIGSTOP)
            # SIGCONT from the agent: carry on exactly where we were, as a paused JVM would.
            self.report.state = "running"
            self.control.write(self.report)
            return
        self._say("crashed", f"{self.name} crashed at {point} {where}", point=point)
        self.report.state = "crashed"
        self.report.step_at = point
        self.control.write(self.report)
        os.kill(os.getpid(), signal.SIGKILL)

    def _step(self, point: str) -> None:
        self.report.step_at = point
        self.report.state = "stepping"
        self.control.write(self.report)
        self.step_seen = self.control.wait_for_advance(self.step_seen, lambda: not self.stopping,
                                                       wait=self.keep_alive)
        self.desired = self.control.read()
        self.report.state = "running"

    def _where(self) -> str:
        if self.batch_span is not None:
            return self.batch_span
        message = self.current
        return f"(partition {message.partition()}, offset {message.offset()})" if message is not None else ""

    def _say(self, kind: str, summary: str, **detail: Any) -> None:
        """A timeline entry in the lab's schema, outside any effect transaction."""
        with self.control_conn.transaction():
            schema.enter_psycopg(self.control_conn, self.lab.schema)
            timeline.record(self.control_conn.execute, kind, summary, consumer=self.name,
                            group=self.group_id, **detail)

    # --- waits that keep the consumer in its group -------------------------------------------

    def keep_alive(self, seconds: float) -> None:
        """Let ``seconds`` pass while staying in the group: poll() with every assigned partition paused.

        librdkafka counts max.poll.interval.ms from the last poll(), and a rebalance waits for every
        member to poll (its callbacks run inside poll()). A consumer holding a record (step mode, a
        retried notification or commit) polls here, so it rejoins a rebalance at once instead of
        holding the group hostage. Paused partitions deliver nothing; a record that still comes (a
        partition assigned meanwhile) is sought back and its partition paused: it is delivered again
        after the wait, nothing is skipped. A rebalance meanwhile may move the held record's
        partition to another member: the records since its last commit go there too (at least once),
        and this consumer's late commit is the one of a zombie."""
        deadline = time.monotonic() + seconds
        self._hold()
        try:
            while (left := deadline - time.monotonic()) > 0:
                message = self.consumer.poll(min(left, POLL_TIMEOUT))
                if message is None:
                    continue
                if message.error():
                    self._on_error(message.error())
                    continue
                tp = TopicPartition(message.topic(), message.partition(), message.offset())
                try:
                    self.consumer.seek(tp)
                    self.consumer.pause([tp])
                except KafkaException:
                    pass  # revoked meanwhile: its next owner starts from the committed offset
        finally:
            self._release()

    def _hold(self) -> None:
        self._holding += 1
        if self._holding == 1:
            try:
                self.consumer.pause(self.consumer.assignment())
            except KafkaException:
                pass  # no assignment yet

    def _release(self) -> None:
        self._holding -= 1
        if self._holding:
            return
        try:
            waiting = {key for key, retry in self.retrying.items() if retry.paused}
            flowing = [tp for tp in self.consumer.assignment() if (tp.topic, tp.partition) not in waiting]
            if flowing:
                self.consumer.resume(flowing)
        except KafkaException:
            pass  # a rebalance took them: the next assignment starts unpaused

    # --- the loop ------------------------------------------------------------------------

    @contextmanager
    def _reporting_from_callback(self):
        """Around a rebalance callback's writes to PostgreSQL (and a commit retry's). No exception
        may leave a rebalance callback (it would surface from poll() mid-rebalance), nor a commit
        retry (its record's effect is committed): a connection lost to a PostgreSQL restart is noted,
        the loop reconnects next, and the report, kept in memory, goes out with the next heartbeat."""
        try:
            yield
        except psycopg.OperationalError as error:
            self.control_broken = error

    def on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        # The group's generation, the epoch of this rebalance shared by every member (not a count
        # of this consumer's assignments): a zombie's deliveries carry the stale one it held.
        # (No exception may leave a rebalance callback: an unknown format keeps the last one, logged.)
        generation = group_generation(consumer.consumer_group_metadata())
        if generation is None:
            log.warning("%s: librdkafka's group metadata gave no group generation", self.name)
        else:
            self.report.generation = generation
        self.report.assigned = sorted(p.partition for p in partitions)
        with self._reporting_from_callback():
            self.control.write(self.report)
            self._say("rebalanced", f"{self.name} assigned partitions {self.report.assigned or 'none'} "
                      f"(generation {self.report.generation})", partitions=self.report.assigned)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget_retries(partitions)
        self.report.assigned = []
        with self._reporting_from_callback():
            self.control.write(self.report)

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._forget_retries(partitions)
        self.report.assigned = []
        with self._reporting_from_callback():
            self._say("rebalanced", f"{self.name} lost partitions {sorted(p.partition for p in partitions)}")

    def _report_effects(self) -> None:
        """After an effect's transaction and its offset commit: the report announces the lab's new
        data on the change feed (its counts and positions moved). At once when no effect was
        reported for HEARTBEAT_EVERY (a learner's one record shows without delay), else with the
        next heartbeat (a stream of records: at most two reports a second)."""
        self._effects_unreported = True
        self.heartbeat(force=time.monotonic() - self._effects_reported_at >= HEARTBEAT_EVERY)

    def heartbeat(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_heartbeat < HEARTBEAT_EVERY:
            return
        self._last_heartbeat = now
        if self._effects_unreported:
            self._effects_unreported, self._effects_reported_at = False, now
        try:
            assignment = self.consumer.assignment()
            positions = self.consumer.position(assignment) if assignment else []
            self.report.positions = {str(tp.partition): tp.offset for tp in positions if tp.offset >= 0}
        except KafkaException:
            pass  # between rebalances there may be no position to report
        self.desired, self.group = self._read_settings()  # also while idle: a switch to batch mode shows
        if not self.desired.exists:
            log.info("consumer row deleted (lab reset): stopping")
            self.stopping = True
        if os.getppid() != self._parent_pid:
            # Our agent died without stopping us: nobody could kill, freeze or reap us now.
            log.info("the lab agent is gone: stopping")
            self.stopping = self.orphaned = True
            self.report.last_error = f"its lab agent (pid {self._agent_pid}) died: it stopped itself"
        self.control.write(self.report)

    def run(self) -> int:
        self.consumer.subscribe([self.lab.topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
                                on_lost=self.on_lost)
        self.report.state = "running"
        self._say("started", f"{self.name} joined group {self.group_id} ({self.strategy_name})")
        log.info("%s of lab %s joined group %s (%s)", self.name, self.lab.name, self.group_id, self.strategy_name)
        try:
            while not self.stopping:
                if self.control_broken is not None:
                    broken, self.control_broken = self.control_broken, None
                    self._control_lost(broken)
                try:
                    self.heartbeat()
                    self.refresh_settings()  # also while idle: an operation waits for it
                    self._resume_due()
                except psycopg.OperationalError as error:
                    self._control_lost(error)
                    continue
                if self.group.batch_mode:
                    self.batches.step()
                    continue
                message = self.consumer.poll(POLL_TIMEOUT)
                if message is None:
                    continue
                if message.error():
                    self._on_error(message.error())
                    continue
                self._process_until_done(message)
            return 0
        finally:
            # Gone, not stopped, when its agent died: nothing answers for this consumer any more.
            self.report.state = "gone" if self.orphaned else "stopped"
            self.report.assigned = []
            self.consumer.close()  # commits nothing (auto-commit is off), leaves the group
            if self._dlq is not None:
                self._dlq.flush(5)
            self._abort_open_transaction()
            try:
                self.control.write(self.report)
                self._say("stopped", f"{self.name} left group {self.group_id}"
                          + (f": its lab agent (pid {self._agent_pid}) died, nothing runs it now" if self.orphaned
                             else ""))
            except psycopg.OperationalError as error:
                # PostgreSQL restarting as we stop: the agent records how we ended (our exit code).
                log.warning("could not report the stop: %s", str(error).splitlines()[0])
            log.info("%s of lab %s left group %s: %s", self.name, self.lab.name, self.group_id, self.report.state)
            if self.effects_conn is not None:
                self.effects_conn.close()
            self.control_conn.close()

    def _process_until_done(self, message: Message) -> None:
        """Process the message; when the control connection is lost on the way (PostgreSQL
        restarted), reconnect and process the same message again: its offset is not committed,
        and skipping it would lose it."""
        while True:
            try:
                self.process(message)
                return
            except psycopg.OperationalError as error:
                if self.stopping:
                    raise
                self._control_lost(error)

    def _control_lost(self, error: psycopg.OperationalError) -> None:
        """Wait for PostgreSQL and open the control connection again."""
        log.warning("control connection lost (%s); waiting for PostgreSQL", str(error).splitlines()[0])
        delay = 0.1
        while not self.stopping:
            conn = None
            try:
                conn = connect(self.database_url, autocommit=True,
                               application_name=f"lab {self.lab.name} {self.name} control")
                self._listen(conn)
            except psycopg.OperationalError:
                if conn is not None:
                    conn.close()
                time.sleep(delay)  # a backoff between connection attempts
                delay = min(delay * 2, 2.0)
                continue
            broken, self.control_conn = self.control_conn, conn
            self.control.conn = conn
            broken.close()
            self.settings_notified = True  # what changed while it was away was told to nobody
            log.info("control connection back")
            return

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            raise KafkaException(error)
        if error.code() == KafkaError._PARTITION_EOF:
            return
        self.report.last_error = error.str()
        log.warning("passing Kafka error: %s", error.str())

    def process(self, message: Message) -> None:
        self.current = message
        # Faults and step mode armed before this message was polled apply to it, and so do the group's
        # settings (strategy, modes) changed before it.
        self.refresh_settings()
        event: events.PaymentEvent | None = None
        try:
            self._ensure_effects_conn()
            event = events.decode(message.value())
            outcome = self._current_strategy().apply(self, event)
        except NotificationStopped:
            self.current = None
            return  # stopping while the service was away: rolled back, the offset not committed
        except events.InvalidEvent as invalid:
            self.dead_letter(message, invalid.reason)
            outcome = DEAD_LETTERED
        except psycopg.Error as error:
            # The strategy's transaction was rolled back when the error left it.
            outcome = self._on_database_error(message, event, error)
            if outcome is None:
                return  # to be retried: the partition waits, the offset is not committed
        self.retrying.pop((message.topic(), message.partition()), None)
        counts = self.report.counts
        if outcome == APPLIED:
            counts.applied += 1
        elif outcome == ABSORBED:
            counts.absorbed += 1
        else:
            counts.dead_lettered += 1
        self.report.applied_positions[str(message.partition())] = message.offset() + 1
        self.notifier.after_commit(event, outcome)
        self.commit(message, before_commit="after-effect-before-commit")
        self.checkpoint("after-commit")
        self.current = None

    # --- database errors ---------------------------------------------------------------------

    def _ensure_effects_conn(self) -> None:
        """Reconnect after a lost session; raises OperationalError while the database is away."""
        conn = self.effects_conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
                self.effects_conn = None
            self.effects_conn = self._connect_effects()

    def _connect_effects(self) -> psycopg.Connection:
        self.session_settings = None  # a new session: the lab's settings are applied again
        # Named, so pg_stat_activity (and a person looking for who holds a lock) can tell it apart.
        conn = connect(self.database_url, schema=self.effects_schema, autocommit=True,
                       application_name=f"lab {self.lab.name} {self.name} effects")
        conn.execute(QUIET_SESSION)  # its effects are announced by the report (_report_effects)
        return conn

    def _on_database_error(self, message: Message, event: events.PaymentEvent | None,
                           error: psycopg.Error) -> str | None:
        """The outcome of a delivery whose transaction failed, or None when it is to be retried."""
        conn = self.effects_conn
        usable = conn is not None and not (conn.closed or conn.broken)
        if isinstance(error, ROLLED_BACK_BY_A_CONCURRENT_TRANSACTION) and usable:
            # 40001 (a REPEATABLE READ update of a row changed since the snapshot) or 40P01 (a
            # deadlock): PostgreSQL rolled the transaction back because of a concurrent one. The
            # record is not at fault and the next attempt runs in a new snapshot: retried as long as
            # it takes, never dead-lettered, and recorded as a failed delivery so the ledger shows it.
            return self._retry_later(message, event, error, limit=None, record=True)
        if isinstance(error, psycopg.OperationalError) or not usable:
            # A lost session (terminated, database restarted) or a timeout: nothing committed, and the
            # record is not at fault. Retry as long as it takes; never dead-letter for this.
            return self._retry_later(message, event, error, limit=None)
        if isinstance(error, psycopg.errors.UniqueViolation) and self._on_unique_violation() == "already-processed":
            # The 001 seed: "catches that exception specifically and treats it as 'already
            # processed' — not as a generic error to be propagated to the retry mechanism".
            constraint = error.diag.constraint_name
            reason = UNIQUE_VIOLATION_REASON + (f" ({constraint})" if constraint else "")
            try:
                with self.transaction():
                    self.record_delivery(event, ABSORBED, reason)
            except psycopg.Error as again:
                return self._retry_later(message, event, again, limit=None)
            return ABSORBED
        return self._retry_later(message, event, error, limit=MAX_ATTEMPTS)

    def _retry_later(self, message: Message, event: events.PaymentEvent | None, error: psycopg.Error,
                     limit: int | None, record: bool = False) -> str | None:
        """Count an attempt; under the limit, pause the partition for a backoff and seek back to the
        record (the partition stalls, its lag grows); at the limit, dead-letter it. A counted attempt
        (``limit``) or a ``record``-ed one is written to the ledger as a failed delivery."""
        key = (message.topic(), message.partition())
        retry = self.retrying.get(key)
        if retry is None or retry.offset != message.offset():
            retry = self.retrying[key] = Retry(message.offset())
        retry.attempts += 1
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
        what = f"{type(error).__name__}: {first_line}"
        if isinstance(error, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
            # The bound set in _apply_session_settings: say why it is there.
            what += (f" (the consumer gives a statement up before max.poll.interval.ms, "
                     f"{self.group.max_poll_interval_ms // 1000} s, so it stays in its group)")
        if limit is not None and retry.attempts >= limit:
            del self.retrying[key]
            self.dead_letter(message, f"gave up after {retry.attempts} attempts: {what}", event)
            return DEAD_LETTERED
        delay = BACKOFF_SECONDS[min(retry.attempts, len(BACKOFF_SECONDS)) - 1]
        of = f" of {limit}" if limit is not None else ""
        reason = f"attempt {retry.attempts}{of} failed: {what}; partition {message.partition()} waits {delay:g} s"
        self.report.last_error = reason
        if limit is not None or record:
            try:
                with self.transaction():
                    self.record_delivery(event, FAILED, reason)
            except psycopg.Error:
                log.warning("could not record the failed delivery: %s", reason)
        self._say("error", f"{self.name}: {reason}", partition=message.partition(), offset=message.offset())
        retry.resume_at = time.monotonic() + delay
        try:
            self.consumer.pause([TopicPartition(message.topic(), message.partition())])
            retry.paused = True
            self.consumer.seek(TopicPartition(message.topic(), message.partition(), message.offset()))
        except KafkaException:
            pass  # the partition moved to another member, which will deliver it again
        self.current = None
        return None

    def _resume_due(self) -> None:
        now = time.monotonic()
        for (topic, partition), retry in self.retrying.items():
            if retry.paused and retry.resume_at <= now:
                retry.paused = False
                try:
                    self.consumer.resume([TopicPartition(topic, partition)])
                except KafkaException:
                    pass

    def _forget_retries(self, partitions: list[TopicPartition]) -> None:
        """A revoked partition is resumed (its next owner, maybe us again, starts it unpaused) and its
        attempts are forgotten: the next owner counts from one."""
        for tp in partitions:
            retry = self.retrying.pop((tp.topic, tp.partition), None)
            if retry is not None and retry.paused:
                try:
                    self.consumer.resume([TopicPartition(tp.topic, tp.partition)])
                except KafkaException:
                    pass

    def commit(self, message: Message, before_commit: str | None = None) -> None:
        self.commit_offsets([TopicPartition(message.topic(), message.partition(), message.offset() + 1)],
                            before_commit)

    def commit_offsets(self, offsets: list[TopicPartition], before_commit: str | None = None) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) in the group's commit mode,
        passing the crash point ``before_commit`` last before the commit itself.

        sync waits for the broker's answer, and when the commit did not get there
        (RETRIABLE_COMMIT_ERRORS) commits again before the next record: at most this one record is
        done and uncommitted. async returns at once (the answer comes to _on_commit during a later
        poll, and a failed one is not retried), so the consumer moves on while its commits may never
        arrive: a crash then brings back every record since the last commit that did. transactional
        sends them to a Kafka transaction and commits it (:meth:`_commit_in_kafka_transaction`). The
        report follows (:meth:`_report_effects`): at once after a quiet spell, else on the
        heartbeat's cadence, not after every commit."""
        if self.group.transactional_commits:
            self._commit_in_kafka_transaction(offsets, before_commit)
            self._report_effects()
            return
        if before_commit is not None:
            self.checkpoint(before_commit)
        attempts = 0
        while True:
            asynchronous = self.group.asynchronous_commits
            try:
                self.consumer.commit(offsets=offsets, asynchronous=asynchronous)
                break
            except KafkaException as error:
                kafka_error = error.args[0] if error.args else None
                reason = f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error)
                if kafka_error is None or kafka_error.code() not in RETRIABLE_COMMIT_ERRORS or self.stopping:
                    self._commit_failed(offsets, reason)
                    break
                attempts += 1
                self._commit_retried(offsets, reason, attempts)
        self._report_effects()

    # --- commit mode transactional ----------------------------------------------------------

    def _transactional_producer(self) -> Producer:
        """The consumer's transactional producer, initialized: its ``transactional.id`` is the
        consumer's client id, so a restarted process fences the one before it."""
        if self._offsets_producer is None:
            client_id = self.lab.client_id(self.name)
            transactional_id = f"{client_id}.offsets"
            producer = Producer({**producer_config(self.bootstrap_servers, idempotent=True, client_id=client_id),
                                 "transactional.id": transactional_id})
            producer.init_transactions(TRANSACTION_TIMEOUT)
            self._offsets_producer = producer
            self._say("transactions", f"{self.name} commits its offsets in Kafka transactions as transactional.id "
                      f"{transactional_id}; initializing it aborted any transaction a previous process under that "
                      "id left open", transactional_id=transactional_id)
        return self._offsets_producer

    def _commit_in_kafka_transaction(self, offsets: list[TopicPartition], before_commit: str | None) -> None:
        """Begin a Kafka transaction, send it the offsets with the group's metadata (generation and
        member id: the coordinator refuses a zombie's), pass ``before_commit``, commit it.

        The effect is already committed in PostgreSQL: a crash at ``before_commit`` leaves the
        transaction open until the restart's ``init_transactions`` (or ``transaction.timeout.ms``)
        aborts it, and the offsets go with it. A failure aborts the
        transaction and is reported like any failed commit: the record comes back to whoever owns
        its partition next."""
        try:
            producer = self._transactional_producer()
            producer.begin_transaction()
            producer.send_offsets_to_transaction(offsets, self.consumer.consumer_group_metadata(), TRANSACTION_TIMEOUT)
            if before_commit is not None:
                self.checkpoint(before_commit)
            producer.commit_transaction(TRANSACTION_TIMEOUT)
        except KafkaException as error:
            kafka_error = error.args[0] if error.args else None
            self._abort_open_transaction()
            self._commit_failed(offsets, f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error))

    def _abort_open_transaction(self) -> None:
        """Abort the transaction in progress, if any; a producer that cannot (a fatal error: fenced)
        is dropped, and the next commit starts a new one."""
        producer = self._offsets_producer
        if producer is None:
            return
        try:
            producer.abort_transaction(TRANSACTION_TIMEOUT)
        except KafkaException as error:
            kafka_error = error.args[0] if error.args else None
            if kafka_error is not None and kafka_error.code() == KafkaError._STATE:
                return  # no transaction in progress: nothing to abort
            self._offsets_producer = None

    def _commit_retried(self, offsets: list[TopicPartition], reason: str, attempts: int) -> None:
        """A synchronous commit that did not reach the coordinator: say so (once), keep reporting
        (the heartbeat also notices a stop or a lab reset), and pause before trying again."""
        what = ", ".join(f"offset {tp.offset} on partition {tp.partition}" for tp in offsets)
        self.report.last_error = (f"commit of {what} failed ({reason}), attempt {attempts}: "
                                  "it commits again before its next record")
        # The effect is committed: a lost control connection here must not send the record back to
        # processing (it would apply it again). It is noted; the loop reconnects after the commit.
        with self._reporting_from_callback():
            if attempts == 1:
                first = offsets[0] if offsets else None
                self._say("commit-failed", f"{self.name} could not commit {what}: {reason}; a synchronous commit "
                          "is tried again, and no further record is processed until it lands",
                          partition=first.partition if first else None, offset=first.offset - 1 if first else None)
            self.heartbeat(force=True)
        self.keep_alive(COMMIT_RETRY_PAUSE)  # librdkafka's own retries took a second or more before this

    def _on_commit(self, error: KafkaError | None, offsets: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit; an asynchronous commit's failure is only seen here."""
        if error is not None and self.group.asynchronous_commits and error.code() != KafkaError._NO_OFFSET:
            self._commit_failed(offsets, f"{error.name()}: {error.str()}")

    def _commit_failed(self, offsets: list[TopicPartition], reason: str) -> None:
        # A zombie's commit: its generation is gone (UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION).
        self.report.counts.commit_failures += 1
        self.report.last_error = reason
        what = ", ".join(f"offset {tp.offset} on partition {tp.partition}" for tp in offsets)
        first = offsets[0] if offsets else None
        self._say("commit-failed", f"{self.name} could not commit {what}: {reason}",
                  partition=first.partition if first else None, offset=first.offset - 1 if first else None)

    def dead_letter(self, message: Message, reason: str, event: events.PaymentEvent | None = None) -> None:
        """Produce the raw record to the DLQ with its reason, then record the delivery."""
        if self._dlq is None:
            self._dlq = Producer(producer_config(self.bootstrap_servers, idempotent=True, client_id=self.lab.producer_client_id))
        headers = [("dlq.reason", reason.encode()), ("dlq.source.partition", str(message.partition()).encode()),
                   ("dlq.source.offset", str(message.offset()).encode()), ("dlq.group", self.group_id.encode())]
        self._dlq.produce(self.lab.dlq_topic, value=message.value(), key=message.key(), headers=headers)
        if self._dlq.flush(15) != 0:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "dead-letter record not acknowledged"))
        with self.transaction():
            self.record_delivery(event, DEAD_LETTERED, reason)


@contextmanager
def _signals(process: ConsumerProcess):
    """First SIGTERM: graceful stop after the current message. Second: exit now."""
    def on_term(signum, frame):
        if process.stopping:
            os._exit(143)
        process.stopping = True
    previous = signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
