"""The command channel, the web's side: the web and the CLI ask a lab agent to act, through PostgreSQL.

A command is a row in ``lab_control.commands`` plus a NOTIFY that wakes the agents. The agent
that claims it carries it out and writes the result (webapp/agent/queue.py). This works when the
web app and the consumers run in different containers: both reach the database. This module
imports no Kafka client, directly or not: gunicorn never loads one.
"""
from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Engine

from . import agents as agent_rows
from . import commands as command_rows


class CommandError(RuntimeError):
    """The agent could not carry out a command; the message says why."""


class NoAgent(CommandError):
    pass


class CommandNotFound(CommandError):
    """The command named something (a consumer, a group) that does not exist."""


def live_agents(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return agent_rows.live_ids(conn)


def enqueue(engine: Engine, lab: str, verb: str, args: dict[str, Any] | None = None,
            agent_id: str | None = None) -> int:
    with engine.begin() as conn:
        return command_rows.insert(conn, lab, verb, args or {}, agent_id)


def wait_for(engine: Engine, command_id: int, timeout: float) -> dict[str, Any]:
    """Block until the command is done; its result, or CommandError with the agent's reason.

    A command still pending at the deadline is withdrawn, so no agent carries it out later, when
    nobody waits for it any more."""
    deadline = time.monotonic() + timeout
    while True:
        with engine.connect() as conn:
            status, result, error = command_rows.outcome(conn, command_id)
        if status == command_rows.DONE:
            return result or {}
        if status == command_rows.FAILED:
            kind = CommandNotFound if (result or {}).get("kind") == "not found" else CommandError
            raise kind(error or "the command failed")
        if time.monotonic() > deadline:
            reason = (f"no lab agent finished command {command_id} within {timeout:.0f}s (it is {status}); "
                      "is the agent running?")
            if status == command_rows.PENDING:
                with engine.begin() as conn:
                    withdrawn = command_rows.withdraw(conn, command_id, f"withdrawn: {reason}")
                if not withdrawn:
                    continue  # claimed just now: report what it became
            raise CommandError(reason)
        time.sleep(0.02)


def run(engine: Engine, lab: str, verb: str, args: dict[str, Any] | None = None, *,
        agent_id: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Enqueue a command and wait for its result."""
    if not live_agents(engine):
        raise NoAgent("no lab agent is running: start the lab with `make run`, or `flask --app app lab agent`")
    return wait_for(engine, enqueue(engine, lab, verb, args, agent_id), timeout)
