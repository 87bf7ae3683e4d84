"""Consumer groups: create one (optionally on its own lane of accounts), switch its strategy, its
unique-violation policy, and move its committed offsets (redelivery)."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from .. import strategies
from ..domain import commands, verbs
from ..domain.vocabulary import DEFAULT_STRATEGY, OFFSET_RESET_MODES, OUTSIDE_STRATEGY, Limits
from ..store import labdata, schema
from ..store.labs import ensure_schema, seed_accounts
from .agent_commands import run_command
from .fields import Whole, named, within
from .registry import Args, Context, InvalidRequest, NotFound, operation

Strategy = Literal[tuple(strategies.NAMES)]
OFFSETS_SHAPE = 'give partition: offset pairs, like {"0": 3}'


class CreateGroupArgs(Args):
    group: str = named("the new group's name (local to the lab)", "group", "name", default=...)
    strategy: Strategy = Field(DEFAULT_STRATEGY, description="the deduplication strategy")
    lane: str = named("apply to a lane: the lab's own copy of the accounts under this name")


class GroupRef(Args):
    group: str = named("the consumer group (local to the lab)", default=...)


class StrategyArgs(GroupRef):
    strategy: Strategy = Field(description="the deduplication strategy, from the group's next message")


class GroupSettingsArgs(GroupRef):
    on_unique_violation: Literal[tuple(strategies.ON_UNIQUE_VIOLATION)] = Field(
        description="already-processed: catch the violation, skip, commit the offset (the seed's way); "
                    "retry: a generic error, retried until the record goes to the DLQ")


class ResetOffsetsArgs(GroupRef):
    mode: Literal[OFFSET_RESET_MODES] = Field("earliest", description="where to move the committed offsets")
    offsets: dict[str, int] | None = Field(None, description='offset: {"partition": offset}, like {"0": 3}')
    back: Whole = within(Limits.RESET_BACK, "back: move each partition back this many records")
    timestamp: datetime | None = Field(None, description="timestamp: the first offset at or after this time "
                                       "(ISO-8601)")

    @field_validator("offsets", mode="before")
    @classmethod
    def _offsets(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                raise ValueError(OFFSETS_SHAPE) from None
        if not isinstance(value, dict) or not value:
            raise ValueError(OFFSETS_SHAPE)
        checked = {}
        for partition, offset in value.items():
            low_p, high_p = Limits.PARTITION_INDEX
            low_o, high_o = Limits.OFFSET
            if (not str(partition).isdigit() or not low_p <= int(partition) <= high_p
                    or isinstance(offset, bool) or not isinstance(offset, int) or not low_o <= offset <= high_o):
                raise ValueError(f"{OFFSETS_SHAPE}: partitions {low_p}-{high_p}, offsets {low_o} or more")
            checked[str(int(partition))] = offset
        return checked

    @field_validator("timestamp", mode="before")
    @classmethod
    def _timestamp(cls, value: Any) -> Any:
        try:
            return datetime.fromisoformat(str(value))
        except ValueError:
            raise ValueError("must be an ISO-8601 date and time, like 2026-11-30T09:00:00+00:00") from None

    def command(self) -> commands.GroupReset:
        """The agent's ``group.reset``: the group, the mode and only what the mode uses."""
        used = {"offset": "offsets", "back": "back", "timestamp": "timestamp"}.get(self.mode)
        return commands.GroupReset(group=self.group, mode=self.mode, **({used: getattr(self, used)} if used else {}))

    @model_validator(mode="after")
    def _what_the_mode_needs(self) -> "ResetOffsetsArgs":
        needed = {"offset": "offsets", "back": "back", "timestamp": "timestamp"}.get(self.mode)
        if needed and getattr(self, needed) is None:
            raise InvalidRequest(needed, OFFSETS_SHAPE if needed == "offsets" else f"is required for mode {self.mode}")
        return self


@operation("create_group", path="/groups", status=201, step="group", tags=("groups",),
           summary="Create a consumer group with a strategy; with a lane, on its own copy of the accounts")
def create_group(ctx: Context, args: CreateGroupArgs) -> dict:
    lab = ctx.lab
    group_id = lab.group_id(args.group)
    effects_schema = lab.lane_schema(args.lane) if args.lane else lab.schema
    with ctx.engine.begin() as conn:
        if args.lane:
            ensure_schema(conn, effects_schema)
            seed_accounts(conn, effects_schema)
        schema.enter(conn, lab.schema)
        if not labdata.add_group(conn, group_id, args.strategy, effects_schema):
            raise InvalidRequest("group", f"group {group_id} exists already")
        labdata.say(conn, "strategy", f"group {group_id} created with {args.strategy}"
                    + (f" on lane {args.lane}" if args.lane else ""))
    return {"group_id": group_id, "strategy": args.strategy, "effects_schema": effects_schema}


def _group_settings(ctx: Context, group: str) -> Any:
    """A group's current row; NotFound when there is none."""
    group_id = ctx.lab.group_id(group)
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        row = labdata.group(conn, group_id)
    if row is None:
        raise NotFound(f"no group {group_id} in lab {ctx.lab.name}")
    return row


def _update_group(ctx: Context, group: str, summary: str, **values: Any) -> str:
    group_id = ctx.lab.group_id(group)
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        row = labdata.group(conn, group_id)
        if row is not None and row.strategy == OUTSIDE_STRATEGY:
            # The lab runs none of its strategies in that group: the learner's own code consumes there.
            raise InvalidRequest("group", f"{group_id} is your consumer's group: its deduplication is your code's, "
                                 "not one of the lab's strategies")
        if not labdata.update_group(conn, group_id, **values):
            raise NotFound(f"no group {group_id} in lab {ctx.lab.name}")
        labdata.say(conn, "strategy", summary.format(group_id=group_id))
    return group_id


@operation("set_strategy", settles=True, path="/groups/<group>/strategy", step="strategy", cli="strategy", tags=("groups",),
           summary="Switch a group's deduplication strategy (from its next message)")
def set_strategy(ctx: Context, args: StrategyArgs) -> dict:
    group_id = _update_group(ctx, args.group, f"{{group_id}} now uses {args.strategy} (from the next message)",
                             strategy=args.strategy)
    return {"group_id": group_id, "strategy": args.strategy}


@operation("set_group_settings", settles=True, path="/groups/<group>/settings", step="group_settings", cli="group-settings",
           tags=("groups",), summary="A group's policy on a unique violation: already processed, or retry")
def set_group_settings(ctx: Context, args: GroupSettingsArgs) -> dict:
    group_id = _update_group(ctx, args.group, f"{{group_id}}: on unique violation, {args.on_unique_violation}",
                             on_unique_violation=args.on_unique_violation)
    return {"group_id": group_id, "on_unique_violation": args.on_unique_violation}


# A recovery restarts the members, waits up to twice a session timeout for an assignment, and may
# move the group and wait again (agent/handlers.py recover_group): longer than a command's usual 30 s.
RECOVER_TIMEOUT = 90.0


@operation("recover_group", path="/groups/<group>/recover", step="recover_group", cli="recover-group",
           tags=("groups",), summary="Recover a stalled group: restart its members; if the broker still assigns "
                                     "them nothing, move it to a fresh Kafka group id with its committed offsets")
def recover_group(ctx: Context, args: GroupRef) -> dict:
    return run_command(ctx, verbs.GROUP_RECOVER, commands.GroupRecover(group=args.group), field="group",
                       timeout=RECOVER_TIMEOUT)


@operation("reset_offsets", path="/groups/<group>/reset-offsets", step="reset_offsets", tags=("groups",),
           summary="Stop the group's consumers, move its committed offsets, restart them (redelivery)")
def reset_offsets(ctx: Context, args: ResetOffsetsArgs) -> dict:
    return run_command(ctx, verbs.GROUP_RESET, args.command(), field="group")
