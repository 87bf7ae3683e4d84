"""Chaos mode: seeded random kills, freezes, restarts, database session terminations and broker
connection cuts on one group, while events flow (the agent carries them out: webapp/agent/chaos_runner.py).

The seed is part of the recorded arguments (drawn here when none is given), so an exported session
replays the same chaos: the plan is a pure function of the seed and the group's members
(webapp/domain/chaos_plan.py).
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field, field_validator
from sqlalchemy import select

from ..domain import commands, verbs
from ..domain.chaos_plan import ACTIONS, DEFAULT_ACTIONS
from ..domain.vocabulary import DEFAULT_GROUP, Limits
from ..domain.waits import WaitTimeout, wait_until
from ..store import chaos_sessions, schema
from ..store.command_channel import live_agents
from ..store.labdata import groups_table
from .agent_commands import run_command
from .fields import Number, Whole, named, within
from .registry import Args, Context, InvalidRequest, NoArgs, NotFound, operation

# A stop waits for the session to thaw and restart what it holds down (each a command to an agent).
STOP_TIMEOUT = 45.0
SESSION_KEYS = ("id", "group_id", "seed", "every_seconds", "actions", "down_seconds", "max_actions", "agent_id",
                "status", "actions_done", "last_action", "stop_reason", "started_at", "stopped_at")


def _new_seed() -> int:
    return random.randint(*Limits.CHAOS_SEED)


class StartChaosArgs(Args):
    group: str = named("the consumer group to put under chaos (local to the lab)", default=DEFAULT_GROUP)
    seed: Whole = Field(default_factory=_new_seed, ge=Limits.CHAOS_SEED[0], le=Limits.CHAOS_SEED[1],
                        description="the random seed: the same seed on the same members gives the same actions "
                                    f"({Limits.CHAOS_SEED[0]}-{Limits.CHAOS_SEED[1]}; drawn when omitted)")
    every_seconds: Number = within(Limits.CHAOS_EVERY_SECONDS, "the mean wait between two actions (each wait is "
                                   "0.5-1.5 times it)", default=5.0, unit=" s")
    actions: list[Literal[ACTIONS]] = Field(list(DEFAULT_ACTIONS), min_length=1, max_length=len(ACTIONS) * 4,
                                            description="what chaos may do, a list or comma-separated: "
                                                        + ", ".join(ACTIONS))
    down_seconds: Number = within(Limits.CHAOS_DOWN_SECONDS, "how long a frozen or killed consumer stays down "
                                  "before it is thawed or started again", "down_seconds", "freeze_seconds",
                                  default=3.0, unit=" s")
    max_actions: Whole = within(Limits.CHAOS_ACTIONS, "stop by itself after this many actions (default: until "
                                "stopped)")

    @field_validator("actions", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        # Forms and the CLI send one text: "kill, freeze".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class StopChaosArgs(Args):
    group: str = named("the group whose chaos to stop (default: every group of the lab)")


def session_json(row: dict[str, Any], alive: list[str]) -> dict[str, Any]:
    data = {key: row.get(key) for key in SESSION_KEYS}
    for key in ("started_at", "stopped_at"):
        data[key] = data[key].isoformat() if data[key] is not None else None
    data["agent_alive"] = row.get("agent_id") in alive
    return data


def _close_orphans(ctx: Context, alive: list[str]) -> None:
    """Sessions whose agent died run no more: say so in their rows."""
    with ctx.engine.begin() as conn:
        for row in chaos_sessions.of_dead_agents(conn, ctx.lab.name, alive):
            chaos_sessions.stopped(conn, row["id"], f"its agent {row['agent_id']} is gone")


@operation("start_chaos", path="/chaos", status=201, step="chaos", cli="chaos", tags=("faults",),
           summary="Chaos on a group: at random intervals from a seed, kill, freeze then thaw, or restart its "
                   "consumers, terminate their database sessions, cut their broker connections")
def start_chaos(ctx: Context, args: StartChaosArgs) -> dict:
    group_id = ctx.lab.group_id(args.group)
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        if conn.execute(select(groups_table.c.group_id).where(groups_table.c.group_id == group_id)).first() is None:
            raise NotFound(f"no group {group_id} in lab {ctx.lab.name}")
    alive = live_agents(ctx.engine)
    _close_orphans(ctx, alive)
    with ctx.engine.connect() as conn:
        running = chaos_sessions.active(conn, ctx.lab.name, group_id)
    if running:
        raise InvalidRequest("group", f"chaos already runs on {group_id} (session {running[0]['id']}, seed "
                                      f"{running[0]['seed']}): stop it first")
    return run_command(ctx, verbs.CHAOS_START, commands.ChaosStart(
        group_id=group_id, seed=args.seed, every_seconds=args.every_seconds, actions=list(args.actions),
        down_seconds=args.down_seconds, max_actions=args.max_actions), field="group")


@operation("stop_chaos", path="/chaos/stop", step="stop_chaos", cli="stop-chaos", tags=("faults",),
           summary="Stop chaos (on one group, or all): what it left frozen is thawed, what it killed started again")
def stop_chaos(ctx: Context, args: StopChaosArgs) -> dict:
    group_id = ctx.lab.group_id(args.group) if args.group else None
    alive = live_agents(ctx.engine)
    _close_orphans(ctx, alive)
    with ctx.engine.begin() as conn:
        asked = chaos_sessions.active(conn, ctx.lab.name, group_id)
        for row in asked:
            chaos_sessions.request_stop(conn, row["id"], "stopped on request")
    ids = [row["id"] for row in asked]

    def all_stopped() -> bool:
        with ctx.engine.connect() as conn:
            return all(chaos_sessions.status(conn, session_id) == chaos_sessions.STOPPED for session_id in ids)
    try:
        wait_until(all_stopped, timeout=STOP_TIMEOUT, interval=0.1,
                   message="chaos did not stop: its agent is busy or gone")
    except WaitTimeout:
        pass  # the sessions say "stopping"; their agent finishes the undo when it can
    with ctx.engine.connect() as conn:
        rows = [chaos_sessions.get(conn, session_id) for session_id in ids]
    return {"stopped": [row["id"] for row in rows if row and row["status"] == chaos_sessions.STOPPED],
            "sessions": [session_json(row, alive) for row in rows if row]}


@operation("get_chaos", method="GET", path="/chaos", tags=("faults",),
           summary="The lab's chaos sessions, newest first: seed, rate, actions so far, the last one")
def get_chaos(ctx: Context, args: NoArgs) -> dict:
    alive = live_agents(ctx.engine)
    with ctx.engine.connect() as conn:
        rows = chaos_sessions.of_lab(conn, ctx.lab.name)
    sessions = [session_json(row, alive) for row in rows]
    return {"running": any(s["status"] != chaos_sessions.STOPPED and s["agent_alive"] for s in sessions), "sessions": sessions}
