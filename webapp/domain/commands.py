"""The lab agent's commands, typed: one model per verb (domain/verbs.py) for the arguments a row of
the commands queue carries.

A sender builds the model and stores ``encode(verb, model)`` (plain JSON, the row's ``args``); the
agent's worker turns the row back into the model with ``parse(verb, raw)`` once, before the handler
runs, so a handler reads attributes, never a dict. A command whose arguments are missing or of the
wrong type is refused there with :class:`MalformedCommand`, its message naming the field.

The models check types and choices only: the limits a person may ask for (how many events, how
many partitions) are the operations' (webapp/ops/), which build these commands from their own
validated arguments.
"""
from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Strict, ValidationError

from . import chaos_plan, verbs
from .vocabulary import CRASH_POINTS, FAULT_ACTIONS, OFFSET_RESET_MODES, PRODUCER_ACKS, PUBLISH_MODES

# Strict: a stored "3" or true is not taken for the number 3 or 1 (a sender that wrote it has a bug).
Whole = Annotated[int, Strict()]


class MalformedCommand(ValueError):
    """A command's arguments do not fit its verb's model; the message starts with the field."""


class Command(BaseModel):
    """Base of every command's arguments: immutable; keys the model does not know are ignored (a
    row written by an older or newer sender still parses)."""
    model_config = ConfigDict(extra="ignore", frozen=True)


class NoArguments(Command):
    """A command that takes no arguments (``lab.drop``)."""


class LabSetup(Command):
    """``lab.ensure`` and ``lab.reset``: the payments topic's partitions (None: the agent's default)."""
    partitions: Whole | None = None


class TopicRetention(Command):
    """``topic.retention``: the topic configs to set; None leaves one as it is."""
    retention_ms: Whole | None = None
    segment_ms: Whole | None = None


class LanePrincipal(Command):
    """``lane.kafka_principal``: the lane whose SCRAM user and ACLs to create."""
    lane: str


class Publish(Command):
    """``publish``: what the agent's producer writes, and how its producer is configured."""
    mode: Literal[PUBLISH_MODES] = "normal"
    idempotent: bool = True
    max_in_flight: Whole | None = None
    acks: Literal[PRODUCER_ACKS] | None = None
    retries: Whole | None = None
    poison_kind: str = "not-json"
    event_id: str | None = None
    type: str = "credit"
    account_id: str | None = None
    amount_cents: Whole | None = None
    status: str | None = None
    balance_cents: Whole | None = None
    score: Whole | None = None
    count: Whole = 1
    transaction_id: str | None = None
    occurred_at: str | None = None


class ProduceRaw(Command):
    """``produce.raw``: one record exactly as typed."""
    key: str | None = None
    value: str | None = None
    headers: dict[str, str] | None = None
    partition: Whole | None = None
    idempotent: bool = True
    transaction: Literal["none", "abort"] = "none"


class ConsumerStart(Command):
    """``consumer.start``: the group (created with ``strategy`` if new), the name, a fault to arm first."""
    group: str | None = None
    strategy: str | None = None
    name: str | None = None
    point: Literal[CRASH_POINTS] | None = None
    action: Literal[FAULT_ACTIONS] = "crash"


class ConsumerRef(Command):
    """``consumer.stop``, ``.kill``, ``.freeze``, ``.thaw``, ``.restart``: the consumer's row id."""
    consumer_id: Whole


class GroupReset(Command):
    """``group.reset``: where to move the group's committed offsets."""
    group: str
    mode: Literal[OFFSET_RESET_MODES] = "earliest"
    offsets: dict[int, Whole] | None = None
    back: Whole | None = None
    timestamp: datetime | None = None


class GroupRecover(Command):
    """``group.recover``: the group to recover; ``automatic`` when the agent asked for it itself."""
    group: str
    automatic: bool = False


class ChaosStart(Command):
    """``chaos.start``: the session's group (Kafka group id), seed, pace, actions and limits."""
    group_id: str
    seed: Whole
    every_seconds: float
    actions: list[Literal[chaos_plan.ACTIONS]]
    down_seconds: float
    max_actions: Whole | None = None


class LoadStart(Command):
    """``load.start``: how many records over how many accounts, the pace (0: as fast as possible),
    the ratios of resends and source duplicates, and the seed."""
    events: Whole
    accounts: Whole
    rate_per_second: Whole = 0
    resend_ratio: float = 0.0
    source_duplicate_ratio: float = 0.0
    seed: Whole = 0


class DedupWarmup(Command):
    """``dedup.warmup``: how many synthetic keys, spread over how many days."""
    keys: Whole
    days: Whole


class ExplorationStart(Command):
    """``exploration.start``: the queued exploration's row id."""
    exploration_id: Whole


class ScenarioStep(Command):
    """``scenario.step``: the guided run whose click the agent carries out."""
    run_id: Whole


COMMANDS: dict[str, type[Command]] = {
    verbs.LAB_ENSURE: LabSetup,
    verbs.LAB_RESET: LabSetup,
    verbs.LAB_DROP: NoArguments,
    verbs.TOPIC_RETENTION: TopicRetention,
    verbs.LANE_KAFKA_PRINCIPAL: LanePrincipal,
    verbs.PUBLISH: Publish,
    verbs.PRODUCE_RAW: ProduceRaw,
    verbs.CONSUMER_START: ConsumerStart,
    verbs.CONSUMER_STOP: ConsumerRef,
    verbs.CONSUMER_KILL: ConsumerRef,
    verbs.CONSUMER_FREEZE: ConsumerRef,
    verbs.CONSUMER_THAW: ConsumerRef,
    verbs.CONSUMER_RESTART: ConsumerRef,
    verbs.GROUP_RESET: GroupReset,
    verbs.GROUP_RECOVER: GroupRecover,
    verbs.CHAOS_START: ChaosStart,
    verbs.LOAD_START: LoadStart,
    verbs.DEDUP_WARMUP: DedupWarmup,
    verbs.EXPLORATION_START: ExplorationStart,
    verbs.SCENARIO_STEP: ScenarioStep,
}


def encode(verb: str, command: Command) -> dict[str, Any]:
    """The row's ``args`` for ``command``: JSON, the fields the sender gave (a field left to its
    default is not written: the agent's model gives it the same default)."""
    expected = COMMANDS[verb]
    if type(command) is not expected:
        raise TypeError(f"{verb} carries {expected.__name__}, not {type(command).__name__}")
    return command.model_dump(mode="json", exclude_unset=True)


def parse(verb: str, raw: Mapping[str, Any] | None) -> Command:
    """The typed command of a row; MalformedCommand naming the field when it does not fit."""
    model = COMMANDS.get(verb)
    if model is None:
        raise MalformedCommand(f"unknown command {verb!r}")
    try:
        return model.model_validate(dict(raw or {}))
    except ValidationError as error:
        first = error.errors()[0]
        field = str(first["loc"][0]) if first["loc"] else "request"
        raise MalformedCommand(f"{field}: {first['msg']} (a {verb} command)") from None
