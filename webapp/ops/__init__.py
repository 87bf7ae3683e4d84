"""The operation registry and every operation of the lab (see registry.py).

Importing this package declares them all; callers use ``ops.call(name, ctx, body)``."""
from __future__ import annotations

from . import consumers, faults, groups, lab, publishing, reads  # noqa: F401  (declare the operations)
from .agent_commands import NoAgent
from .faults import NoFaultProxy
from .registry import (OPERATIONS, Args, Context, InvalidRequest, NotFound, Operation, add_hooks, by_step, call,
                       get, run, validate)

__all__ = ["OPERATIONS", "Args", "Context", "InvalidRequest", "NoAgent", "NoFaultProxy", "NotFound", "Operation",
           "add_hooks", "by_step", "call", "get", "run", "validate"]
