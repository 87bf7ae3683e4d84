"""The agent's command workers: a few threads that each claim a command and carry it out.

Commands of different labs run side by side (a lab's slow reset no longer holds thirty other labs'
publishes behind it); the claim (store/commands.py) gives a lab's commands out one at a time and in
their order. Each worker has a psycopg connection of its own (a connection serves one transaction
at a time) and shares the agent's process pool, Kafka clients and sidecars, which guard their own
state. The agent's main thread keeps its tick (reaping, snapshots, group health) and its LISTEN,
and wakes the workers when a command is announced.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Protocol

import psycopg
from confluent_kafka import KafkaException
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain import commands
from ..domain.lab import Lab
from ..domain.waits import WaitTimeout
from ..store import command_channel, schema, timeline
from ..store.commands import Claimed
from ..store.connection import connect
from . import queue
from .handlers import HANDLERS, CommandRejected

log = logging.getLogger("idempotency_lab.agent")

# Failures that fail the command (with their message) and leave the agent running.
COMMAND_FAILURES = (CommandRejected, commands.MalformedCommand, LookupError, ValueError, KafkaException, WaitTimeout, command_channel.CommandError,
                    psycopg.Error, SQLAlchemyError)
# A worker with nothing to claim looks again this often even when nothing woke it. A NOTIFY wakes one
# worker at once, a worker that claimed a command wakes the next (another lab's may be waiting), and
# one that ended a command wakes one (its lab's next); this only catches a NOTIFY lost while the
# agent's listening connection was down. Eight workers looking every 0.25 s kept an idle agent at
# 11% of a core (32 claims a second), and a test run's six agents at most of one.
IDLE_LOOK_EVERY = 2.0
RECONNECT_AFTER = 1.0  # seconds between a worker's attempts to open its connection again


class SharedAgent(Protocol):
    """What the workers use of the agent (loop.Agent): its id and shared objects."""
    id: str
    engine: Engine
    database_url: str
    admin: Any
    publisher: Any
    producer_bootstrap_servers: str
    pool: Any
    log_mirror: Any

    def spawn(self, lab: Lab, consumer_id: int, name: str) -> int: ...

    def reap_children(self) -> None: ...


class WorkerContext:
    """What a handler sees on a worker thread (context.AgentContext): the agent's shared objects, and
    this worker's own psycopg connection for the lab-schema work."""

    def __init__(self, agent: SharedAgent, conn: psycopg.Connection):
        self.agent = agent
        self.conn = conn

    @property
    def id(self) -> str:
        return self.agent.id

    @property
    def engine(self) -> Engine:
        return self.agent.engine

    @property
    def admin(self) -> Any:
        return self.agent.admin

    @property
    def publisher(self) -> Any:
        return self.agent.publisher

    @property
    def producer_bootstrap_servers(self) -> str:
        return self.agent.producer_bootstrap_servers

    @property
    def pool(self) -> Any:
        return self.agent.pool

    @property
    def log_mirror(self) -> Any:
        return self.agent.log_mirror

    @contextmanager
    def in_lab(self, lab: Lab) -> Iterator[None]:
        """A transaction on this worker's connection working in the lab's schema."""
        with self.conn.transaction():
            schema.enter_psycopg(self.conn, lab.schema)
            yield

    def say(self, lab: Lab, kind: str, summary: str, **detail: Any) -> None:
        with self.in_lab(lab):
            timeline.record(self.conn.execute, kind, summary, **detail)

    def spawn(self, lab: Lab, consumer_id: int, name: str) -> int:
        return self.agent.spawn(lab, consumer_id, name)

    def reap_children(self) -> None:
        self.agent.reap_children()


def carry_out(context: WorkerContext, command: Claimed) -> None:
    """Parse the command's arguments, run its handler and write its result, or fail it with the reason
    (a malformed command is rejected, the message naming the field)."""
    try:
        handler = HANDLERS.get(command.verb)
        if handler is None:
            raise CommandRejected(f"unknown command {command.verb!r}")
        result = handler(context, Lab(command.lab), commands.parse(command.verb, command.args))
        queue.finish(context.engine, command.id, result)
    except COMMAND_FAILURES as error:
        kind = "not found" if isinstance(error, LookupError) else "rejected"
        log.warning("command %s %s %s: %s", command.id, command.verb, kind, error)
        _roll_back(context.conn)
        queue.fail(context.engine, command.id, str(error), kind)
    except Exception as error:  # a bug: fail this command, keep serving the others
        log.exception("command %s %s", command.id, command.verb)
        _roll_back(context.conn)
        queue.fail(context.engine, command.id, f"the agent failed: {type(error).__name__}: {error}", "internal")


def _roll_back(conn: psycopg.Connection) -> None:
    if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()


class CommandWorkers:
    """``count`` threads claiming and carrying out the agent's commands until :meth:`stop`."""

    def __init__(self, agent: SharedAgent, count: int,
                 connect_worker: Callable[[], psycopg.Connection] | None = None):
        self.agent = agent
        self.count = count
        self._connect = connect_worker or (lambda: connect(agent.database_url, autocommit=True,
                                                           application_name=f"lab agent {agent.id} worker"))
        self._stopping = threading.Event()
        self._wake = threading.Condition()
        self._announced = 0  # bumped by wake(): a worker that saw it unchanged sleeps
        self._lock = threading.Lock()
        self._held: dict[int, Claimed] = {}  # command id -> the command a worker carries out now
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(1, self.count + 1):
            thread = threading.Thread(target=self._serve, name=f"command worker {number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wake(self, every: bool = False) -> None:
        """A command was announced (or a lab freed): an idle worker claims again now (``every``:
        all of them, as when stopping)."""
        with self._wake:
            self._announced += 1
            if every:
                self._wake.notify_all()
            else:
                self._wake.notify()

    def held(self) -> set[int]:
        """The ids of the commands the workers are carrying out at this moment."""
        with self._lock:
            return set(self._held)

    def labs_carrying_out(self, verb: str) -> set[str]:
        """The labs whose command ``verb`` a worker is carrying out at this moment."""
        with self._lock:
            return {command.lab for command in self._held.values() if command.verb == verb}

    def stop(self, timeout: float | None = None) -> list[str]:
        """No more claims; wait for the commands being carried out to end. The names of the threads
        still busy after ``timeout`` seconds (None: wait for them all)."""
        self._stopping.set()
        self.wake(every=True)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [thread.name for thread in self._threads if thread.is_alive()]

    # --- one worker -----------------------------------------------------------------------------

    def _serve(self) -> None:
        conn: psycopg.Connection | None = None
        try:
            while not self._stopping.is_set():
                if conn is None or conn.closed or conn.broken:
                    conn = self._reopen(conn)
                    if conn is None:
                        continue
                seen = self._announced
                try:
                    command = queue.claim(self.agent.engine, self.agent.id)
                except SQLAlchemyError as error:  # PostgreSQL away: the claim is tried again
                    log.warning("command worker: claim failed: %s", str(error).splitlines()[0])
                    self._stopping.wait(RECONNECT_AFTER)
                    continue
                if command is None:
                    self._sleep_unless_announced(seen)
                    continue
                self.wake()  # another lab's command may be waiting too: the next idle worker looks
                try:
                    conn = self._alive(conn)
                except psycopg.OperationalError as error:  # PostgreSQL still away: the command cannot run
                    log.warning("command %s %s: no connection: %s", command.id, command.verb,
                                str(error).splitlines()[0])
                    conn = None
                    self._fail_interrupted(command)
                    continue
                with self._lock:
                    self._held[command.id] = command
                try:
                    carry_out(WorkerContext(self.agent, conn), command)
                except SQLAlchemyError as error:
                    # Its result could not be written (PostgreSQL restarting): it stays running under
                    # our lease, and is failed as interrupted once the database is back.
                    log.warning("command %s %s: its end could not be written: %s", command.id, command.verb,
                                str(error).splitlines()[0])
                    self._fail_interrupted(command)
                finally:
                    with self._lock:
                        self._held.pop(command.id, None)
                # Its lab is free again: a worker that skipped the lab's next command claims it now.
                self.wake()
        finally:
            if conn is not None:
                conn.close()

    def _alive(self, conn: psycopg.Connection) -> psycopg.Connection:
        """The worker's connection, opened again if PostgreSQL ended it since the worker's last
        command (a restart, or a session terminated): psycopg learns that only when it is used, and
        the command would fail on it with "terminating connection due to administrator command"."""
        try:
            conn.execute("SELECT 1")
            return conn
        except psycopg.OperationalError:
            conn.close()
            return self._connect()

    def _reopen(self, broken: psycopg.Connection | None) -> psycopg.Connection | None:
        if broken is not None:
            broken.close()
        try:
            return self._connect()
        except psycopg.OperationalError as error:
            log.warning("command worker: no connection (%s); trying again", str(error).splitlines()[0])
            self._stopping.wait(RECONNECT_AFTER)  # a pause between connection attempts
            return None

    def _sleep_unless_announced(self, seen: int) -> None:
        with self._wake:
            if self._announced == seen and not self._stopping.is_set():
                self._wake.wait(IDLE_LOOK_EVERY)

    def _fail_interrupted(self, command: Claimed) -> None:
        """Fail a command whose end could not be written, once PostgreSQL answers (or the agent stops)."""
        while not self._stopping.is_set():
            try:
                queue.interrupted(self.agent.engine, command.id)
                return
            except SQLAlchemyError:
                self._stopping.wait(RECONNECT_AFTER)  # PostgreSQL coming back: try again
