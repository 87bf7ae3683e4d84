"""Chaos mode's plan: which action, on which consumer, after how long, as a pure function of the
session's seed and the group's members at each step.

A chaos session draws three numbers per action from ``random.Random(seed)``, always three, in the
same order: the wait before it, the action, the target. The target is the draw mapped onto the
group's members sorted by name, so the same seed on a group with the same members gives the same
sequence, and a session exported with its seed replays the same chaos. Nothing here touches a
process or a database (the agent carries the plan out: webapp/agent/chaos_runner.py).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Sequence

KILL = "kill"                      # SIGKILL; started again after the session's down time
FREEZE = "freeze"                  # SIGSTOP; thawed (SIGCONT) after the down time: a zombie
RESTART = "restart"                # graceful stop, then start
TERMINATE_SESSIONS = "terminate-sessions"  # pg_terminate_backend on the consumer's effects session
CUT_CONNECTIONS = "cut-connections"        # the fault proxy drops the consumer's and producer's connections
ACTIONS = (KILL, FREEZE, RESTART, TERMINATE_SESSIONS, CUT_CONNECTIONS)
DEFAULT_ACTIONS = (KILL, FREEZE, RESTART)
# The wait before each action is the session's mean interval times a factor from this range.
JITTER = (0.5, 1.5)


@dataclass(frozen=True)
class ChaosAction:
    index: int            # 1, 2, ... within the session
    wait_seconds: float   # after the previous action (or the session's start)
    action: str
    target: str | None    # the consumer's name; None when the group had no member to act on


class ChaosPlan:
    """The session's random stream; ``next(members)`` is the next action."""

    def __init__(self, seed: int, actions: Sequence[str], every_seconds: float):
        unknown = [action for action in actions if action not in ACTIONS]
        if unknown or not actions:
            raise ValueError(f"actions must be some of {', '.join(ACTIONS)}; got {list(actions)}")
        if every_seconds <= 0:
            raise ValueError("every_seconds must be above 0")
        self.seed = seed
        self.actions = tuple(actions)
        self.every_seconds = every_seconds
        self._random = random.Random(seed)
        self._index = 0

    def next(self, members: Iterable[str]) -> ChaosAction:
        wait = self.every_seconds * self._random.uniform(*JITTER)
        action = self.actions[int(self._random.random() * len(self.actions))]
        pick = self._random.random()
        names = sorted(members)
        self._index += 1
        return ChaosAction(self._index, round(wait, 3), action, names[int(pick * len(names))] if names else None)


def plan(seed: int, members: Iterable[str], actions: Sequence[str], every_seconds: float,
         count: int) -> list[ChaosAction]:
    """The first ``count`` actions of a session on a group whose members stay ``members``."""
    names = sorted(members)
    stream = ChaosPlan(seed, actions, every_seconds)
    return [stream.next(names) for _ in range(count)]
