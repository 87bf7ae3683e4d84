"""Chaos sessions, carried out by the agent that started them (one thread per session).

A session follows its plan (webapp/domain/chaos_plan.py: seeded, a pure function of the seed and the
group's members) on one group:
- ``kill``: SIGKILL the consumer, start it again after the session's down time;
- ``freeze``: SIGSTOP, SIGCONT after the down time (a zombie: its partitions may have moved);
- ``restart``: a graceful stop and a start;
- ``terminate-sessions``: ``pg_terminate_backend`` on the consumer's effects session (named by its
  ``application_name``): its transaction rolls back, it reconnects;
- ``cut-connections``: the fault proxy closes the consumer's and the lab's producers' broker
  connections (their Kafka client ids, both naming the lab: no other lab's client is cut);
  librdkafka reconnects. Only where the broker advertises the proxy to every client
  (``make run``); elsewhere the action says it cannot and does nothing.

Signals go through the command channel to the consumer's owning agent (this one, or another),
as a click does, so the pool is only ever touched by an agent's main loop. Every action, and
every undo, goes to the lab's timeline as ``chaos`` with the seed and the action's index: the
timeline and the session's row say what happened, the seed says what will. A stop (the
``stop_chaos`` operation, the session's action limit, the agent's shutdown) first undoes what the
session left frozen or killed.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from ..domain import chaos_plan, commands, verbs
from ..domain.lab import Lab
from ..domain.vocabulary import FAULT_PROXY_FRESH_SECONDS
from ..domain.waits import WaitTimeout
from ..faultproxy.control import DEFAULT_NAME as FAULT_PROXY
from ..store import chaos_sessions, command_channel, faultproxies, labdata, schema
from ..store import consumers as consumer_rows
from .context import AgentContext

log = logging.getLogger("idempotency_lab.agent")

TICK = 0.1                 # seconds between two looks at the clock and the session's row
COMMAND_TIMEOUT = 30.0     # a kill, freeze or restart carried out by the consumer's agent
TERMINATE_SQL = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                 "WHERE application_name = :name AND pid <> pg_backend_pid()")


@dataclass
class Held:
    """A consumer this session holds down: frozen or killed, to be thawed or started at ``due``."""
    consumer_id: int
    name: str
    undo: str          # consumer.thaw | consumer.restart
    due: float         # time.monotonic()
    index: int         # the action that took it down


class ChaosRunner(threading.Thread):
    """One chaos session's thread: act when the plan says, undo when the down time is over."""

    def __init__(self, engine: Engine, session: dict[str, Any]):
        super().__init__(name=f"chaos {session['id']}", daemon=True)
        self.engine = engine
        self.session = session
        self.lab = Lab(session["lab"])
        self.plan = chaos_plan.ChaosPlan(session["seed"], session["actions"], session["every_seconds"])
        self.held: dict[str, Held] = {}
        self.halt = threading.Event()  # the agent is shutting down

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        reason = "stopped"
        try:
            reason = self._follow_plan()
        except Exception:  # a bug: say so on the timeline rather than vanish silently
            log.exception("chaos session %s", self.session["id"])
            reason = "the chaos thread failed (see the agent's log)"
        finally:
            # At the agent's shutdown its main loop carries out no more commands; its pool thaws
            # (SIGCONT) and stops every consumer itself.
            if not self.halt.is_set():
                self._undo_all()
            self._close(reason)

    def _follow_plan(self) -> str:
        upcoming: chaos_plan.ChaosAction | None = None
        last = time.monotonic()
        while True:
            if self.halt.wait(TICK):
                return "the agent stopped"
            status = self._status()
            if status is None:
                return "the session's row is gone"
            if status != chaos_sessions.RUNNING:
                return "stopped on request"
            self._undo_due()
            if upcoming is None:
                upcoming = self.plan.next(self._members())
            if time.monotonic() - last < upcoming.wait_seconds:
                continue
            # The target was drawn against the members of that moment; act on them as they are now.
            self._act(upcoming)
            last = time.monotonic()
            limit = self.session.get("max_actions")
            if limit and upcoming.index >= limit:
                return f"after its {limit} action(s)"
            upcoming = None

    def _status(self) -> str | None:
        try:
            with self.engine.connect() as conn:
                return chaos_sessions.status(conn, self.session["id"])
        except SQLAlchemyError as error:  # PostgreSQL restarting: carry on, look again next tick
            log.warning("chaos %s: %s", self.session["id"], str(error).splitlines()[0])
            return chaos_sessions.RUNNING

    def _members(self) -> list[str]:
        """The group's members: its live consumers, and those this session holds down."""
        try:
            with self.engine.connect() as conn:
                live = [row.name for row in consumer_rows.live(conn, self.lab.name, self.session["group_id"])]
        except SQLAlchemyError:
            live = []
        return sorted(set(live) | set(self.held))

    def _consumer(self, name: str) -> consumer_rows.Row | None:
        with self.engine.connect() as conn:
            rows = [row for row in consumer_rows.live(conn, self.lab.name, self.session["group_id"])
                    if row.name == name]
        return rows[0] if rows else None

    # --- actions ----------------------------------------------------------------------------

    def _act(self, action: chaos_plan.ChaosAction) -> None:
        if action.target is None:
            self._say(action, "skipped: the group has no consumer to act on", outcome="skipped")
            return
        if action.target in self.held:
            held = self.held[action.target]
            self._say(action, f"skipped: {action.target} is still down from #{held.index}", outcome="skipped")
            return
        try:
            row = self._consumer(action.target)
            if row is None:
                self._say(action, f"skipped: {action.target} is not running", outcome="skipped")
                return
            outcome, what = getattr(self, "_" + action.action.replace("-", "_"))(action, row)
        except (command_channel.CommandError, SQLAlchemyError) as error:
            outcome, what = "failed", f"failed: {str(error).splitlines()[0]}"
        self._say(action, what, outcome=outcome)

    def _command(self, verb: str, consumer_id: int, agent_id: str | None) -> dict:
        """Carry out ``verb`` on the consumer's agent and wait for its outcome, across a PostgreSQL
        restart: a command enqueued before it may be carried out after it."""
        deadline = time.monotonic() + COMMAND_TIMEOUT
        args = commands.encode(verb, commands.ConsumerRef(consumer_id=consumer_id))
        command_id = self._across_restart(lambda: command_channel.enqueue(self.engine, self.lab.name, verb, args,
                                                                          agent_id), deadline)
        return self._across_restart(lambda: command_channel.wait_for(self.engine, command_id,
                                                              timeout=max(0.5, deadline - time.monotonic())), deadline)

    def _across_restart(self, call, deadline: float):
        while True:
            try:
                return call()
            except SQLAlchemyError:
                if time.monotonic() > deadline or self.halt.is_set():
                    raise
                self.halt.wait(0.5)  # PostgreSQL coming back: ask again

    def _hold_while(self, action: chaos_plan.ChaosAction, row: consumer_rows.Row, verb: str, undo: str) -> None:
        """Hold the consumer down (undo due after the down time), then act: if the action's outcome is
        lost with a restarting database, the undo still comes; if it was refused, nothing to undo."""
        self.held[row.name] = Held(row.id, row.name, undo, time.monotonic() + self.session["down_seconds"],
                                   action.index)
        try:
            self._command(verb, row.id, row.agent_id)
        except command_channel.CommandError:
            self.held.pop(row.name, None)
            raise

    def _kill(self, action: chaos_plan.ChaosAction, row: consumer_rows.Row) -> tuple[str, str]:
        self._hold_while(action, row, verbs.CONSUMER_KILL, verbs.CONSUMER_RESTART)
        return "done", f"SIGKILL (no commit, no leave); started again in {self.session['down_seconds']:g} s"

    def _freeze(self, action: chaos_plan.ChaosAction, row: consumer_rows.Row) -> tuple[str, str]:
        self._hold_while(action, row, verbs.CONSUMER_FREEZE, verbs.CONSUMER_THAW)
        return "done", f"SIGSTOP; thawed in {self.session['down_seconds']:g} s (a zombie if its partitions move)"

    def _restart(self, action: chaos_plan.ChaosAction, row: consumer_rows.Row) -> tuple[str, str]:
        self._command(verbs.CONSUMER_RESTART, row.id, row.agent_id)
        return "done", "graceful stop and start"

    def _terminate_sessions(self, action: chaos_plan.ChaosAction, row: consumer_rows.Row) -> tuple[str, str]:
        name = f"lab {self.lab.name} {row.name} effects"
        with self.engine.begin() as conn:
            ended = conn.execute(text(TERMINATE_SQL), {"name": name}).scalar_one()
        if not ended:
            return "skipped", "skipped: it has no database session open right now"
        return "done", f"pg_terminate_backend ended its effects session ({ended}): its transaction rolled back"

    def _cut_connections(self, action: chaos_plan.ChaosAction, row: consumer_rows.Row) -> tuple[str, str]:
        clients = [self.lab.client_id(row.name), self.lab.producer_client_id]
        try:
            cut = faultproxies.cut_and_wait(self.engine, FAULT_PROXY, self.lab.name, clients, FAULT_PROXY_FRESH_SECONDS)
        except WaitTimeout:
            return "failed", f"failed: the fault proxy did not carry out the cut within {faultproxies.CUT_TIMEOUT:g} s"
        if cut is None:
            return "skipped", ("skipped: no fault proxy runs, so nothing stands between the clients and the "
                               "broker to cut (make run starts one)")
        return "done", ("the fault proxy closed the broker connections of " + " and ".join(clients)
                        + " that pass through it; librdkafka reconnects")

    # --- undo -------------------------------------------------------------------------------

    def _undo_due(self) -> None:
        now = time.monotonic()
        for held in [h for h in self.held.values() if h.due <= now]:
            self._undo(held)

    def _undo_all(self) -> None:
        """At a stop: undo everything held, retrying while PostgreSQL comes back (bounded)."""
        deadline = time.monotonic() + 2 * COMMAND_TIMEOUT
        while self.held and time.monotonic() < deadline:
            for held in list(self.held.values()):
                self._undo(held)
            if self.held:
                self.halt.wait(0.5)

    def _undo(self, held: Held) -> None:
        verb = "thawed (SIGCONT)" if held.undo == verbs.CONSUMER_THAW else "started again"
        try:
            with self.engine.connect() as conn:
                row = consumer_rows.get(conn, held.consumer_id)
            if row is None or row.lab != self.lab.name:
                self.held.pop(held.name, None)
                return
            self._command(held.undo, held.consumer_id, row.agent_id)
        except command_channel.CommandError as error:
            # Refused for good (stopped by hand meanwhile, say): nothing left to undo.
            self.held.pop(held.name, None)
            self._note(f"chaos #{held.index}: {held.name} not {verb}: {error}", index=held.index, action="undo",
                       target=held.name, outcome="failed")
            return
        except SQLAlchemyError as error:
            # PostgreSQL restarting: try again in a second.
            log.warning("chaos %s: undo of #%s on %s: %s", self.session["id"], held.index, held.name,
                        str(error).splitlines()[0])
            held.due = time.monotonic() + 1.0
            return
        self.held.pop(held.name, None)
        self._note(f"chaos #{held.index}: {held.name} {verb}", index=held.index, action="undo", target=held.name)

    # --- the record -------------------------------------------------------------------------

    def _say(self, action: chaos_plan.ChaosAction, what: str, outcome: str) -> None:
        summary = (f"chaos #{action.index} (seed {self.session['seed']}): {action.action} "
                   f"{action.target or '(no consumer)'}: {what}")
        self._note(summary, index=action.index, action=action.action, target=action.target, outcome=outcome)
        try:
            with self.engine.begin() as conn:
                chaos_sessions.acted(conn, self.session["id"], summary)
        except SQLAlchemyError as error:
            log.warning("chaos %s: %s", self.session["id"], str(error).splitlines()[0])

    def _note(self, summary: str, **detail: Any) -> None:
        try:
            with schema.begin_in(self.engine, self.lab.schema) as conn:
                labdata.say(conn, "chaos", summary, session=self.session["id"], seed=self.session["seed"],
                            group=self.session["group_id"], **detail)
        except SQLAlchemyError as error:  # the lab reset meanwhile, or PostgreSQL away: the row keeps the count
            log.warning("chaos %s: no timeline entry: %s", self.session["id"], str(error).splitlines()[0])

    def _close(self, reason: str) -> None:
        try:
            with self.engine.begin() as conn:
                chaos_sessions.stopped(conn, self.session["id"], reason)
                row = chaos_sessions.get(conn, self.session["id"])
            self._note(f"chaos stopped on {self.lab.local_group(self.session['group_id'])} after "
                       f"{row['actions_done'] if row else '?'} action(s) (seed {self.session['seed']}): "
                       f"{row['stop_reason'] if row and row['stop_reason'] else reason}", action="stop")
        except SQLAlchemyError as error:
            log.warning("chaos %s: could not record its end: %s", self.session["id"], error)


# --- the agent's side: handlers and shutdown ------------------------------------------------

RUNNERS: dict[int, ChaosRunner] = {}


def start(agent: AgentContext, lab: Lab, command: commands.ChaosStart) -> dict:
    """Handler of ``chaos.start``: record the session as this agent's and start its thread."""
    with agent.engine.begin() as conn:
        session = chaos_sessions.create(conn, lab.name, command.group_id, command.seed, command.every_seconds,
                                        list(command.actions), command.down_seconds, command.max_actions, agent.id)
    agent.say(lab, "chaos", f"chaos started on {lab.local_group(session['group_id'])}: seed {session['seed']}, "
              f"about every {session['every_seconds']:g} s, {', '.join(session['actions'])}; down for "
              f"{session['down_seconds']:g} s", session=session["id"], seed=session["seed"],
              group=session["group_id"], action="start", actions=session["actions"])
    runner = ChaosRunner(agent.engine, session)
    RUNNERS[session["id"]] = runner
    runner.start()
    return {key: session[key] for key in ("id", "lab", "group_id", "seed", "every_seconds", "actions",
                                          "down_seconds", "max_actions", "agent_id", "status")}


def stop_all(timeout: float = 20.0) -> None:
    """At the agent's shutdown: every session undoes what it holds down and records its end."""
    for runner in RUNNERS.values():
        runner.halt.set()
    for runner in list(RUNNERS.values()):
        runner.join(timeout=timeout)
    RUNNERS.clear()
