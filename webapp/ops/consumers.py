"""Consumer processes: start one, act on one (kill, freeze, thaw, stop, restart), arm a crash
point, step through one message's processing."""
from __future__ import annotations

from typing import Callable, Literal

from pydantic import Field

from .. import strategies
from ..domain import commands, verbs
from ..domain.vocabulary import CRASH_POINTS, DEFAULT_GROUP, FAULT_ACTIONS
from ..store import consumers as store
from ..store import schema
from ..store.labdata import say
from . import limits
from .agent_commands import run_command
from .fields import Whole, consumer_id, named
from .registry import Args, Context, InvalidRequest, NotFound, operation


class StartConsumerArgs(Args):
    group: str = named("the consumer group (local to the lab)", default=DEFAULT_GROUP)
    strategy: Literal[tuple(strategies.NAMES)] = Field(
        None, description="switch the group to this strategy first (default: keep the group's)")
    name: str = named("the consumer's name, shown everywhere (default: c1, c2, ...)", "name", "consumer")
    # Armed in the consumer's row before its process starts: a fault that must catch the first record
    # the member is handed (a rebalance can hand it one within seconds of its start, before a second click).
    point: Literal[CRASH_POINTS] = Field(None, description="arm this crash point (once) before the consumer joins "
                                         "its group")
    action: Literal[FAULT_ACTIONS] = Field("crash", description="with point: crash (os._exit) or freeze (SIGSTOP) there")

    def command(self) -> commands.ConsumerStart:
        """The agent's ``consumer.start`` for these arguments."""
        return self.as_command(commands.ConsumerStart)


class ConsumerRef(Args):
    consumer_id: Whole = consumer_id()

    def command(self) -> commands.ConsumerRef:
        """The agent's command on this consumer (stop, kill, freeze, thaw, restart)."""
        return self.as_command(commands.ConsumerRef)


class ArmArgs(ConsumerRef):
    point: Literal[CRASH_POINTS] = Field(None, description="the crash point; none disarms")
    action: Literal[FAULT_ACTIONS] = Field("crash", description="crash: die there (os._exit); "
                                           "freeze: stop there (SIGSTOP), like a long GC pause")
    always: bool = Field(False, description="every time, not just once")


class StepModeArgs(ConsumerRef):
    on: bool = Field(True, description="stop at every point of each message")


def consumer_row(ctx: Context, consumer_id: int) -> dict:
    with ctx.engine.connect() as conn:
        row = store.find(conn, ctx.lab.name, consumer_id)
    if row is None:
        raise NotFound(f"no consumer {consumer_id} in lab {ctx.lab.name}")
    return row


@operation("start_consumer", path="/consumers", status=201, step="start", cli="start-consumer",
           tags=("consumers",), summary="Start a consumer process in a group")
def start_consumer(ctx: Context, args: StartConsumerArgs) -> dict:
    limits.check_consumers(ctx)
    return run_command(ctx, verbs.CONSUMER_START, args.command())


@operation("get_consumer", method="GET", path="/consumers/<int:consumer_id>", cli="consumer", tags=("consumers",),
           summary="One consumer as it last reported")
def get_consumer(ctx: Context, args: ConsumerRef) -> dict:
    return consumer_row(ctx, args.consumer_id)


def _signal_operation(name: str, verb: str, summary: str) -> Callable[[Context, ConsumerRef], dict]:
    """Declare the operation ``name``: the agent that owns the consumer's process (the one that can
    signal it) runs ``verb`` on it. Its step, CLI command and path end in the verb's action."""
    action = verb.removeprefix("consumer.")

    def act(ctx: Context, args: ConsumerRef) -> dict:
        owner = consumer_row(ctx, args.consumer_id)["agent_id"]
        return run_command(ctx, verb, args.command(), agent_id=owner)
    act.__name__ = name
    return operation(name, path=f"/consumers/<int:consumer_id>/{action}", step=action, cli=action,
                     tags=("consumers",), summary=summary)(act)


# One line each, so that grep finds every one by its name.
kill_consumer = _signal_operation("kill_consumer", verbs.CONSUMER_KILL, "Kill the consumer now (SIGKILL): no offset commit, no group leave")
freeze_consumer = _signal_operation("freeze_consumer", verbs.CONSUMER_FREEZE, "Freeze the consumer (SIGSTOP), like a long GC pause")
thaw_consumer = _signal_operation("thaw_consumer", verbs.CONSUMER_THAW, "Thaw a frozen consumer (SIGCONT): a zombie carries on")
stop_consumer = _signal_operation("stop_consumer", verbs.CONSUMER_STOP, "Stop the consumer gracefully (SIGTERM)")
restart_consumer = _signal_operation("restart_consumer", verbs.CONSUMER_RESTART, "Stop the consumer and start it again under the same name")


@operation("arm", settles=True, path="/consumers/<int:consumer_id>/arm", step="arm", tags=("consumers", "faults"),
           summary="Arm a crash point on a consumer, once or every time (no point: disarm)")
def arm(ctx: Context, args: ArmArgs) -> dict:
    row = consumer_row(ctx, args.consumer_id)
    armed = ({"point": args.point, "action": args.action, "always": args.always} if args.point
             else {"point": None, "action": None, "always": False})
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        store.arm(conn, args.consumer_id, **armed)
        say(conn, "fault", f"{row['name']}: " + (
            f"armed {armed['action']} at {args.point} ({'every time' if armed['always'] else 'once'})"
            if args.point else "disarmed"))
    return {"consumer_id": args.consumer_id, "name": row["name"], "armed": armed}


@operation("set_step_mode", settles=True, path="/consumers/<int:consumer_id>/step-mode", step="step_mode", cli="step-mode",
           tags=("consumers",), summary="Step mode: the consumer stops at every point of each message")
def set_step_mode(ctx: Context, args: StepModeArgs) -> dict:
    row = consumer_row(ctx, args.consumer_id)
    with ctx.engine.begin() as conn:
        store.set_step_mode(conn, args.consumer_id, args.on)
    return {"consumer_id": args.consumer_id, "name": row["name"], "step_mode": args.on}


@operation("step", path="/consumers/<int:consumer_id>/step", step="step", tags=("consumers",),
           summary="Let a consumer in step mode move past the point it waits at")
def step(ctx: Context, args: ConsumerRef) -> dict:
    row = consumer_row(ctx, args.consumer_id)
    if not row["step_mode"]:
        raise InvalidRequest("step_mode", f"consumer {row['name']} is not in step mode")
    with ctx.engine.begin() as conn:
        advance = store.advance_step(conn, args.consumer_id)
    return {"consumer_id": args.consumer_id, "name": row["name"], "step_advance": advance, "was_at": row["step_at"]}

