"""The command channel, the web's side: the web and the CLI ask a lab agent to act, through PostgreSQL.

A command is a row in ``lab_control.commands`` plus a NOTIFY that wakes the agents. The agent
that claims it carries it out and writes the result with a NOTIFY back (store/commands.py), which
wakes the web's waiter (webapp/agent/queue.py holds the agent's side). This works when the
web app and the consumers run in different containers: both reach the database. This module
imports no Kafka client, directly or not: gunicorn never loads one.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable

import psycopg
from sqlalchemy import Engine

from . import agents as agent_rows
from . import commands as command_rows
from .connection import connect

log = logging.getLogger(__name__)


# How long a waiter sleeps at most before it reads the command's row again (a notification is
# lost while the listening connection is down).
WAKE_EVERY = 0.5
RECONNECT_AFTER = (0.5, 1.0, 2.0, 5.0)  # seconds between attempts to listen again
# How long the listening thread keeps its connection once no waiter is left: clicks in a class
# come in runs, and a process that stopped asking (or a database that went away) holds nothing.
IDLE_EXIT_AFTER = 10.0
IDLE_CHECK_EVERY = 0.5  # how often the listening thread looks up from its connection to check that


class CommandError(RuntimeError):
    """The agent could not carry out a command; the message says why."""


class NoAgent(CommandError):
    pass


class CommandTimedOut(CommandError):
    """No agent finished the command by the caller's deadline; it was withdrawn before any claimed it."""


class CommandStillRunning(CommandTimedOut):
    """An agent claimed the command and had not finished it at the deadline: it carries on, and
    ends it later. Whatever the caller holds for the command (a guided run's claim) is still in use."""


class CommandNotFound(CommandError):
    """The command named something (a consumer, a group) that does not exist."""


def live_agents(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return agent_rows.live_ids(conn)


def enqueue(engine: Engine, lab: str, verb: str, args: dict[str, Any] | None = None,
            agent_id: str | None = None) -> int:
    with engine.begin() as conn:
        return command_rows.insert(conn, lab, verb, args or {}, agent_id)


class Watch:
    """A waiter's interest in one command: set when its end is announced."""

    def __init__(self, command_id: int):
        self.command_id = command_id
        self.ended = threading.Event()
        self.looked = threading.Event()  # the waiter has read the row once since it watched


class DoneListener:
    """One LISTEN connection per process and database, on the channel the agents NOTIFY when a
    command ends (commands.DONE_CHANNEL), on a thread of its own; it wakes every waiter of that
    command. Thirty attendees' clicks in flight cost one connection, not one each (a waiter that
    listened on a connection of its own held it for the whole wait, and emptied the agent's pool).
    The thread ends IDLE_EXIT_AFTER seconds after its last waiter left, or at once when it cannot
    connect and nobody waits; the next waiter starts it again."""

    def __init__(self, url: str):
        self.url = url
        self._watches: dict[int, set[Watch]] = {}
        self._lock = threading.Lock()
        self.listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()

    @property
    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def watch(self, command_id: int) -> Watch:
        watch = Watch(command_id)
        with self._lock:
            self._watches.setdefault(command_id, set()).add(watch)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._listen, name="command ends", daemon=True)
                self._thread.start()
        return watch

    def looked(self, command_id: int) -> bool:
        """Whether a waiter of ``command_id`` listens and has read its row once."""
        with self._lock:
            return self.listening.is_set() and any(w.looked.is_set() for w in self._watches.get(command_id, ()))

    def forget(self, watch: Watch) -> None:
        with self._lock:
            watches = self._watches.get(watch.command_id)
            if watches is not None:
                watches.discard(watch)
                if not watches:
                    del self._watches[watch.command_id]
                    if not self._watches:
                        self._idle_since = time.monotonic()

    def _retire_if_idle(self, linger: float) -> bool:
        """True, and this thread forgotten, when no waiter has watched for ``linger`` seconds."""
        with self._lock:
            if self._watches or time.monotonic() - self._idle_since < linger:
                return False
            self._thread = None
            self.listening.clear()
            return True

    def _wake(self, payload: str) -> None:
        try:
            command_id = int(payload)
        except ValueError:
            return
        with self._lock:
            for watch in self._watches.get(command_id, ()):
                watch.ended.set()

    def _listen(self) -> None:
        attempt = 0
        while True:
            try:
                with connect(self.url, autocommit=True, application_name="lab command waiter") as conn:
                    conn.execute(f"LISTEN {command_rows.DONE_CHANNEL}")
                    self.listening.set()
                    attempt = 0
                    while not self._retire_if_idle(IDLE_EXIT_AFTER):
                        for notify in conn.notifies(timeout=IDLE_CHECK_EVERY):
                            self._wake(notify.payload)
                    return
            except psycopg.Error as error:
                self.listening.clear()
                if self._retire_if_idle(0):
                    return
                delay = RECONNECT_AFTER[min(attempt, len(RECONNECT_AFTER) - 1)]
                attempt += 1
                log.warning("command waiter: %s; listening again in %.1f s (waiters read every %.1f s meanwhile)",
                            str(error).splitlines()[0] if str(error) else error, delay, WAKE_EVERY)
                time.sleep(delay)  # a backoff between connection attempts


_listeners: dict[str, DoneListener] = {}
_listeners_lock = threading.Lock()


def done_listener(engine: Engine) -> DoneListener:
    """This process's listener for the engine's database (started on first use)."""
    url = engine.url.render_as_string(hide_password=False)
    with _listeners_lock:
        listener = _listeners.get(url)
        if listener is None:
            listener = _listeners[url] = DoneListener(url)
        return listener


def _commands(count: int) -> str:
    return f"{count} command{'' if count == 1 else 's'}"


def describe_wait(place: command_rows.Place, running_for: float | None) -> str:
    """Why a command has not ended yet, in an attendee's words."""
    if place.status == command_rows.RUNNING:
        return f"the agent is carrying out {place.verb} (started {running_for or 0:.0f} s ago)"
    said = f"waiting for the lab agent: {_commands(place.ahead_other_labs)} of other labs ahead"
    if place.ahead_same_lab:
        said += f", and {_commands(place.ahead_same_lab)} of this lab before it"
    return said


Waiting = Callable[[str], None]


def wait_for(engine: Engine, command_id: int, timeout: float, *, waiting: Waiting | None = None) -> dict[str, Any]:
    """Block until the command is done; its result, or CommandError with the agent's reason.

    The waiter is woken by this process's listener (:class:`DoneListener`) when an agent announces
    the command's end, and reads the command's row then, and at least every WAKE_EVERY seconds;
    each read borrows a connection for one statement. A command still pending at the deadline is
    withdrawn, so no agent carries it out later, when nobody waits for it any more.

    ``waiting``: a patient waiter (a guided step, which nobody's request holds open). It is told at
    each read why the command has not ended (:func:`describe_wait`), and waits past ``timeout``
    while a lab agent is alive to take or finish it, up to PATIENCE_SECONDS in all. A command that
    failed, or whose agent died (the reaper fails it), still ends the wait with the reason."""
    listener = done_listener(engine)
    watch = listener.watch(command_id)  # before the first read: an end announced after it wakes us
    started = time.monotonic()
    deadline = started + timeout
    patience = started + (max(timeout, command_rows.PATIENCE_SECONDS) if waiting else timeout)
    running_since: float | None = None

    def read() -> tuple[str, dict[str, Any] | None, str | None]:
        nonlocal running_since
        watch.ended.clear()
        with engine.connect() as conn:
            row = command_rows.outcome(conn, command_id)
            place = command_rows.place(conn, command_id) if waiting is not None else None
        watch.looked.set()
        if place is not None and place.status in (command_rows.PENDING, command_rows.RUNNING):
            if place.status == command_rows.RUNNING and running_since is None:
                running_since = time.monotonic()
            waiting(describe_wait(place, None if running_since is None else time.monotonic() - running_since))
        return row

    try:
        while True:
            status, result, error = read()
            if status in (command_rows.DONE, command_rows.FAILED):
                break
            now = time.monotonic()
            if now >= deadline and (now >= patience or not live_agents(engine)):
                status, result, error = _at_the_deadline(engine, command_id, now - started)
                break
            watch.ended.wait(min(WAKE_EVERY, max(0.0, (deadline if now < deadline else patience) - now)))
    finally:
        listener.forget(watch)
    if status == command_rows.DONE:
        return result or {}
    kind = CommandNotFound if (result or {}).get("kind") == "not found" else CommandError
    raise kind(error or "the command failed")


def _at_the_deadline(engine: Engine, command_id: int, timeout: float) -> tuple[str, dict[str, Any] | None, str | None]:
    """The command's end if it ended just now; else CommandError once it is withdrawn (still
    pending: no agent will carry it out), or CommandStillRunning (an agent claimed it, even in the
    instant between the read and the withdrawal: it runs)."""
    with engine.begin() as conn:
        status, result, error = command_rows.outcome(conn, command_id)
        if status in (command_rows.DONE, command_rows.FAILED):
            return status, result, error
        reason = (f"no lab agent finished command {command_id} within {timeout:.0f}s (it is {status}); "
                  "is the agent running?")
        withdrawn = status == command_rows.PENDING and command_rows.withdraw(conn, command_id, f"withdrawn: {reason}")
    if withdrawn:  # raised once the withdrawal is committed
        raise CommandTimedOut(reason)
    raise CommandStillRunning(f"a lab agent took command {command_id} and had not finished it within "
                              f"{timeout:.0f}s: it is still running")


def run(engine: Engine, lab: str, verb: str, args: dict[str, Any] | None = None, *,
        agent_id: str | None = None, timeout: float = 30.0, waiting: Waiting | None = None) -> dict[str, Any]:
    """Enqueue a command and wait for its result (``waiting``: patiently, see :func:`wait_for`)."""
    if not live_agents(engine):
        raise NoAgent("no lab agent is running: start the lab with `make run`, or `flask --app app lab agent`")
    return wait_for(engine, enqueue(engine, lab, verb, args, agent_id), timeout, waiting=waiting)
