"""The lost-ack fault proxy: a real Kafka-aware proxy between the lab's producer and the broker
that can drop or delay Produce responses (see webapp/faultproxy.py)."""
from __future__ import annotations

from pydantic import model_validator

from .. import commands
from ..domain.vocabulary import FAULT_PROXY_FRESH_SECONDS, Limits
from ..faultproxy import CHANNEL, DEFAULT_NAME
from ..store import faultproxies as store
from ..store import schema
from ..store.labdata import say
from ..waits import WaitTimeout, wait_until
from .fields import Whole, within
from .registry import Args, Context, InvalidRequest, operation

TAKE_TIMEOUT = 5.0


class NoFaultProxy(commands.NoAgent):
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


class NoArgs(Args):
    pass


@operation("get_fault_proxy", method="GET", path="/fault-proxy", tags=("faults",),
           summary="The fault proxy as it last reported: running, armed (and by which lab), counters")
def get_fault_proxy(ctx: Context, args: NoArgs) -> dict:
    with ctx.engine.connect() as conn:
        row = store.report(conn, DEFAULT_NAME, FAULT_PROXY_FRESH_SECONDS)
    if row is None:
        return {"name": DEFAULT_NAME, "running": False, "armed": False, "armed_by": None,
                "armed_by_this_lab": False, "drop_produce_responses": 0, "delay_ms": 0, "listen": None,
                "upstream": None, "connections": 0, "produce_requests": 0, "responses_dropped": 0,
                "responses_delayed": 0, "heartbeat_age": None}
    armed = bool(row["running"]) and (row["drop_produce_responses"] > 0 or row["delay_ms"] > 0)
    return {"name": row["name"], "running": bool(row["running"]), "armed": armed,
            "armed_by": row["lab"] if armed else None, "armed_by_this_lab": armed and row["lab"] == ctx.lab.name,
            "drop_produce_responses": row["drop_produce_responses"], "delay_ms": row["delay_ms"],
            "listen": row["listen"], "upstream": row["upstream"], "connections": row["connections"],
            "produce_requests": row["produce_requests"], "responses_dropped": row["responses_dropped"],
            "responses_delayed": row["responses_delayed"],
            "heartbeat_age": float(row["heartbeat_age"]) if row["heartbeat_age"] is not None else None}


@operation("arm_fault_proxy", path="/fault-proxy", step="lost_ack", cli="lost-ack", tags=("faults",),
           summary="Arm the lost-ack fault proxy: drop the next N Produce responses and/or delay them "
                   "(both 0 disarms); returns once the proxy took the setting")
def arm_fault_proxy(ctx: Context, args: ArmFaultProxyArgs) -> dict:
    drops, delay = args.drop_produce_responses or 0, args.delay_ms or 0
    with ctx.engine.begin() as conn:
        version = store.arm(conn, DEFAULT_NAME, ctx.lab.name, drops, delay, FAULT_PROXY_FRESH_SECONDS)
        if version is None:
            raise NoFaultProxy("no fault proxy is running: `make run` starts one with the embedded broker; "
                               "with docker compose, the faultproxy service (see README, \"Lost ack\")")
        store.notify(conn, CHANNEL, DEFAULT_NAME)
        parts = ([f"drop the next {drops} Produce response(s)"] if drops else []) + (
            [f"delay Produce responses by {delay} ms"] if delay else [])
        schema.enter(conn, ctx.lab.schema)
        say(conn, "fault", "fault proxy " + ("armed: " + ", ".join(parts) if parts else "disarmed"),
            drop_produce_responses=drops, delay_ms=delay)

    def proxy_took_it() -> bool:
        with ctx.engine.connect() as conn:
            return store.taken(conn, DEFAULT_NAME, version)
    try:
        wait_until(proxy_took_it, timeout=TAKE_TIMEOUT, interval=0.02,
                   message="the fault proxy did not take the new setting")
    except WaitTimeout as error:
        raise NoFaultProxy(f"{error}; is it running?") from None
    return get_fault_proxy(ctx, NoArgs())
