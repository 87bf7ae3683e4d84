"""The consumer process: poll, validate, apply the group's strategy, commit the offset.

Shaped like confluent-kafka-python's examples (:meth:`ConsumerProcess.run`): poll with a timeout,
tell fatal errors from passing ones, handle bad records explicitly (dead-letter topic, never a
silent skip), process, then commit, close in ``finally``. The offset is committed only after the
database transaction has committed. First SIGTERM: finish the message, commit, leave the group.
Second SIGTERM: exit at once.

Its seams, one module each: context.py (what a strategy's apply() gets: the effects connection,
the ledger, the crash points), retry.py (a failing record's partition waits, then it comes again),
deadletter.py (the DLQ), commit.py (the offsets in the group's commit mode: sync, async,
transactional), report.py (the heartbeat, the counts, the timeline), batch.py (batch mode:
consume(n), one transaction, one offset commit per batch), notify.py (the external side effect).

What it applies (its control row, its group's settings: settings.py) is read when it starts, on
its heartbeat, and before a message whenever a change was notified since (settings_changes.py:
every change NOTIFYs, and the consumer looks at what its control connection already received,
no round trip).

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

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from .. import strategies
from ..domain import events
from ..domain.lab import Lab
from ..domain.vocabulary import AGENT_PID, KAFKA_DEBUG, SETTINGS_CHANNEL
from ..kafka.config import consumer_config
from ..kafka.group import group_generation
from ..store import consumer_groups
from ..store.connection import connect, with_reconnect_backoff
from ..store.schema import quoted
from ..strategies.base import ABSORBED, DEAD_LETTERED, UNIQUE_VIOLATION_REASON
from . import settings as group_settings
from .batch import BatchLoop
from .commit import Committer
from .context import EffectsContext
from .control import ControlRow, Report
from .deadletter import DeadLetters
from .notify import NotificationStopped, Notifier
from .report import Reporter
from .retry import MAX_ATTEMPTS, Retries

log = logging.getLogger("idempotency_lab.consumer")

POLL_TIMEOUT = 0.2
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


class ConsumerProcess:
    """One consumer of a lab's group: its Kafka consumer, its control connection and settings, and
    its seams (effects, retries, dead_letters, committer, reporter, batches, notifier)."""

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
        # Its parent is the agent's fork server, which exits with the agent: a new parent means
        # the agent is gone. The agent's own pid comes in the environment, to name it.
        self._parent_pid = os.getppid()
        self._agent_pid = int(os.environ.get(AGENT_PID) or self._parent_pid)
        self.orphaned = False  # its agent died: it stops itself and reports "gone"
        self.control_broken: psycopg.OperationalError | None = None  # noted in a rebalance callback

        self.control_conn = connect(database_url, autocommit=True, application_name=f"lab {lab.name} {name} control")
        self.settings_notified = False
        self._listen(self.control_conn)  # before the first read: a change after it is notified
        self.control = ControlRow(self.control_conn, consumer_id)
        self.desired = self.control.read()
        # Counts are the consumer's over all its processes: a restart carries on from them. The
        # generation is the group's (read at each assignment); until then, the last one reported.
        self.report.counts = self.control.counts()
        self.report.generation = self.control.generation()
        self.strategy_name, self.effects_schema = self._group_settings()
        self.desired, self.group = self._read_settings()
        self.batch_span: str | None = None  # where a batch is, for the timeline, while one is applied
        self.reporter = Reporter(self)
        self.retries = Retries(self)
        self.dead_letters = DeadLetters(self)
        self.committer = Committer(self)
        self.batches = BatchLoop(self)
        self.notifier = Notifier(self)  # the external side effect, when the group asks for it
        self.effects = EffectsContext(self)  # what the strategy's apply() gets
        # The group's Kafka id: its own, or the fresh one a recovery moved it to (ops/groups.py recover).
        self.kafka_group_id = self.group.kafka_group_id or group_id
        self._holding = 0  # keep_alive's depth: partitions paused while the process waits
        self.consumer = Consumer({**consumer_config(bootstrap_servers, self.kafka_group_id,
                                                    client_id=lab.client_id(name),
                                                    max_poll_interval_ms=self.group.max_poll_interval_ms,
                                                    debug=os.environ.get(KAFKA_DEBUG, "")),
                                  **group_settings.client_settings(self.group, group_id, name),
                                  "on_commit": self.committer.on_commit})
        if self.group.transactional_commits:
            # At once, not at the first commit: init_transactions aborts a transaction the previous
            # process under this transactional.id left open (a crash inside it), so the group's
            # committed offset is settled before this process reads it.
            self.committer.start_transactions()

    # --- settings ----------------------------------------------------------------------

    def _group_settings(self) -> tuple[str, str]:
        found = consumer_groups.strategy_and_effects_schema(self.control_conn.execute, self.lab.schema, self.group_id)
        if found is None:
            raise RuntimeError(f"group {self.group_id} is not defined in lab {self.lab.name}")
        return found

    def _on_unique_violation(self) -> str:
        meaning = consumer_groups.on_unique_violation(self.control_conn.execute, self.lab.schema, self.group_id)
        return meaning if meaning in strategies.ON_UNIQUE_VIOLATION else "already-processed"

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
        connection. An operation that made a change waits for this read's acknowledgement
        (settings_changes.settle); a change made by hand is forwarded to this connection by the
        listening backend after its commit, usually before the next record, at the latest seen on
        the next heartbeat (consumer/settings.py)."""
        pgconn = self.control_conn.pgconn
        pgconn.consume_input()  # never blocks; raises OperationalError on a lost connection
        while (notify := pgconn.notifies()) is not None:
            pgconn.notify_handler(notify)  # psycopg's dispatch to _on_notify, as during a query
        if self.settings_notified:
            self.settings_notified = False
            self.desired, self.group = self._read_settings()

    def current_strategy(self) -> strategies.Strategy:
        # The group's settings as they stood when this message was polled (refresh_settings): a
        # strategy switch (or new database settings) applies from the next message on.
        self.strategy_name = self.group.strategy
        self.notifier.use(self.group.notify, self.group.notify_idempotency_key)
        self.effects.apply_session_settings(self.group.lock_timeout_ms,
                                             self.group.idle_in_transaction_session_timeout_ms)
        return strategies.get(self.strategy_name, partitioned=self._partitioned_dedup_table())

    def _partitioned_dedup_table(self) -> bool:
        """Whether the effects schema's processed_events is partitioned (webapp/strategies/dedup_layout.py), read
        from the catalog once per process: the layout changes only while the lab's consumers are stopped."""
        schema = self.group.effects_schema
        if getattr(self, "_dedup_layout", (None, False))[0] != schema:
            row = self.control_conn.execute("SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)",
                                            [f"{quoted(schema)}.processed_events"]).fetchone()
            self._dedup_layout = (schema, bool(row and row[0]))
        return self._dedup_layout[1]

    def check_in(self) -> None:
        """On the heartbeat: read the settings again (also while idle: a switch to batch mode
        shows), and stop when the consumer's row is gone (a lab reset) or its agent died."""
        self.desired, self.group = self._read_settings()
        if not self.desired.exists:
            log.info("consumer row deleted (lab reset): stopping")
            self.stopping = True
        if os.getppid() != self._parent_pid:
            # Our agent died without stopping us: nobody could kill, freeze or reap us now.
            log.info("the lab agent is gone: stopping")
            self.stopping = self.orphaned = True
            self.report.last_error = f"its lab agent (pid {self._agent_pid}) died: it stopped itself"

    # --- the loop ------------------------------------------------------------------------

    def run(self) -> int:
        """Join the group, then poll and process until asked to stop; leave the group in ``finally``."""
        self.consumer.subscribe([self.lab.topic], on_assign=self.on_assign, on_revoke=self.on_revoke,
                                on_lost=self.on_lost)
        self.report.state = "running"
        self.reporter.say("started", f"{self.name} joined group {self.group_id} ({self.strategy_name})")
        log.info("%s of lab %s joined group %s (%s)", self.name, self.lab.name, self.group_id, self.strategy_name)
        try:
            while not self.stopping:
                if not self._keep_up():
                    continue
                if self.group.batch_mode:
                    self.batches.step()
                    continue
                message = self.consumer.poll(POLL_TIMEOUT)
                if message is None:
                    continue
                if message.error():
                    self.on_error(message.error())
                    continue
                self._process_until_done(message)
            return 0
        finally:
            self._close()

    def _keep_up(self) -> bool:
        """Between polls: the heartbeat, notified settings, partitions whose backoff is over. False
        when the control connection was lost (it is open again when this returns)."""
        try:
            if self.control_broken is not None:
                broken, self.control_broken = self.control_broken, None
                self._control_lost(broken)
            self.reporter.heartbeat()
            self.refresh_settings()  # also while idle: an operation waits for it
            self.retries.resume_due()
            return True
        except psycopg.OperationalError as error:
            self._control_lost(error)
            return False

    def on_error(self, error: KafkaError) -> None:
        """A fatal error ends the process; a passing one (librdkafka retries it itself: a lost broker
        connection, a timeout) is noted on the report; the end of a partition is no error."""
        if error.fatal():
            raise KafkaException(error)
        if error.code() == KafkaError._PARTITION_EOF:
            return
        self.report.last_error = error.str()
        log.warning("passing Kafka error: %s", error.str())

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

    def process(self, message: Message) -> None:
        """Decode, apply by the group's strategy, then commit the offset; a bad record is dead-lettered."""
        self.current = message
        # Faults and step mode armed before this message was polled apply to it, and so do the group's
        # settings (strategy, modes) changed before it.
        self.refresh_settings()
        event: events.PaymentEvent | None = None
        try:
            self.effects.ensure_connected()
            event = events.decode(message.value())
            outcome = self.current_strategy().apply(self.effects, event)
        except NotificationStopped:
            self.current = None
            return  # stopping while the service was away: rolled back, the offset not committed
        except events.InvalidEvent as invalid:
            self.dead_letters.send(message, invalid.reason)
            outcome = DEAD_LETTERED
        except psycopg.Error as error:
            # The strategy's transaction was rolled back when the error left it.
            outcome = self._on_database_error(message, event, error)
            if outcome is None:
                return  # to be retried: the partition waits, the offset is not committed
        self.retries.done(message.topic(), message.partition())
        self.reporter.count(outcome)
        self.report.applied_positions[str(message.partition())] = message.offset() + 1
        self.notifier.after_commit(event, outcome)
        self.committer.commit(message, before_commit="after-effect-before-commit")
        self.effects.checkpoint("after-commit")
        self.current = None

    def _on_database_error(self, message: Message, event: events.PaymentEvent | None,
                           error: psycopg.Error) -> str | None:
        """The outcome of a delivery whose transaction failed, or None when it is to be retried."""
        usable = self.effects.usable()
        if isinstance(error, ROLLED_BACK_BY_A_CONCURRENT_TRANSACTION) and usable:
            # 40001 (a REPEATABLE READ update of a row changed since the snapshot) or 40P01 (a
            # deadlock): PostgreSQL rolled the transaction back because of a concurrent one. The
            # record is not at fault and the next attempt runs in a new snapshot: retried as long as
            # it takes, never dead-lettered, and recorded as a failed delivery so the ledger shows it.
            return self.retries.later(message, event, error, limit=None, record=True)
        if isinstance(error, psycopg.OperationalError) or not usable:
            # A lost session (terminated, database restarted) or a timeout: nothing committed, and the
            # record is not at fault. Retry as long as it takes; never dead-letter for this.
            return self.retries.later(message, event, error, limit=None)
        if isinstance(error, psycopg.errors.UniqueViolation) and self._on_unique_violation() == "already-processed":
            # The 001 seed: "catches that exception specifically and treats it as 'already
            # processed' — not as a generic error to be propagated to the retry mechanism".
            constraint = error.diag.constraint_name
            reason = UNIQUE_VIOLATION_REASON + (f" ({constraint})" if constraint else "")
            try:
                with self.effects.transaction():
                    self.effects.record_delivery(event, ABSORBED, reason)
            except psycopg.Error as again:
                return self.retries.later(message, event, again, limit=None)
            return ABSORBED
        return self.retries.later(message, event, error, limit=MAX_ATTEMPTS)

    def _close(self) -> None:
        """Leave the group, close the producers, report how it ended, close the connections."""
        # Gone, not stopped, when its agent died: nothing answers for this consumer any more.
        self.report.state = "gone" if self.orphaned else "stopped"
        self.report.assigned = []
        self.consumer.close()  # commits nothing (auto-commit is off), leaves the group
        self.dead_letters.close()
        self.committer.abort_open_transaction()
        try:
            self.reporter.write()
            self.reporter.say("stopped", f"{self.name} left group {self.group_id}"
                              + (f": its lab agent (pid {self._agent_pid}) died, nothing runs it now" if self.orphaned
                                 else ""))
        except psycopg.OperationalError as error:
            # PostgreSQL restarting as we stop: the agent records how we ended (our exit code).
            log.warning("could not report the stop: %s", str(error).splitlines()[0])
        log.info("%s of lab %s left group %s: %s", self.name, self.lab.name, self.group_id, self.report.state)
        self.effects.close()
        self.control_conn.close()

    def _control_lost(self, error: psycopg.OperationalError) -> None:
        """Wait for PostgreSQL and open the control connection again."""
        log.warning("control connection lost (%s); waiting for PostgreSQL", str(error).splitlines()[0])
        conn = with_reconnect_backoff(self._open_control, going_on=lambda: not self.stopping)
        if conn is None:
            return  # stopping: the loop's finally closes what is left
        broken, self.control_conn = self.control_conn, conn
        self.control.conn = conn
        broken.close()
        self.settings_notified = True  # what changed while it was away was told to nobody
        log.info("control connection back")

    def _open_control(self) -> psycopg.Connection:
        """A new control connection, listening for the lab's settings changes."""
        conn = connect(self.database_url, autocommit=True, application_name=f"lab {self.lab.name} {self.name} control")
        try:
            self._listen(conn)
        except psycopg.OperationalError:
            conn.close()
            raise
        return conn


    # --- rebalances ----------------------------------------------------------------------

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
        with self.reporter.from_callback():
            self.reporter.write()
            self.reporter.say("rebalanced", f"{self.name} assigned partitions {self.report.assigned or 'none'} "
                              f"(generation {self.report.generation})", partitions=self.report.assigned)

    def on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.retries.forget(partitions)
        self.report.assigned = []
        with self.reporter.from_callback():
            self.reporter.write()

    def on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self.retries.forget(partitions)
        self.report.assigned = []
        with self.reporter.from_callback():
            self.reporter.say("rebalanced", f"{self.name} lost partitions {sorted(p.partition for p in partitions)}")

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
                    self.on_error(message.error())
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
            waiting = self.retries.waiting_partitions()
            flowing = [tp for tp in self.consumer.assignment() if (tp.topic, tp.partition) not in waiting]
            if flowing:
                self.consumer.resume(flowing)
        except KafkaException:
            pass  # a rebalance took them: the next assignment starts unpaused


@contextmanager
def handling_signals(process: ConsumerProcess):
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
