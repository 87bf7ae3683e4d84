"""The explorer's search: run seeded fault schedules on real consumers, shrink the first that fails.

``explore(ctx, target, budget, seed)``:

1. **searching**: schedules generated from ``random.Random(seed)`` (schedule.py), each compiled to a
   scenario and run by the scenario runner against a fresh lab of its own (real consumer processes,
   the real broker and PostgreSQL), dropped after. Each run is judged by the lab's verdict
   (readmodel/verdict.py): a credit applied twice, an effect lost, a set that regressed. The search
   stops at the first run with an anomaly, or when the budget is spent.
2. **shrinking**: ddmin over the failing schedule's episodes (drop chunks, then single episodes),
   then each fault's point moved earlier, then credits made plainer; every candidate is run again
   and kept only if it fails too, until no candidate of the smallest failing schedule fails.
3. **reproducing**: the scenario file handed back (the final schedule, expecting the anomalies and
   balances its run showed) is replayed ``reproduce`` times; the result says how often every
   expectation held again.

``ctx`` is an ``ops.Context``: its engine and config (the app's settings, as the scenario runner
takes them) are what the runs use; its lab is the lab that asked, and no run touches it: every run
gets a fresh lab named ``explore_<random hex>``, dropped after the run.
"""
from __future__ import annotations

import random
import secrets
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from .. import ops, strategies
from ..domain.lab import Lab
from ..domain.waits import WaitTimeout, wait_until
from ..scenarios.loader import loads
from ..scenarios.observe import observe
from ..scenarios.runner import Runner, RunState, broker_kind
from ..store import command_channel
from . import lanes
from . import schedule as schedules
from .schedule import Schedule

# What counts as an anomaly: the verdict's fields a correct consumer keeps at zero.
ANOMALY_FIELDS = ("duplicates_applied", "effects_lost", "sets_regressed")
REPRODUCE_ATTEMPTS = 3
# Shrinking re-runs candidates: at most this many, whatever the search's budget in runs.
MAX_SHRINK_RUNS = 24
DROP_TIMEOUT = 120.0
SETTLE_TIMEOUT = 30.0
PROGRESS_PHASES = ("searching", "shrinking", "reproducing", "done")


class InvalidTarget(ValueError):
    """The target cannot be explored; the message says why."""


@dataclass(frozen=True)
class Target:
    """What to explore: a strategy by name, or a lane (a learner's own consumer)."""
    strategy: str | None = None
    lane: str | None = None


@dataclass(frozen=True)
class Budget:
    """How much to spend searching: runs, minutes, or both (whichever runs out first); and the
    fault kinds its schedules may use (None: every kind, schedule.FAULT_KINDS)."""
    runs: int | None = None
    minutes: float | None = None
    faults: tuple[str, ...] | None = None


@dataclass
class Progress:
    phase: str                   # "searching" | "shrinking" | "reproducing" | "done"
    runs_done: int
    schedule_length: int | None  # steps in the current (candidate) schedule
    anomaly_found: bool


@dataclass
class Exploration:
    found: bool
    cancelled: bool
    runs: int
    seconds: float
    schedule_length: int | None
    original_length: int | None
    reproduced: int
    reproduce_attempts: int
    why: str | None              # the why of the first bad event (the verdict's why)
    tried: str                   # what was tried (runs, fault kinds, seeds)
    scenario_yaml: str | None    # the shrunk schedule as a scenario file in the existing format

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Outcome:
    """One run of one schedule: whether it ran as written, and what the verdict said."""
    ran: bool                    # every step held (else a wait timed out or an operation refused)
    anomalies: dict[str, int]    # ANOMALY_FIELDS that are not zero
    why: str | None
    accounts: dict[str, dict[str, int]]   # accounts whose balance is not the expected one
    reason: str | None = None    # why it did not run as written

    @property
    def failed(self) -> bool:
        return self.ran and bool(self.anomalies)


def _strategy(target: Target):
    if not target.strategy:
        raise InvalidTarget("name a strategy to explore")
    if target.strategy not in strategies.NAMES:
        raise InvalidTarget(f"no strategy {target.strategy!r}: one of {', '.join(strategies.NAMES)}")
    return strategies.get(target.strategy)


def _check_budget(budget: Budget) -> None:
    if budget.runs is None and budget.minutes is None:
        raise InvalidTarget("give a budget: runs, minutes, or both")
    if budget.runs is not None and budget.runs < 1:
        raise InvalidTarget("the budget's runs must be at least 1")
    if budget.minutes is not None and budget.minutes <= 0:
        raise InvalidTarget("the budget's minutes must be more than 0")
    if budget.faults is not None and not budget.faults:
        raise InvalidTarget(f"choose at least one fault kind: {', '.join(schedules.FAULT_KINDS)}")
    if budget.faults and (unknown := schedules.unknown_kinds(budget.faults)):
        raise InvalidTarget(f"no fault kind {', '.join(map(repr, unknown))}: some of "
                            f"{', '.join(schedules.FAULT_KINDS)}")


def _kinds(strategy: str, chosen: tuple[str, ...] | None) -> tuple[str, ...]:
    """The fault kinds to draw from: the ones chosen, or every kind the strategy is judged on."""
    judged = strategy in schedules.SOURCE_DUPLICATE_STRATEGIES
    if chosen is None:
        return tuple(k for k in schedules.FAULT_KINDS if judged or k != "source-duplicate")
    if "source-duplicate" in chosen and not judged:
        raise InvalidTarget(f"source-duplicate cannot be judged against {strategy}: its key is the event id, so the "
                            "same transaction under a new event id is a new event to it, credited again by design "
                            "(exercise 5); only " + " and ".join(schedules.SOURCE_DUPLICATE_STRATEGIES)
                            + " key on the transaction")
    return tuple(dict.fromkeys(chosen))


class Explorer(schedules.Runs):
    """One exploration's state: the runs it made and the schedules' outcomes it remembers."""

    def __init__(self, ctx: ops.Context, strategy, budget: Budget, seed: int, *, reproduce: int,
                 on_progress: Callable[[Progress], None], should_stop: Callable[[], bool]):
        self.ctx = ctx
        super().__init__(budget, should_stop)
        self.strategy = strategy
        self.plan = schedules.plan_of(strategy)
        self.points = strategy.points
        self.kinds = _kinds(strategy.name, budget.faults)
        self.seed = seed
        self.reproduce = reproduce
        self.on_progress = on_progress
        self.broker = broker_kind(ctx.config)[0]

    # --- one run ----------------------------------------------------------------------------

    def length(self, schedule: Schedule) -> int:
        return len(schedules.compile_steps(schedule, self.plan).steps)

    def in_fresh_lab(self, scenario_yaml: str, judge: Callable[[Lab, RunState], Any]) -> Any:
        """Run a scenario file's text in a fresh lab, judge it there, drop the lab."""
        scenario = loads(scenario_yaml, source="<explorer>", name="explore")
        lab = Lab(f"explore_{secrets.token_hex(4)}")
        state = RunState(scenario=scenario.name, lab=lab.name)
        try:
            Runner(self.ctx.engine, scenario, state, broker=self.broker, config=self.ctx.config).run_all()
            return judge(lab, state)
        finally:
            command_channel.run(self.ctx.engine, lab.name, "lab.drop", {}, timeout=DROP_TIMEOUT)

    def run(self, schedule: Schedule) -> Outcome:
        """Run ``schedule`` in a fresh lab and judge it by the verdict; report progress."""
        text = schedules.compile_scenario(schedule, self.strategy.name, self.plan, title="Explorer run",
                                          narrative=schedules.describe(schedule))
        outcome = self.in_fresh_lab(text, self.judge)
        self.runs += 1
        self.not_run_as_written += not outcome.ran
        if not outcome.ran and self.first_unfinished is None:
            self.first_unfinished = outcome.reason
        self.outcomes[schedule] = outcome
        self.found = self.found or outcome.failed
        self.on_progress(Progress(self.phase, self.runs, self.length(schedule), self.found))
        return outcome

    def replay(self, scenario_yaml: str, length: int) -> bool:
        """Run the scenario file handed back, as a learner would: whether every expectation held
        (the same anomalies, the same balances); report progress."""
        passed = self.in_fresh_lab(scenario_yaml, lambda lab, state: state.status == "passed")
        self.runs += 1
        self.on_progress(Progress(self.phase, self.runs, length, self.found))
        return passed

    def judge(self, lab: Lab, state: RunState) -> Outcome:
        steps_held = state.status in ("passed", "failed") and all(s["status"] == "ok" for s in state.steps)
        if not steps_held:
            bad = next((s for s in state.steps if s["status"] != "ok"), None)
            return Outcome(False, {}, None, {}, reason=state.reason or (bad and bad["observed"]))
        # The runner stopped the consumers; the log reader may still be mirroring the last records.
        try:
            snap = wait_until(lambda: _settled(observe(self.ctx.engine, lab)), timeout=SETTLE_TIMEOUT,
                              interval=0.2, message="")
        except WaitTimeout:
            return Outcome(False, {}, None, {}, reason=f"the verdict did not settle within {SETTLE_TIMEOUT:g} s")
        verdict = snap.verdicts.get(None, {})
        anomalies = {name: verdict.get(name, 0) for name in ANOMALY_FIELDS if verdict.get(name)}
        why = next((a.get("why") for a in verdict.get("anomalies", []) if a.get("why")), None)
        accounts = {account: {"actual": line["actual"], "expected": line["expected"]}
                    for account, line in snap.accounts.get(None, {}).items() if line["actual"] != line["expected"]}
        return Outcome(True, anomalies, why, accounts)

    def cached(self, schedule: Schedule) -> Outcome:
        return self.outcomes.get(schedule) or self.run(schedule)

    # --- the phases -------------------------------------------------------------------------

    def search(self) -> Schedule | None:
        rng = random.Random(self.seed)
        while self.budget.runs is None or self.runs < self.budget.runs:
            if self.out_of_time() or self.stop_requested():
                return None
            schedule = schedules.generate(rng, self.points, kinds=self.kinds)
            if self.run(schedule).failed:
                return schedule
        return None

    def shrink(self, failing: Schedule) -> Schedule:
        """The smallest failing schedule reachable from ``failing`` (schedule.shrink), each candidate
        run again on real consumers (a result is remembered), within MAX_SHRINK_RUNS and the budget."""
        self.phase = "shrinking"
        budget_end = self.runs + MAX_SHRINK_RUNS

        def may_go_on() -> bool:
            return self.runs < budget_end and not self.out_of_time() and not self.stop_requested()

        return schedules.shrink(failing, self.points, lambda candidate: self.cached(candidate).failed, may_go_on)

    def reproduce_final(self, scenario_yaml: str, length: int) -> int:
        """How often the scenario file handed back replays to the same verdict, out of ``reproduce`` runs."""
        self.phase = "reproducing"
        passed = 0
        for _ in range(self.reproduce):
            if self.stop_requested():
                break
            passed += self.replay(scenario_yaml, length)
        return passed

    # --- what it says -----------------------------------------------------------------------

    def tried(self) -> str:
        kinds = ", ".join(self.kinds)
        points = ", ".join(self.points)
        stopped = " (cancelled)" if self.cancelled else ""
        unfinished = (f"; {self.not_run_as_written} of them did not run as written, so were not judged "
                      f"(the first: {self.first_unfinished})" if self.not_run_as_written else "")
        return (f"{self.runs} run(s){stopped} of schedules from seed {self.seed} against {self.strategy.name}: "
                f"one or two faults each among {kinds}, at the crash points {points}, with credits to "
                f"{' and '.join(schedules.ACCOUNTS)}{unfinished}")

    def scenario_yaml(self, final: Schedule, outcome: Outcome, original: Schedule, reproduced: int | None,
                      attempts: int) -> str:
        found = ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in outcome.anomalies.items())
        title = f"Explored: {self.strategy.name} — {found}"
        narrative = (
            f"The explorer ran fault schedules generated from seed {self.seed} against a consumer group using "
            f"`{self.strategy.name}`. Run {self.first_failure_run} was the first whose verdict showed an anomaly "
            f"({found}). Its schedule had {len(original)} episode(s) ({self.length(original)} steps); shrinking "
            f"(fewer episodes, earlier crash points, plainer credits, each candidate run again) left "
            f"{len(final)} episode(s): {schedules.describe(final)}."
            + (f" This file, replayed {attempts} time(s), showed the same verdict {reproduced} time(s)."
               if attempts else "") + "\n\n"
            + (f"**Why:** {outcome.why}\n" if outcome.why else ""))
        expect: dict[str, Any] = {"verdict": dict(outcome.anomalies)}
        if outcome.accounts:
            expect["accounts"] = outcome.accounts
        return schedules.compile_scenario(final, self.strategy.name, self.plan, title=title, narrative=narrative,
                                          summary=f"The explorer's shortest schedule that makes {self.strategy.name} "
                                                  f"show {found}.", expect=expect)


def _settled(snap):
    verdict = snap.verdicts.get(None, {})
    return snap if verdict and not verdict.get("pending") and not verdict.get("not_yet_applied") else None


def _explore_lane(ctx: ops.Context, lane: str, budget: Budget, seed: int, on_progress: Callable[[Progress], None],
                  should_stop: Callable[[], bool], reproduce: int) -> Exploration:
    """A lane (a learner's own consumer), explored in ``ctx.lab`` itself by lanes.py."""
    _check_budget(budget)
    try:
        found = lanes.explore(ctx, lane, budget, seed, reproduce=reproduce, max_shrink_runs=MAX_SHRINK_RUNS,
                              on_progress=lambda *fields: on_progress(Progress(*fields)), should_stop=should_stop)
    except lanes.NotExplorable as refused:
        raise InvalidTarget(str(refused)) from None
    return Exploration(**found)


def explore(ctx: ops.Context, target: Target, budget: Budget, seed: int, *,
            on_progress: Callable[[Progress], None] = lambda p: None, should_stop: Callable[[], bool] = lambda: False,
            reproduce: int = REPRODUCE_ATTEMPTS) -> Exploration:
    """Search for a failing fault schedule against ``target`` within ``budget``, shrink it, reproduce it.
    Raises InvalidTarget for a target or budget it cannot explore (the message says why). A lane
    (a learner's own consumer) is explored in ``ctx.lab`` itself, by lanes.py."""
    if target.lane is not None:
        return _explore_lane(ctx, target.lane, budget, seed, on_progress, should_stop, reproduce)
    strategy = _strategy(target)
    _check_budget(budget)
    _kinds(strategy.name, budget.faults)
    explorer = Explorer(ctx, strategy, budget, seed, reproduce=reproduce, on_progress=on_progress,
                        should_stop=should_stop)
    failing = explorer.search()
    if failing is None:
        explorer.phase = "done"
        on_progress(Progress("done", explorer.runs, None, False))
        return Exploration(found=False, cancelled=explorer.cancelled, runs=explorer.runs,
                           seconds=round(time.monotonic() - explorer.started, 1), schedule_length=None,
                           original_length=None, reproduced=0, reproduce_attempts=0, why=None,
                           tried=explorer.tried(), scenario_yaml=None)
    explorer.first_failure_run = explorer.runs
    final = explorer.shrink(failing)
    outcome = explorer.outcomes[final]
    length = explorer.length(final)
    # Reproducing replays the file itself: it says "it failed again" only when the file's own
    # expectations (the anomalies and balances this run saw) held again.
    draft = explorer.scenario_yaml(final, outcome, failing, None, 0)
    reproduced = explorer.reproduce_final(draft, length) if not explorer.cancelled else 0
    attempts = explorer.reproduce if not explorer.cancelled else 0
    on_progress(Progress("done", explorer.runs, length, True))
    return Exploration(found=True, cancelled=explorer.cancelled, runs=explorer.runs,
                       seconds=round(time.monotonic() - explorer.started, 1),
                       schedule_length=length, original_length=explorer.length(failing),
                       reproduced=reproduced, reproduce_attempts=attempts, why=outcome.why,
                       tried=explorer.tried(),
                       scenario_yaml=explorer.scenario_yaml(final, outcome, failing, reproduced, attempts))
