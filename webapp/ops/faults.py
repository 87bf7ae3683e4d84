"""The fault proxy: a real Kafka-aware proxy between the lab's Kafka clients and the broker that
can drop or delay Produce responses (lost ack) and keep one consumer's offset commits from the
broker (commit mode) (see webapp/faultproxy/faults.py). Every operation here reads and changes the
calling lab's faults only, and those act only on that lab's clients (by their Kafka client ids)."""
from __future__ import annotations

from pydantic import Field, model_validator

from ..domain.vocabulary import FAULT_PROXY_FRESH_SECONDS, Limits
from ..domain.waits import WaitTimeout, wait_until
from ..faultproxy.control import CHANNEL, DEFAULT_NAME
from ..store import command_channel, schema
from ..store import faultproxies as store
from ..store.labdata import say
from .consumers import ConsumerRef, consumer_row
from .fields import Whole, within
from .registry import Args, Context, InvalidRequest, NoArgs, operation

TAKE_TIMEOUT = 5.0


class NoFaultProxy(command_channel.NoAgent):
    """No fault proxy process answers: nothing would inject the fault."""


class ArmFaultProxyArgs(Args):
    drop_produce_responses: Whole = within(Limits.DROPPED_RESPONSES, "drop the next N Produce responses "
                                           "(the broker writes, the ack is lost)")
    delay_ms: Whole = within(Limits.RESPONSE_DELAY_MS, "hold every Produce response this long", unit=" ms")

    @model_validator(mode="after")
    def _something_to_do(self) -> "ArmFaultProxyArgs":
        if self.drop_produce_responses is None and self.delay_ms is None:
            raise InvalidRequest("drop_produce_responses", "give drop_produce_responses and/or delay_ms "
                                 "(both 0 disarms)")
        return self


class BlockCommitsArgs(ConsumerRef):
    blocked: bool = Field(True, description="true: the consumer's offset commits stop reaching the broker; "
                          "false: they get through again")
    seconds: Whole = within(Limits.BLOCKED_COMMITS_SECONDS, "how long the block lasts, at most", default=60,
                            unit=" s")


NO_PROXY_RUNNING = ("no fault proxy is running: `make run` starts one with the embedded broker; "
                    "with docker compose, the faultproxy service (see the docs: /docs/concepts/lost-ack/)")


@operation("get_fault_proxy", method="GET", path="/fault-proxy", tags=("faults",),
           summary="The fault proxy as it last reported (running, where) and this lab's own faults and "
                   "counters: every lab's faults act on its own Kafka clients only, and no lab sees another's")
def get_fault_proxy(ctx: Context, args: NoArgs) -> dict:
    with ctx.engine.connect() as conn:
        row = store.report(conn, DEFAULT_NAME, ctx.lab.name, FAULT_PROXY_FRESH_SECONDS)
        ours = store.blocked_commits_of(conn, DEFAULT_NAME, ctx.lab.name, ctx.lab.client_id("")) \
            if row is not None else {}
    if row is None:
        return {"name": DEFAULT_NAME, "running": False, "armed": False, "armed_by": None,
                "armed_by_this_lab": False, "drop_produce_responses": 0, "delay_ms": 0, "listen": None,
                "upstream": None, "connections": 0, "produce_requests": 0, "responses_dropped": 0,
                "responses_delayed": 0, "commits_blocked_of": {}, "commits_blocked": 0, "connections_cut": 0,
                "heartbeat_age": None}
    # Everything below is this lab's: its faults, and what the proxy did to its clients.
    armed = bool(row["running"]) and (row["drop_produce_responses"] > 0 or row["delay_ms"] > 0 or bool(ours))
    return {"name": row["name"], "running": bool(row["running"]), "armed": armed,
            "armed_by": ctx.lab.name if armed else None, "armed_by_this_lab": armed,
            "drop_produce_responses": row["drop_produce_responses"], "delay_ms": row["delay_ms"],
            "listen": row["listen"], "upstream": row["upstream"], "connections": row["connections"],
            "produce_requests": row["produce_requests"], "responses_dropped": row["responses_dropped"],
            "responses_delayed": row["responses_delayed"],
            "commits_blocked_of": {name: round(left, 1) for name, left in ours.items()},
            "commits_blocked": row["commits_blocked"], "connections_cut": row["connections_cut"],
            "heartbeat_age": float(row["heartbeat_age"]) if row["heartbeat_age"] is not None else None}


@operation("arm_fault_proxy", path="/fault-proxy", step="lost_ack", cli="lost-ack", tags=("faults",),
           summary="Arm the lost-ack fault proxy on this lab's producer: drop its next N Produce responses "
                   "and/or delay them (both 0 disarms); other labs' clients are untouched; returns once the "
                   "proxy took the setting")
def arm_fault_proxy(ctx: Context, args: ArmFaultProxyArgs) -> dict:
    drops, delay = args.drop_produce_responses or 0, args.delay_ms or 0
    with ctx.engine.begin() as conn:
        version = store.arm(conn, DEFAULT_NAME, ctx.lab.name, drops, delay, FAULT_PROXY_FRESH_SECONDS)
        if version is None:
            raise NoFaultProxy(NO_PROXY_RUNNING)
        store.notify(conn, CHANNEL, DEFAULT_NAME)
        parts = ([f"drop the next {drops} Produce response(s)"] if drops else []) + (
            [f"delay Produce responses by {delay} ms"] if delay else [])
        schema.enter(conn, ctx.lab.schema)
        say(conn, "fault", "fault proxy " + ("armed: " + ", ".join(parts) if parts else "disarmed"),
            drop_produce_responses=drops, delay_ms=delay)
    _wait_taken(ctx, version)
    return get_fault_proxy(ctx, NoArgs())


@operation("block_commits", path="/consumers/<int:consumer_id>/commits-blocked", step="block_commits",
           cli="block-commits", tags=("faults",),
           summary="Keep one consumer's offset commits from the broker: the fault proxy closes any connection of "
                   "it that carries an OffsetCommit, before the broker sees it (fetches flow); blocked false lets "
                   "them through again; returns once the proxy took the setting")
def block_commits(ctx: Context, args: BlockCommitsArgs) -> dict:
    name = consumer_row(ctx, args.consumer_id)["name"]  # an unknown id is a 404
    client = ctx.lab.client_id(name)
    _set_commit_block(ctx, client, args.seconds if args.blocked else None)
    if args.blocked:
        with ctx.engine.connect() as conn:
            passes_the_proxy = client in store.blocked_seen(conn, DEFAULT_NAME, ctx.lab.name)
        if not passes_the_proxy:
            # Nothing would keep its commits from the broker: undo, and say why instead of pretending.
            _set_commit_block(ctx, client, None)
            raise InvalidRequest("consumer_id", f"{name} has no connection through the fault proxy: it is not "
                                 "running, or its connections go straight to the broker (with docker compose only "
                                 "the producer's pass the proxy), so nothing would keep its commits from the broker")
    with ctx.engine.begin() as conn:
        schema.enter(conn, ctx.lab.schema)
        if args.blocked:
            say(conn, "fault", f"fault proxy blocks {name}'s offset commits for {args.seconds} s: they no longer "
                f"reach the broker (its fetches still do)", consumer=name, seconds=args.seconds)
        else:
            say(conn, "fault", f"fault proxy lets {name}'s offset commits through again", consumer=name)
    return get_fault_proxy(ctx, NoArgs())


def _set_commit_block(ctx: Context, client: str, seconds: int | None) -> None:
    """Block ``client``'s offset commits for ``seconds`` (None: unblock); return once the proxy took it."""
    with ctx.engine.begin() as conn:
        version = store.block_commits(conn, DEFAULT_NAME, ctx.lab.name, client, seconds, FAULT_PROXY_FRESH_SECONDS)
        if version is None:
            raise NoFaultProxy(NO_PROXY_RUNNING)
        store.notify(conn, CHANNEL, DEFAULT_NAME)
    _wait_taken(ctx, version)


def _wait_taken(ctx: Context, version: int) -> None:
    """Return once the proxy acknowledged setting ``version``: from then on, the fault is in place."""
    def proxy_took_it() -> bool:
        with ctx.engine.connect() as conn:
            return store.taken(conn, DEFAULT_NAME, version)
    try:
        wait_until(proxy_took_it, timeout=TAKE_TIMEOUT, interval=0.02,
                   message="the fault proxy did not take the new setting")
    except WaitTimeout as error:
        raise NoFaultProxy(f"{error}; is it running?") from None
