"""The operation registry and every operation of the lab (see registry.py).
May import readmodel, strategies, faultproxy's constants, store and domain; never web, scenarios or agent.

Importing this package declares them all; callers use ``ops.call(name, ctx, body)``."""
from __future__ import annotations

# Importing each module declares its operations (the imports are for that: pyproject.toml's
# per-file-ignores lets them stand unused).
from . import (
    chaos_mode,  # chaos mode
    consumers,
    explorations,  # the explorer: search, shrink, cancel (a background job)
    faults,
    groups,
    lab,
    notifications,  # the external side effect
    outbox,  # the transactional outbox
    outside,  # your consumer: a learner's own code on a lane
    publishing,
    reads,
    scale,  # load generator, dedup table layout
    throughput,  # batch mode, commit mode, static membership
)
from .agent_commands import AgentTimedOut, NoAgent
from .faults import NoFaultProxy
from .registry import (
    OPERATIONS,
    Args,
    Busy,
    Context,
    InvalidRequest,
    NotFound,
    Operation,
    add_hooks,
    by_step,
    call,
    get,
    run,
    validate,
)

__all__ = ["OPERATIONS", "AgentTimedOut", "Args", "Busy", "Context", "InvalidRequest", "NoAgent", "NoFaultProxy", "NotFound", "Operation",
           "add_hooks", "by_step", "call", "get", "run", "validate"]
