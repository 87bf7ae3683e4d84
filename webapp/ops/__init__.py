"""The operation registry and every operation of the lab (see registry.py).
May import readmodel, strategies, faultproxy's constants, store and domain; never web, scenarios or agent.

Importing this package declares them all; callers use ``ops.call(name, ctx, body)``."""
from __future__ import annotations

from . import consumers, faults, groups, lab, publishing, reads  # noqa: F401  (declare the operations)
from . import chaos  # noqa: F401  (chaos mode, issue 15)
from . import notifications  # noqa: F401  (the external side effect, issue 13)
from . import scale  # noqa: F401  (load generator, dedup table layout, issue 14)
from . import throughput  # noqa: F401  (batch mode, commit mode, static membership, issue 14)
from . import outbox  # noqa: F401  (the transactional outbox, issue 13)
from . import outside  # noqa: F401  (your consumer: a learner's own code on a lane, issue 34)
from .agent_commands import AgentTimedOut, NoAgent
from .faults import NoFaultProxy
from .registry import (OPERATIONS, Args, Busy, Context, InvalidRequest, NotFound, Operation, add_hooks, by_step, call,
                       get, run, validate)

__all__ = ["OPERATIONS", "AgentTimedOut", "Args", "Busy", "Context", "InvalidRequest", "NoAgent", "NoFaultProxy", "NotFound", "Operation",
           "add_hooks", "by_step", "call", "get", "run", "validate"]
