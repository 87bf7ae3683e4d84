"""The command queue, the agents' side: claim with a lease, and the reaper.

Claim: the oldest pending command addressed to this agent or to none, FOR UPDATE SKIP LOCKED, so
agents claiming at once never wait on each other; the row records who claimed it and a lease the
claiming agent's heartbeat thread renews with each beat (periodic.py). An agent that dies stops
renewing.

The reaper runs in every agent, on its heartbeat thread, so a busy agent still reaps:
- a ``running`` command whose lease ran out, or a ``pending`` one addressed to an agent that no
  longer beats, is failed with the reason ("agent X died (no heartbeat for N s) before finishing");
- a command for any agent that stayed pending ``UNCLAIMED_SECONDS`` is failed: no agent was there;
- consumers that look alive but whose agent is dead are marked ``gone``; one whose process is still
  here (same host, the command line of that very consumer) is killed: nobody could stop it now.
An agent of this host whose process still runs is slow, not dead: the reaper leaves it alone.
An agent that starts where a dead agent had the same host and pid (a restart in the same container)
reconciles that agent's rows before it claims anything: it knows for certain that agent is dead.
"""
from __future__ import annotations

import logging
import os
import signal
import socket
from pathlib import Path

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import Lab
from ..domain.vocabulary import AGENT_FRESH_SECONDS
from ..store import agents, commands, timeline
from ..store import consumers as consumer_rows
from ..store.commands import Claimed
from ..store.schema import enter

log = logging.getLogger("idempotency_lab.agent")

LEASE_SECONDS = AGENT_FRESH_SECONDS
UNCLAIMED_SECONDS = commands.PATIENCE_SECONDS
PRUNE_AGENTS_AFTER = 600.0  # seconds of silence after which a dead agent's row is deleted


def claim(engine: Engine, agent_id: str) -> Claimed | None:
    with engine.begin() as conn:
        return commands.claim(conn, agent_id, LEASE_SECONDS)


def finish(engine: Engine, command_id: int, result: dict) -> None:
    with engine.begin() as conn:
        commands.finish(conn, command_id, result)


def fail(engine: Engine, command_id: int, error: str, kind: str) -> None:
    with engine.begin() as conn:
        commands.fail(conn, command_id, error, kind)


INTERRUPTED = ("PostgreSQL restarted while the agent carried it out; its result is unknown: look at the lab, "
               "then try again")


def interrupted(engine: Engine, command_id: int) -> None:
    """Fail a running command whose result was lost with the database connection, with the reason."""
    with engine.begin() as conn:
        commands.fail(conn, command_id, INTERRUPTED, "interrupted", only_if=commands.RUNNING)


def died(agent_id: str | None, age: float | None, successor: str | None = None) -> str:
    """Why a command of a dead agent failed."""
    if age is None:
        return f"agent {agent_id} is gone (it stopped and left no heartbeat) before finishing"
    reason = f"agent {agent_id} died (no heartbeat for {age:.0f} s) before finishing"
    return f"{reason}; agent {successor} now runs with its host and pid" if successor else reason


def host_of(agent_id: str | None) -> str | None:
    return agent_id.split(":", 1)[0] if agent_id else None


def _cmdline(pid: int) -> list[bytes]:
    """The process's arguments; a title set with setproctitle (a forked consumer) reads as one
    string, so it is split on spaces too."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").split()
    except OSError:
        return []


def _is_an_agent(pid: int) -> bool:
    argv = _cmdline(pid)
    return b"webapp.agent" in argv or (b"lab" in argv and b"agent" in argv)


def _is_that_consumer(pid: int, lab: str, consumer_id: int) -> bool:
    """True when ``pid`` on this host is the consumer process of that row (not a reused pid)."""
    argv = _cmdline(pid)
    return (b"webapp.consumer" in argv and b"--consumer-id" in argv and b"--lab" in argv
            and argv[argv.index(b"--consumer-id") + 1:][:1] == [str(consumer_id).encode()]
            and argv[argv.index(b"--lab") + 1:][:1] == [lab.encode()])


class Reaper:
    def __init__(self, agent_id: str, host: str | None = None, pid: int | None = None):
        self.agent_id = agent_id
        self.pending_notes: list[tuple[str, str]] = []
        self.host = host or socket.gethostname()
        self.pid = pid or os.getpid()

    # --- at start ---------------------------------------------------------------------------

    def reconcile_predecessors(self, engine: Engine) -> list[str]:
        """Rows of earlier agents with our host and pid: certainly dead. Fail their commands, mark
        their consumers gone, delete their rows. The ids reconciled."""
        with engine.begin() as conn:
            earlier = agents.same_host_and_pid(conn, self.host, self.pid, but=self.agent_id)
            for agent in earlier:
                for command in commands.of_agents(conn, [agent.id]):
                    commands.fail(conn, command.id, died(agent.id, agent.age, self.agent_id), "agent died",
                                  only_if=command.status)
                    log.warning("command %s %s failed: agent %s died before finishing", command.id, command.verb,
                                agent.id)
            gone = self._gone(conn, consumer_rows.of_agents(conn, [a.id for a in earlier]),
                              {a.id: a.age for a in earlier}, successor=True)
            for agent in earlier:
                agents.remove(conn, agent.id)
        self._tell(engine, gone)
        return [agent.id for agent in earlier]

    # --- every beat -------------------------------------------------------------------------

    def visibly_alive(self, agent_id: str | None) -> bool:
        """An agent of this host whose process still runs: slow to beat (a stalled database, an
        overloaded machine), not dead; the reaper leaves it alone. (Ids are ``host:pid:hex``.)"""
        if not agent_id or host_of(agent_id) != self.host:
            return False
        try:
            pid = int(agent_id.split(":")[1])
        except (IndexError, ValueError):
            return False
        return pid != self.pid and _is_an_agent(pid)

    def reap(self, conn: Connection) -> None:
        """One round, in the caller's transaction (the heartbeat's)."""
        for command in commands.expired_leases(conn) + commands.waiting_for_dead_agents(conn, AGENT_FRESH_SECONDS):
            if self.visibly_alive(command.agent_id):
                continue
            if commands.fail(conn, command.id, died(command.agent_id, command.age), "agent died",
                             only_if=command.status):
                log.warning("command %s %s failed: %s", command.id, command.verb, died(command.agent_id, command.age))
        for command in commands.unclaimed(conn, UNCLAIMED_SECONDS):
            reason = (f"no lab agent took it within {UNCLAIMED_SECONDS:.0f} s: none was running, "
                      "or the queue before it did not move")
            commands.fail(conn, command.id, reason, "no agent", only_if=commands.PENDING)
        orphans = [row for row in consumer_rows.orphaned(conn, agents.live_ids(conn))
                   if not self.visibly_alive(row.agent_id)]
        self.pending_notes = self._gone(conn, orphans, agents.ages(conn, sorted({o.agent_id for o in orphans
                                                                                   if o.agent_id})))
        agents.prune(conn, PRUNE_AGENTS_AFTER)

    def tell(self, engine: Engine) -> None:
        """The timeline entries of the last round (after its transaction committed)."""
        self._tell(engine, self.pending_notes)
        self.pending_notes = []

    # --- consumers --------------------------------------------------------------------------

    def _gone(self, conn: Connection, rows: list[consumer_rows.Row], ages: dict[str, float],
              successor: bool = False) -> list[tuple[str, str]]:
        notes = []
        for row in rows:
            if not consumer_rows.mark_gone(conn, row.id):
                continue
            why = died(row.agent_id, ages.get(row.agent_id), self.agent_id if successor else None)
            why = why.replace(" before finishing", "")
            summary = f"{row.name} is gone: {why}; nothing runs it now"
            if row.pid and host_of(row.agent_id) == self.host and _is_that_consumer(row.pid, row.lab, row.id):
                try:
                    os.kill(row.pid, signal.SIGKILL)
                    summary += f" (agent {self.agent_id} killed its orphaned process {row.pid})"
                except OSError:
                    pass
            log.warning("consumer %s (%s/%s): %s", row.id, row.lab, row.name, summary)
            notes.append((row.lab, summary))
        return notes

    def _tell(self, engine: Engine, notes: list[tuple[str, str]]) -> None:
        for lab, summary in notes:
            try:
                with engine.begin() as conn:
                    enter(conn, Lab(lab).schema)
                    timeline.record(conn.exec_driver_sql, "error", summary)
            except SQLAlchemyError as error:  # the lab was reset or dropped meanwhile
                log.info("no timeline entry in lab %s: %s", lab, str(error).splitlines()[0])
