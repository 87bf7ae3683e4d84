"""The explorer as operations: queue a search for the shortest fault schedule that breaks a strategy,
or a lane (a learner's own consumer, explored in this lab with the faults outside its process),
follow it, cancel it.

``explore`` writes a queued row (store/explorations.py: one queued or running exploration per lab)
and asks a lab agent to start its process (``python -m webapp.explorer``, webapp/agent/explorations.py),
then answers at once: a search runs for minutes, on real consumers and the real broker, and no web
request waits for it. Its progress (runs done, the current schedule's length, the phase) and its
result (the shrunk schedule as a scenario file, the why, how often it reproduced) are on its row,
which ``get_explorations`` and the dashboard's Explorer panel read.

In classroom mode a lab's budget is capped (LAB_EXPLORER_MAX_RUNS, LAB_EXPLORER_MAX_MINUTES): a request
above a cap is refused naming it, and a budget given in one unit only is bounded in the other by its cap.
"""
from __future__ import annotations

import random
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .. import strategies
from ..domain import commands, verbs
from ..domain.lab import NAME_RULE, InvalidLabName
from ..domain.vocabulary import EXPLORER_FAULT_KINDS, EXPLORER_SOURCE_DUPLICATE_STRATEGIES, OUTSIDE_STRATEGY
from ..domain.waits import WaitTimeout, wait_until
from ..store import explorations as store
from ..store import labdata, schema
from ..store.classroom import lab_count_limit_reached
from . import limits
from .agent_commands import run_command
from .fields import Number, Whole, named, within
from .registry import Args, Busy, Context, InvalidRequest, NoArgs, NotFound, operation

# How long a cancel waits for the exploration to say it stopped: it stops after the run in progress
# (seconds to a minute; its agent stops it by force after three); past that it answers with the row
# still running, cancel requested ("cancelling" on the panel).
CANCEL_WAIT = 10.0
ROW_KEYS = ("id", "lab", "strategy", "lane", "budget_runs", "budget_minutes", "seed", "faults", "state", "phase",
            "runs_done", "schedule_length", "result", "error", "cancel_requested", "agent_id", "pid")
TIMES = ("created_at", "started_at", "updated_at", "finished_at")
# The strategies the explorer can judge: every one the lab runs, not the learner's own code (a lane).
# A budget's bounds: a run takes seconds to a minute, so a day is the longest search worth asking for.
RUNS = (1, 10_000)
MINUTES = (0.1, 1440.0)
SEEDS = (0, 2**31 - 1)
EXPLORABLE = tuple(name for name in strategies.NAMES if name != OUTSIDE_STRATEGY)


def _new_seed() -> int:
    return random.randint(*SEEDS)


class ExploreArgs(Args):
    strategy: Literal[EXPLORABLE] | None = Field(
        None, description="the strategy to explore: each run starts consumers using it, in a fresh lab of its "
                          "own (give this or lane)")
    lane: str | None = named("or: the lane of your own consumer, running: explored in this lab with the faults "
                             "outside its process (resends, source duplicates, commits blocked, connections cut, "
                             "database sessions terminated); its runs add credits to the lab and the lane")
    runs: Whole = within(RUNS, "budget: at most this many runs (give runs, minutes or both)")
    minutes: Number = within(MINUTES, "budget: stop searching after this long",
                                    unit=" min")
    seed: Whole = Field(default_factory=_new_seed, ge=SEEDS[0], le=SEEDS[1],
                        description="the random seed the schedules are drawn from: the same seed draws the same "
                                    f"schedules ({SEEDS[0]}-{SEEDS[1]}; drawn when "
                                    "omitted)")
    faults: list[Literal[EXPLORER_FAULT_KINDS]] | None = Field(
        None, min_length=1, max_length=len(EXPLORER_FAULT_KINDS) * 4,
        description="the fault kinds its schedules may use, a list or comma-separated (default: every kind): "
                    + ", ".join(EXPLORER_FAULT_KINDS))

    @field_validator("faults", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        # Forms and the CLI send one text: "kill, join"; left empty, every kind.
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()] or None
        return value

    @model_validator(mode="after")
    def _one_target_and_a_budget(self) -> "ExploreArgs":
        if (self.strategy is None) == (self.lane is None):
            raise InvalidRequest("strategy", "give a strategy to explore, or the lane of your own consumer "
                                             "(one of them)")
        if self.runs is None and self.minutes is None:
            raise InvalidRequest("runs", "give a budget: runs, minutes, or both")
        if (self.faults and "source-duplicate" in self.faults and self.strategy is not None
                and self.strategy not in EXPLORER_SOURCE_DUPLICATE_STRATEGIES):
            raise InvalidRequest("faults", f"source-duplicate is judged only against "
                                           f"{' and '.join(EXPLORER_SOURCE_DUPLICATE_STRATEGIES)}, which key on "
                                           f"the transaction: to {self.strategy} it is a new event")
        return self


class ExplorationIdArgs(Args):
    exploration_id: int = Field(ge=1, le=2**63 - 1, description="the exploration's id, as GET /explorations lists it")


def row_json(row: dict[str, Any]) -> dict[str, Any]:
    data = {key: row.get(key) for key in ROW_KEYS}
    for key in TIMES:
        data[key] = row[key].isoformat() if row.get(key) is not None else None
    return data


def _budget(ctx: Context, args: ExploreArgs) -> tuple[int | None, float | None]:
    """The budget, within this lab's caps: above one is refused; a unit not given takes its cap."""
    limits.check_ceiling(ctx, "runs", "LAB_EXPLORER_MAX_RUNS", args.runs or 0)
    most_minutes = ctx.config.get("LAB_EXPLORER_MAX_MINUTES")
    if most_minutes is not None and args.minutes is not None and args.minutes > float(most_minutes):
        raise limits.LimitReached("minutes", f"must be at most {float(most_minutes):g} on this lab "
                                             "(LAB_EXPLORER_MAX_MINUTES)")
    runs = args.runs if args.runs is not None else ctx.config.get("LAB_EXPLORER_MAX_RUNS")
    minutes = args.minutes if args.minutes is not None else most_minutes
    return (int(runs) if runs is not None else None), (float(minutes) if minutes is not None else None)


def _check_lane(ctx: Context, lane: str) -> None:
    """NotFound unless the lab has a lane of that name for the learner's own consumer."""
    try:
        group_id = ctx.lab.group_id(lane)
    except InvalidLabName:
        raise InvalidRequest("lane", NAME_RULE) from None
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        row = labdata.group(conn, group_id)
    if row is None or row.strategy != OUTSIDE_STRATEGY:
        raise NotFound(f"lab {ctx.lab.name} has no lane {lane} for your consumer: create it first (POST /yours)")


@operation("explore", path="/explorations", status=201, cli="explore", tags=("explorer",),
           summary="Search for a fault schedule that breaks a strategy (or your consumer's lane), shrink it to the shortest that still "
                   "does, and hand it back as a scenario; runs in the background on a lab agent, its progress in "
                   "GET /explorations and the Explorer panel")
def explore(ctx: Context, args: ExploreArgs) -> dict:
    runs, minutes = _budget(ctx, args)
    if args.lane is not None:
        _check_lane(ctx, args.lane)
    with ctx.engine.begin() as conn:
        # A strategy's runs each make a lab of their own (dropped after it); a lane's run in this lab.
        refused = lab_count_limit_reached(conn, ctx.config) if args.lane is None else None
        if refused:
            raise Busy(f"the explorer runs each schedule in a fresh lab, and {refused}")
        store.end_stale(conn, ctx.lab.name)
        try:
            row = store.create(conn, ctx.lab.name, strategy=args.strategy, lane=args.lane, budget_runs=runs,
                               budget_minutes=minutes, seed=args.seed,
                               faults=list(dict.fromkeys(args.faults)) if args.faults else None)
        except store.AlreadyExploring as busy:
            raise Busy(f"exploration {busy.row['id']} is {busy.row['state']} in this lab, and a lab runs one "
                       "exploration at a time: cancel it (POST /api/v1/explorations/cancel, the Explorer "
                       "panel's Cancel button) or wait for it to end") from None
    try:
        started = run_command(ctx, verbs.EXPLORATION_START, commands.ExplorationStart(exploration_id=row["id"]),
                              field="strategy")
    except Exception as error:
        with ctx.engine.begin() as conn:
            store.finish(conn, row["id"], store.FAILED, error=f"no agent started it: {error}")
        raise
    return {**row_json(row), "pid": started.get("pid")}


@operation("cancel_exploration", path="/explorations/cancel", cli="cancel-exploration",
           tags=("explorer",),
           summary="Cancel the lab's running exploration: it stops after the run in progress (forced after "
                   "three minutes); what it found so far is kept")
def cancel_exploration(ctx: Context, args: NoArgs) -> dict:
    with ctx.engine.begin() as conn:
        asked = store.request_cancel(conn, ctx.lab.name, "cancelled on request")
    if not asked:
        raise InvalidRequest("request", f"no exploration is queued or running in lab {ctx.lab.name}")

    def ended() -> list[dict[str, Any]] | None:
        with ctx.engine.connect() as conn:
            found = [store.get(conn, exploration_id) for exploration_id in asked]
        return found if all(row is None or row["state"] in store.END_STATES for row in found) else None
    try:
        rows = wait_until(ended, timeout=CANCEL_WAIT, interval=0.2, message="still running")
    except WaitTimeout:  # its agent stops it by force, or (gone) the row goes stale: shown "cancelling"
        with ctx.engine.connect() as conn:
            rows = [store.get(conn, exploration_id) for exploration_id in asked]
    return {"cancelled": asked, "explorations": [row_json(row) for row in rows if row]}


@operation("get_explorations", method="GET", path="/explorations", tags=("explorer",),
           summary="The lab's newest explorations: target, budget, seed, state, progress (runs done, the current "
                   "schedule's length, the phase) and the result")
def get_explorations(ctx: Context, args: NoArgs) -> dict:
    with ctx.engine.begin() as conn:
        store.end_stale(conn, ctx.lab.name)
        rows = store.of_lab(conn, ctx.lab.name)
    return {"running": any(row["state"] in store.ACTIVE_STATES for row in rows),
            "explorations": [row_json(row) for row in rows]}


@operation("get_exploration", method="GET", path="/explorations/<int:exploration_id>", tags=("explorer",),
           summary="One exploration of the lab, with its result: the shrunk schedule as a scenario file, the why, "
                   "how often it reproduced, what was tried")
def get_exploration(ctx: Context, args: ExplorationIdArgs) -> dict:
    with ctx.engine.connect() as conn:
        row = store.get(conn, args.exploration_id)
    if row is None or row["lab"] != ctx.lab.name:
        raise NotFound(f"no exploration {args.exploration_id} in lab {ctx.lab.name}")
    return row_json(row)

