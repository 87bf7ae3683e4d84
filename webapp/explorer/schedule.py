"""Fault schedules: what the explorer runs, generated from a seed and compiled to a scenario.

A schedule is a tuple of episodes. An episode is one thing a person could do at the dashboard,
together with the waits its fault needs before the next one may start (a crash is only a crash
once the consumer is seen crashed), so that any sub-sequence of a schedule still compiles to a
scenario that runs: that is what lets the shrinker drop episodes freely.

- ``publish``: one credit to an account;
- ``resend``: the producer sends the newest event again under the same event id (a retry after a
  lost acknowledgement);
- ``crash``: arm the active consumer to die (``os._exit``) at one of the strategy's crash points,
  publish a credit, wait until it has crashed, restart it;
- ``restart``: stop the active consumer gracefully and start it again (a rolling deploy);
- ``freeze-join``: arm the active consumer to freeze (SIGSTOP) at a point, publish a credit, wait
  until it is frozen, start a second member (it is handed the partition once the frozen member's
  session times out), let it take over, thaw the frozen one (a zombie that carries on) and wait for
  its late offset commit to fail. The second member is the active consumer afterwards. A schedule
  holds at most one, as its last fault: the thawed zombie rejoins the group and may take the
  partition back, so a fault armed after it could be armed on a member that never sees a record.
- ``kill``: SIGKILL the active consumer between two records (no offset commit, no group leave: its
  session must expire before the group rebalances), wait until it is seen killed, restart it;
- ``join``: a second member joins the group with nothing frozen: a rebalance, and either member may
  end up with the partition. Like ``freeze-join``, at most one per schedule, as its last fault (a
  schedule holds one of the two at most);
- ``async-commit``: the group commits offsets asynchronously (a group setting, set before the first
  consumer starts, wherever the episode stands): a member killed right after a record may lose a
  commit that was sent and never acknowledged;
- ``source-duplicate``: the source sends the newest transaction again under a new event id (a
  producer that retried at the application level). Only strategies that key on the transaction
  (SOURCE_DUPLICATE_STRATEGIES) claim to absorb it; the verdict counts its second credit as applied
  twice (by the transaction id), so against an event-id strategy every such schedule "fails" by
  design, as exercise 5 shows: the search offers it against those strategies only.

Everything here is pure: no database, no broker. ``compile_scenario`` writes the scenario file's
text in the format of docs/reference/scenario-format.md, which the loader checks and the runner runs.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import yaml

from ..domain.vocabulary import CRASH_POINTS, EXPLORER_FAULT_KINDS, EXPLORER_SOURCE_DUPLICATE_STRATEGIES

GROUP = "payments"
ACCOUNTS = ("acc-1", "acc-2")
AMOUNTS_CENTS = (10000, 2500)
# The kinds of the explorer's first pass come first, in their order: a seed draws the same schedules
# from them as it did then (FIRST_PASS_KINDS), and the kinds added since come after.
FAULT_KINDS = EXPLORER_FAULT_KINDS
FIRST_PASS_KINDS = FAULT_KINDS[:4]
# The strategies whose dedup key is the transaction, not the event id: against them a source
# duplicate applied twice is a bug in what they claim.
SOURCE_DUPLICATE_STRATEGIES = EXPLORER_SOURCE_DUPLICATE_STRATEGIES
# Faults that repeat the newest event: they need one published before them.
REPEAT_KINDS = ("resend", "source-duplicate")
# Episodes that publish a credit of their own.
CREDITING_KINDS = ("publish", "crash", "freeze-join")
# Faults after which the group has two members and either may hold the partition: the schedule's last.
HAND_OVER_KINDS = ("freeze-join", "join")
EPISODE_KINDS = ("publish", *FAULT_KINDS)
# Points where freezing is pointless: the offset is committed, so the next member has nothing to redo.
NOT_FREEZABLE = ("after-commit",)
# Seconds each wait may take. A first assignment takes about 3 s; a frozen member's partition is
# handed over once its session (6 s) expires and the group rebalances.
ASSIGNED_TIMEOUT = 30
FAULT_TIMEOUT = 30
TAKEOVER_TIMEOUT = 45
SETTLED_TIMEOUT = 45


@dataclass(frozen=True)
class Episode:
    kind: str                      # one of EPISODE_KINDS
    point: str | None = None       # crash, freeze-join: where the consumer stops
    account: str = ACCOUNTS[0]     # publish, crash, freeze-join: the credit's account
    cents: int = AMOUNTS_CENTS[0]

    def describe(self) -> str:
        credit = f"a credit of {self.cents / 100:.2f} to {self.account}"
        return {"publish": f"publish {credit}",
                "resend": "resend the newest event (same event id)",
                "crash": f"crash at {self.point} on {credit}",
                "restart": "restart the active consumer gracefully",
                "freeze-join": f"freeze at {self.point} on {credit}, a second member takes over, thaw the zombie",
                "kill": "kill the active consumer (SIGKILL) between records, then restart it",
                "join": "a second member joins the group (a rebalance)",
                "async-commit": "the group commits offsets asynchronously",
                "source-duplicate": "the source sends the newest transaction again (new event id)",
                }[self.kind]


Schedule = tuple[Episode, ...]


def describe(schedule: Schedule) -> str:
    return "; ".join(episode.describe() for episode in schedule) or "nothing"


# --- generation -------------------------------------------------------------------------------

def freezable(points: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in points if p not in NOT_FREEZABLE)


def unknown_kinds(kinds: tuple[str, ...]) -> list[str]:
    return [kind for kind in kinds if kind not in FAULT_KINDS]


def generate(rng: random.Random, points: tuple[str, ...], max_faults: int = 2,
             kinds: tuple[str, ...] = FAULT_KINDS) -> Schedule:
    """One random schedule of faults among ``kinds``: one or two faults, each maybe after a credit
    of its own; at most one freeze-join or join, always the last fault; a resend only after
    something was published."""
    faults = [rng.choice(kinds) for _ in range(rng.randint(1, max_faults))]
    hand_over = next((k for k in faults if k in HAND_OVER_KINDS), None)
    if hand_over is not None:
        faults = [k for k in faults if k not in HAND_OVER_KINDS] + [hand_over]
    episodes: list[Episode] = []
    for kind in faults:
        published = any(e.kind in CREDITING_KINDS for e in episodes)
        if rng.random() < 0.5 or (kind in REPEAT_KINDS and not published):
            episodes.append(Episode("publish", account=rng.choice(ACCOUNTS), cents=rng.choice(AMOUNTS_CENTS)))
        point = None
        if kind == "crash":
            point = rng.choice(points)
        elif kind == "freeze-join":
            point = rng.choice(freezable(points))
        episodes.append(Episode(kind, point=point, account=rng.choice(ACCOUNTS), cents=rng.choice(AMOUNTS_CENTS)))
    return tuple(episodes)


# --- shrinking candidates (ddmin-style) -------------------------------------------------------

def without_chunks(schedule: Schedule, chunks: int) -> list[Schedule]:
    """The schedule with each of ``chunks`` consecutive pieces removed in turn (ddmin's complements)."""
    n = len(schedule)
    if chunks > n or n <= 1:
        return []
    size = n / chunks
    bounds = [(round(i * size), round((i + 1) * size)) for i in range(chunks)]
    return [schedule[:lo] + schedule[hi:] for lo, hi in bounds if hi > lo]


def earlier_points(schedule: Schedule, points: tuple[str, ...]) -> list[Schedule]:
    """The schedule with one fault's point moved one crash point earlier, for each fault that can move."""
    candidates = []
    for i, episode in enumerate(schedule):
        allowed = points if episode.kind == "crash" else freezable(points) if episode.kind == "freeze-join" else ()
        if episode.point in allowed and allowed.index(episode.point) > 0:
            earlier = allowed[allowed.index(episode.point) - 1]
            candidates.append(schedule[:i] + (replace(episode, point=earlier),) + schedule[i + 1:])
    return candidates


def simpler_credits(schedule: Schedule) -> list[Schedule]:
    """The schedule with one credit moved to the first account and amount (fewer things to read)."""
    plain = Episode("publish")
    candidates = []
    for i, episode in enumerate(schedule):
        if episode.kind not in REPEAT_KINDS and (episode.account, episode.cents) != (plain.account, plain.cents):
            candidates.append(schedule[:i] + (replace(episode, account=plain.account, cents=plain.cents),)
                              + schedule[i + 1:])
    return candidates


def shrink(failing: Schedule, points: tuple[str, ...], fails: Callable[[Schedule], bool],
           may_go_on: Callable[[], bool] = lambda: True) -> Schedule:
    """The smallest schedule reachable from ``failing`` for which ``fails`` holds: ddmin over its
    episodes (remove halves, then quarters, ... then single episodes; after a removal that still
    fails, go on from the smaller schedule with coarser chunks again), and, once at single episodes,
    each fault's point moved earlier and each credit made plainer. Ends when no candidate of the
    current schedule fails, or when ``may_go_on`` says stop (then the smallest failing one so far)."""
    current = failing
    chunks = 2
    while True:
        candidates = without_chunks(current, chunks)
        if chunks >= len(current):
            candidates += earlier_points(current, points) + simpler_credits(current)
        smaller = None
        for candidate in candidates:
            if not may_go_on():
                return current
            if candidate and fails(candidate):
                smaller = candidate
                break
        if smaller is not None:
            if len(smaller) < len(current):
                chunks = max(chunks - 1, 2)
            current = smaller
        elif chunks < len(current):
            chunks = min(chunks * 2, len(current))
        else:
            return current


# --- compilation ------------------------------------------------------------------------------

def holds_row_locks(plan: tuple[tuple[str, str], ...], point: str) -> bool:
    """Whether a consumer stopped at ``point`` holds an open transaction that has written: then a
    second member's write of the same row waits on it until the frozen one is thawed. ``plan`` is
    the strategy's (kind, text) steps in the order it runs them (strategies.base.Strategy.plan)."""
    open_, wrote = False, False
    for kind, text in plan:
        if kind == "begin":
            open_, wrote = True, False
        elif kind == "commit":
            open_, wrote = False, False
        elif kind == "sql" and open_ and not text.lstrip().upper().startswith("SELECT"):
            wrote = True
        elif kind == "point" and text == point:
            return open_ and wrote
    return False


@dataclass
class Compiled:
    steps: list[dict[str, Any]]
    consumers: list[str]


def compile_steps(schedule: Schedule, plan: tuple[tuple[str, str], ...],
                  settled_verdict: dict[str, int] | None = None) -> Compiled:
    """The scenario steps of a schedule: a first consumer, the episodes, and a final wait until the
    group has committed past every record, each record was consumed and the verdict shows
    ``settled_verdict`` (the anomalies a replay waits for: the log reader mirrors the last records
    a moment after the consumer's commit)."""
    active = "c1"
    consumers = [active]
    steps: list[dict[str, Any]] = []
    if any(episode.kind == "async-commit" for episode in schedule):
        steps.append({"throughput": {"group": GROUP, "commit_mode": "async"},
                      "note": "Asynchronous offset commits for the group: a member sends each commit and goes on "
                              "without waiting for the broker's answer."})
    steps += [
        {"start": {"consumer": active, "group": GROUP},
         "note": f"Start one consumer in group `{GROUP}`. Its first assignment takes about 3 seconds."},
        {"wait": {"consumer": active, "state": "running", "assigned": True, "timeout": ASSIGNED_TIMEOUT}},
    ]
    for position, episode in enumerate(schedule):
        last = position == len(schedule) - 1
        credit = {"publish": {"account": episode.account, "amount": f"{episode.cents / 100:.2f}"}}
        if episode.kind == "publish":
            steps.append({**credit, "note": f"Publish a credit of R$ {episode.cents / 100:.2f} to {episode.account}."})
        elif episode.kind == "resend":
            steps.append({"publish": {"mode": "resend"},
                          "note": "The producer sends the newest event again, under the same event id: what a "
                                  "retry after a lost acknowledgement writes. Each copy is a record of its own."})
        elif episode.kind == "crash":
            steps += [
                {"arm": {"consumer": active, "point": episode.point, "action": "crash"},
                 "note": f"Arm a crash at {episode.point}: the process dies there (os._exit), no offset commit, "
                         "no leave."},
                {**credit, "note": f"Publish a credit of R$ {episode.cents / 100:.2f} to {episode.account}."},
                {"wait": {"consumer": active, "state": "crashed", "timeout": FAULT_TIMEOUT}},
                {"restart": active,
                 "note": "Restart it: it rejoins the group and resumes from the partition's committed offset (with "
                         "none committed, where auto.offset.reset=earliest says: the beginning of the log)."},
            ]
            if not last:
                steps.append({"wait": {"consumer": active, "state": "running", "assigned": True,
                                       "timeout": ASSIGNED_TIMEOUT}})
        elif episode.kind == "restart":
            steps.append({"restart": active, "note": "Stop the consumer gracefully and start it again."})
            if not last:
                steps.append({"wait": {"consumer": active, "state": "running", "assigned": True,
                                       "timeout": ASSIGNED_TIMEOUT}})
        elif episode.kind == "source-duplicate":
            steps.append({"publish": {"mode": "source-duplicate"},
                          "note": "The source sends the newest transaction again under a new event id: a new "
                                  "event to an event-id key, the same transaction to a business key."})
        elif episode.kind == "kill":
            steps += [
                {"kill": active, "note": "SIGKILL, between records: no offset commit past what it sent, no group "
                                         "leave."},
                {"wait": {"consumer": active, "state": "killed", "timeout": FAULT_TIMEOUT}},
                {"restart": active, "note": "Restart it: it rejoins once the group has removed the killed member "
                                            "(its session expires) and resumes from the committed offset."},
            ]
            if not last:
                steps.append({"wait": {"consumer": active, "state": "running", "assigned": True,
                                       "timeout": ASSIGNED_TIMEOUT}})
        elif episode.kind == "join":
            successor = f"c{len(consumers) + 1}"
            consumers.append(successor)
            steps += [
                {"start": {"consumer": successor, "group": GROUP},
                 "note": "A second member joins: the group rebalances, and one of the two holds the partition."},
                {"wait": {"consumer": successor, "state": "running", "timeout": TAKEOVER_TIMEOUT}},
            ]
            active = successor
        elif episode.kind == "freeze-join":
            successor = f"c{len(consumers) + 1}"
            consumers.append(successor)
            locks = holds_row_locks(plan, episode.point)
            takeover = ({"wait": {"consumer": successor, "state": "running", "assigned": True,
                                  "timeout": TAKEOVER_TIMEOUT},
                         "note": "It is handed the partition; the frozen member's open transaction holds the rows "
                                 "it wrote, so the successor's write of the same rows waits for it."}
                        if locks else
                        {"wait": {"caught_up": GROUP, "timeout": TAKEOVER_TIMEOUT},
                         "note": "It is handed the partition, receives the uncommitted record again, processes it "
                                 "and commits the offset."})
            steps += [
                {"arm": {"consumer": active, "point": episode.point, "action": "freeze"},
                 "note": f"Arm a freeze at {episode.point}: SIGSTOP there, like a long GC pause; a frozen "
                         "process sends no heartbeats."},
                {**credit, "note": f"Publish a credit of R$ {episode.cents / 100:.2f} to {episode.account}."},
                {"wait": {"consumer": active, "state": "frozen", "timeout": FAULT_TIMEOUT}},
                {"start": {"consumer": successor, "group": GROUP},
                 "note": "A second member joins; it gets the partition once the frozen member, which sends no "
                         "heartbeats, is removed from the group when its session (6 s) expires."},
                takeover,
                {"thaw": active, "note": "SIGCONT: the zombie carries on from where it stopped."},
                {"wait": {"consumer": active, "commit_failures": ">= 1", "timeout": FAULT_TIMEOUT},
                 "note": "Its late offset commit fails: its generation is gone."},
            ]
            active = successor
    verdict = {"not_yet_applied": 0, **(settled_verdict or {})}
    steps.append({"wait": {"all": [{"caught_up": GROUP}, {"verdict": verdict}], "timeout": SETTLED_TIMEOUT},
                  "note": "Every record consumed and the group's offset committed past it"
                          + (": the verdict shows " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in
                                                                settled_verdict.items()) if settled_verdict else "")
                          + "."})
    return Compiled(steps, consumers)


def compile_scenario(schedule: Schedule, strategy: str, plan: tuple[tuple[str, str], ...], *, title: str,
                     narrative: str, summary: str = "", expect: dict[str, Any] | None = None) -> str:
    """The scenario file's text (YAML) for ``schedule`` against one group using ``strategy``.
    Without ``expect``, it expects only that every record was consumed (an exploring run judges
    the verdict itself)."""
    compiled = compile_steps(schedule, plan, (expect or {}).get("verdict"))
    document: dict[str, Any] = {"title": title}
    if summary:
        document["summary"] = summary
    document["narrative"] = narrative
    document["setup"] = {"partitions": 1, "groups": {GROUP: {"strategy": strategy}}}
    document["steps"] = compiled.steps
    document["expect"] = expect or {"verdict": {"not_yet_applied": 0}}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


def plan_of(strategy) -> tuple[tuple[str, str], ...]:
    """A strategy's plan as (kind, text) pairs: what compilation reads of it."""
    return tuple((step.kind, step.text) for step in strategy.plan)


def points_in_order(points: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(p for p in CRASH_POINTS if p in points)


class Runs:
    """What one exploration keeps while it runs, whatever it explores: the budget, how many runs it
    made, the phase, the outcomes of the schedules it ran, and whether it was asked to stop."""

    def __init__(self, budget, should_stop: Callable[[], bool]):
        self.budget = budget  # anything with ``minutes`` (None: no limit in time)
        self.should_stop = should_stop
        self.started = time.monotonic()
        self.runs = 0
        self.not_run_as_written = 0
        self.first_unfinished: str | None = None  # why the first run that did not run as written did not
        self.first_failure_run: int | None = None
        self.phase = "searching"
        self.found = False
        self.cancelled = False
        self.outcomes: dict[Schedule, Any] = {}

    def out_of_time(self) -> bool:
        return self.budget.minutes is not None and time.monotonic() - self.started >= self.budget.minutes * 60

    def stop_requested(self) -> bool:
        if not self.cancelled and self.should_stop():
            self.cancelled = True
        return self.cancelled
