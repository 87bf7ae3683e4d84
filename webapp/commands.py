"""The command channel: the web and the CLI ask a lab agent to act, through PostgreSQL.

A command is a row in ``lab_control.commands`` plus a NOTIFY that wakes the agents. The agent
that claims it (FOR UPDATE SKIP LOCKED) carries it out and writes the result. This works when
the web app and the consumers run in different containers: both reach the database.
"""
from __future__ import annotations

import json
import time
from typing import Any

from sqlalchemy import Engine, text

from .db import CONTROL_SCHEMA

CHANNEL = "lab_commands"
AGENT_FRESH_SECONDS = 5.0


class CommandError(RuntimeError):
    """The agent could not carry out a command; the message says why."""


class NoAgent(CommandError):
    pass


class CommandNotFound(CommandError):
    """The command named something (a consumer, a group) that does not exist."""


def live_agents(engine: Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.execute(text(
            f"SELECT id FROM {CONTROL_SCHEMA}.agents "
            f"WHERE heartbeat_at > now() - make_interval(secs => :fresh) ORDER BY started_at"),
            {"fresh": AGENT_FRESH_SECONDS}).scalars())


def enqueue(engine: Engine, lab: str, verb: str, args: dict[str, Any] | None = None,
            agent_id: str | None = None) -> int:
    with engine.begin() as conn:
        command_id = conn.execute(text(
            f"INSERT INTO {CONTROL_SCHEMA}.commands (lab, verb, args, agent_id, status) "
            "VALUES (:lab, :verb, CAST(:args AS jsonb), :agent_id, 'pending') RETURNING id"),
            {"lab": lab, "verb": verb, "args": json.dumps(args or {}), "agent_id": agent_id}).scalar_one()
        conn.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": str(command_id)})
    return command_id


def wait_for(engine: Engine, command_id: int, timeout: float) -> dict[str, Any]:
    """Block until the command is done; its result, or CommandError with the agent's reason."""
    deadline = time.monotonic() + timeout
    query = text(f"SELECT status, result, error FROM {CONTROL_SCHEMA}.commands WHERE id = :id")
    while True:
        with engine.connect() as conn:
            status, result, error = conn.execute(query, {"id": command_id}).one()
        if status == "done":
            return result or {}
        if status == "failed":
            kind = CommandNotFound if (result or {}).get("kind") == "not found" else CommandError
            raise kind(error or "the command failed")
        if time.monotonic() > deadline:
            raise CommandError(f"no lab agent finished command {command_id} within {timeout:.0f}s "
                               f"(it is {status}); is the agent running?")
        time.sleep(0.02)


def run(engine: Engine, lab: str, verb: str, args: dict[str, Any] | None = None, *,
        agent_id: str | None = None, timeout: float = 30.0) -> dict[str, Any]:
    """Enqueue a command and wait for its result."""
    if not live_agents(engine):
        raise NoAgent("no lab agent is running: start the lab with `make run`, or `flask --app app lab agent`")
    return wait_for(engine, enqueue(engine, lab, verb, args, agent_id), timeout)
