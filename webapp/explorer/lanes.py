"""Exploring a lane: fault schedules against a learner's own consumer, in the learner's own lab.

The lab does not run the learner's process, so it cannot crash, freeze or restart it, and it has
no crash points inside it. The faults it can apply are the ones outside that process:

- ``resend``: the producer sends the newest event again under the same event id;
- ``source-duplicate``: the same business transaction again under a new event id;
- ``commits-blocked``: the fault proxy keeps the consumer's offset commits from the broker (its
  fetches flow) while a credit arrives and is applied; they stay blocked until the schedule's end
  (a later fault that makes the consumer lose its assignment then has it resume from the old
  committed offset);
- ``connections-cut``: the fault proxy closes the consumer's broker connections (it reconnects);
- ``sessions-terminated``: ``pg_terminate_backend`` of the lane role's sessions (an open
  transaction rolls back).

A member joining the lane's group is not among them: the lab's own consumers may not join a
learner's group (ops refuse it), so the lab has no member to send there.

**A known state per run, without wiping the learner's data.** The lane's tables are the learner's:
nothing here resets them. Before each run the lane must be settled (every record applied by the
consumer and its offset committed, waited for); the verdict's counts are read then, and the run is
judged by what it adds to them: a duplicate applied or an effect lost during the run is one its
events caused. The credits a run publishes are real credits in the lab's topic (every group of
the lab sees them) and in the lane's balances.

The search, the shrinking (schedule.shrink, the same ddmin) and the reproducing follow search.py;
the scenario handed back replays the shortest schedule in the existing format (its setup resets
the lab and makes the lane, as exercise 19 does: the learner runs it on purpose).
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from .. import ops
from ..domain.lab import Lab
from ..domain.vocabulary import OUTSIDE_STRATEGY
from ..domain.waits import WaitTimeout, wait_until
from ..scenarios.loader import loads
from ..scenarios.observe import observe
from ..scenarios.runner import Runner, RunState, broker_kind
from . import schedule as schedules
from .schedule import Episode, Schedule

# What counts as an anomaly: the verdict's fields a correct consumer keeps at zero (as search.py judges).
ANOMALY_FIELDS = ("duplicates_applied", "effects_lost", "sets_regressed")
LANE_FAULTS = ("resend", "source-duplicate", "commits-blocked", "connections-cut", "sessions-terminated")
# Needs a credit published before it in the schedule (it repeats the newest event).
REPEATS = ("resend", "source-duplicate")
COMMIT_BLOCK_SECONDS = 120
# A learner's consumer polls in its own rhythm: a record is applied within seconds, a cut
# connection is reopened within seconds, a group may rebalance (session timeouts of 10-45 s).
APPLIED_TIMEOUT = 60
SETTLED_TIMEOUT = 90
READY_TIMEOUT = 60


class NotExplorable(ValueError):
    """The lane cannot be explored now; the message says why (and what to start or create)."""


@dataclass
class Outcome:
    """One run of one schedule on the lane: whether it ran as written, what it added to the verdict."""
    ran: bool
    anomalies: dict[str, int]    # ANOMALY_FIELDS the run added to
    why: str | None
    reason: str | None = None    # why it did not run as written

    @property
    def failed(self) -> bool:
        return self.ran and bool(self.anomalies)


# on_progress(phase, runs done, the current schedule's steps, an anomaly found): search.Progress's fields.
OnProgress = Callable[[str, int, "int | None", bool], None]


def describe(episode: Episode) -> str:
    credit = f"a credit of {episode.cents / 100:.2f} to {episode.account}"
    return {"publish": f"publish {credit}",
            "resend": "resend the newest event (same event id)",
            "source-duplicate": "the newest transaction again from the source (same transaction id, new event id)",
            "commits-blocked": f"offset commits kept from the broker while {credit} is applied",
            "connections-cut": "broker connections cut",
            "sessions-terminated": "database sessions terminated",
            }[episode.kind]


def describe_schedule(schedule: Schedule) -> str:
    return "; ".join(describe(episode) for episode in schedule) or "nothing"


def generate(rng: random.Random, max_faults: int = 2) -> Schedule:
    """One random schedule: one or two faults, each maybe after a credit of its own; a repeat of
    an event only after something was published."""
    episodes: list[Episode] = []
    for _ in range(rng.randint(1, max_faults)):
        kind = rng.choice(LANE_FAULTS)
        if rng.random() < 0.5 or (kind in REPEATS and not any(e.kind == "publish" for e in episodes)):
            episodes.append(Episode("publish", account=rng.choice(schedules.ACCOUNTS),
                                    cents=rng.choice(schedules.AMOUNTS_CENTS)))
        episodes.append(Episode(kind, account=rng.choice(schedules.ACCOUNTS), cents=rng.choice(schedules.AMOUNTS_CENTS)))
    return tuple(episodes)


def settled(lane: str, timeout: int = SETTLED_TIMEOUT) -> dict[str, Any]:
    return {"wait": {"all": [{"caught_up": lane}, {"verdict": {"not_yet_applied": 0}, "lane": lane}],
                     "timeout": timeout}}


def compile_steps(schedule: Schedule, lane: str, settled_verdict: dict[str, int] | None = None) -> list[dict]:
    """The scenario steps of a schedule against ``lane``: the episodes, then commits let through
    (when blocked) and a wait until the consumer applied and committed every record (and, for a
    replay, until the lane's verdict shows ``settled_verdict``)."""
    steps: list[dict[str, Any]] = []
    blocked = False
    for episode in schedule:
        amount = f"{episode.cents / 100:.2f}"
        credit = {"publish": {"account": episode.account, "amount": amount},
                  "note": f"Publish a credit of R$ {amount} to {episode.account}."}
        if episode.kind == "publish":
            steps.append(credit)
        elif episode.kind == "resend":
            steps.append({"publish": {"mode": "resend"},
                          "note": "The newest event again, same event id: what a producer's retry after a lost "
                                  "acknowledgement writes. Each copy is a record of its own."})
        elif episode.kind == "source-duplicate":
            steps.append({"publish": {"mode": "source-duplicate"},
                          "note": "The newest transaction again from the source: same transaction id, a new "
                                  "event id."})
        elif episode.kind == "commits-blocked":
            blocked = True
            steps += [
                {"block_yours_commits": {"lane": lane, "seconds": COMMIT_BLOCK_SECONDS},
                 "note": "Your consumer's offset commits stop reaching the broker; its fetches go on."},
                credit,
                {"wait": {"verdict": {"not_yet_applied": 0}, "lane": lane, "timeout": APPLIED_TIMEOUT},
                 "note": "Applied, but its offset is not committed at the broker."},
            ]
        elif episode.kind == "connections-cut":
            steps.append({"cut_yours": {"lane": lane},
                          "note": "Its broker connections closed; it reconnects and fetches from its position, "
                                  "or from the committed offset if the group has moved on."})
        elif episode.kind == "sessions-terminated":
            steps.append({"terminate_yours": {"lane": lane},
                          "note": "Its database sessions ended; an open transaction rolled back."})
        else:
            raise ValueError(f"not a lane episode: {episode.kind}")
    if blocked:
        steps.append({"block_yours_commits": {"lane": lane, "blocked": False},
                      "note": "Its commits reach the broker again."})
    final = settled(lane)
    if settled_verdict:
        final["wait"]["all"][1]["verdict"].update(settled_verdict)
    steps.append({**final, "note": "Every record applied by your consumer and its offset committed."})
    return steps


def compile_scenario(schedule: Schedule, lane: str, *, title: str, narrative: str, summary: str = "",
                     expect_verdict: dict[str, int] | None = None) -> str:
    """The scenario file's text for ``schedule`` against the learner's consumer on ``lane``."""
    document: dict[str, Any] = {"title": title}
    if summary:
        document["summary"] = summary
    document["narrative"] = narrative
    document["setup"] = {"partitions": 1, "groups": {lane: {"strategy": OUTSIDE_STRATEGY, "lane": lane}}}
    steps = compile_steps(schedule, lane, expect_verdict)
    if expect_verdict is not None:
        # The setup re-created the lane: the learner starts their consumer while the first step waits.
        steps.insert(0, {**settled(lane, 120), "note": "Start your consumer now if it is not running."})
    document["steps"] = steps
    document["expect"] = {"lanes": {lane: {"verdict": {"not_yet_applied": 0, **(expect_verdict or {})}}}}
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=100)


class LaneExplorer(schedules.Runs):
    """One exploration of a lane in the lab that asked: its runs and the schedules' outcomes."""

    def __init__(self, ctx: ops.Context, lane: str, budget, seed: int, *, reproduce: int, max_shrink_runs: int,
                 on_progress: OnProgress, should_stop: Callable[[], bool]):
        self.ctx = ctx
        self.lab: Lab = ctx.lab
        super().__init__(budget, should_stop)
        self.lane = lane
        self.seed = seed
        self.reproduce = reproduce
        self.max_shrink_runs = max_shrink_runs
        self.on_progress = on_progress
        self.broker = broker_kind(ctx.config)[0]

    def length(self, schedule: Schedule) -> int:
        return len(compile_steps(schedule, self.lane))

    # --- running steps in the learner's lab ---------------------------------------------------

    def run_steps(self, steps: list[dict[str, Any]]) -> RunState:
        """Run scenario steps in the lab that asked, without its setup (which would reset the lab)
        and without stopping the lab's consumers after (the runner's run_all does both)."""
        document = {"title": "Explorer run on a lane", "narrative": "An explorer run.",
                    "setup": {"partitions": 1, "groups": {self.lane: {"strategy": OUTSIDE_STRATEGY,
                                                                      "lane": self.lane}}},
                    "steps": steps, "expect": {"lanes": {self.lane: {"verdict": {"not_yet_applied": 0}}}}}
        scenario = loads(yaml.safe_dump(document, sort_keys=False), source="<explorer>", name="explore-lane")
        state = RunState(scenario=scenario.name, lab=self.lab.name, prepared=True, status="running")
        runner = Runner(self.ctx.engine, scenario, state, broker=self.broker, config=self.ctx.config)
        while not state.finished and state.position < len(scenario.steps):
            runner.next_step()
        if not state.finished:
            runner.conclude()
        return state

    def lane_verdict(self) -> dict[str, Any]:
        return observe(self.ctx.engine, self.lab).verdicts.get(self.lane, {})

    def ready(self) -> None:
        """The consumer applies what is published: one credit, applied and committed in time.
        The lab gets no heartbeat from a learner's process; this is how it knows one runs."""
        state = self.run_steps([{"publish": {"account": schedules.ACCOUNTS[0], "amount": "1.00"}},
                                settled(self.lane, READY_TIMEOUT)])
        if state.status != "passed":
            info = ops.call("get_yours", self.ctx, {"lane": self.lane})
            raise NotExplorable(
                f"no consumer applied and committed a credit on lane {self.lane} within {READY_TIMEOUT} s: start "
                f"your consumer (group {info['group_id']}, client id {info['client_id']}, topic {info['topic']}; "
                f"the Your consumer page shows where it connects) and explore again ({state.reason})")

    def run(self, schedule: Schedule) -> Outcome:
        """Run ``schedule`` against the learner's consumer; judged by what it added to the lane's verdict."""
        before = self.baseline()
        if before is None:
            outcome = Outcome(False, {}, None, reason=f"lane {self.lane} did not settle within "
                                                        f"{SETTLED_TIMEOUT} s before the run")
        else:
            outcome = self.judge(self.run_steps(compile_steps(schedule, self.lane)), before)
        self.runs += 1
        self.not_run_as_written += not outcome.ran
        if not outcome.ran and self.first_unfinished is None:
            self.first_unfinished = outcome.reason
        self.outcomes[schedule] = outcome
        self.found = self.found or outcome.failed
        self.on_progress(self.phase, self.runs, self.length(schedule), self.found)
        return outcome

    def baseline(self) -> dict[str, Any] | None:
        """The lane's verdict once every record is applied (None if it does not settle)."""
        try:
            return wait_until(lambda: _settled(self.lane_verdict()), timeout=SETTLED_TIMEOUT, interval=0.5,
                              message="")
        except WaitTimeout:
            return None

    def judge(self, state: RunState, before: dict[str, Any]) -> Outcome:
        steps_held = state.status in ("passed", "failed") and all(s["status"] == "ok" for s in state.steps)
        if not steps_held:
            bad = next((s for s in state.steps if s["status"] != "ok"), None)
            return Outcome(False, {}, None, reason=state.reason or (bad and bad["observed"]))
        after = self.baseline()
        if after is None:
            return Outcome(False, {}, None, reason=f"the lane's verdict did not settle within {SETTLED_TIMEOUT} s")
        added = {name: after.get(name, 0) - before.get(name, 0) for name in ANOMALY_FIELDS}
        anomalies = {name: count for name, count in added.items() if count > 0}
        known = {a.get("why") for a in before.get("anomalies", [])}
        why = next((a["why"] for a in after.get("anomalies", []) if a.get("why") and a["why"] not in known), None)
        return Outcome(True, anomalies, why)

    def cached(self, schedule: Schedule) -> Outcome:
        return self.outcomes.get(schedule) or self.run(schedule)

    # --- the phases ---------------------------------------------------------------------------

    def search(self) -> Schedule | None:
        rng = random.Random(self.seed)
        while self.budget.runs is None or self.runs < self.budget.runs:
            if self.out_of_time() or self.stop_requested():
                return None
            schedule = generate(rng)
            if self.run(schedule).failed:
                self.first_failure_run = self.runs
                return schedule
        return None

    def shrink(self, failing: Schedule) -> Schedule:
        self.phase = "shrinking"
        budget_end = self.runs + self.max_shrink_runs

        def may_go_on() -> bool:
            return self.runs < budget_end and not self.out_of_time() and not self.stop_requested()

        # No crash points: a lane's faults have none to move earlier.
        return schedules.shrink(failing, (), lambda candidate: self.valid(candidate) and self.cached(candidate).failed,
                                may_go_on)

    @staticmethod
    def valid(schedule: Schedule) -> bool:
        """A repeat needs something published before it (else it repeats an event of another run)."""
        seen_publish = False
        for episode in schedule:
            seen_publish = seen_publish or episode.kind in ("publish", "commits-blocked")
            if episode.kind in REPEATS and not seen_publish:
                return False
        return True

    def reproduce_final(self, final: Schedule) -> int:
        """How often the final schedule, run again, shows the same kinds of anomaly."""
        self.phase = "reproducing"
        wanted = set(self.outcomes[final].anomalies)
        same = 0
        for _ in range(self.reproduce):
            if self.stop_requested():
                break
            outcome = self.run_again(final)
            same += outcome.ran and set(outcome.anomalies) == wanted
        return same

    def run_again(self, schedule: Schedule) -> Outcome:
        remembered = self.outcomes.get(schedule)
        outcome = self.run(schedule)
        if remembered is not None:
            self.outcomes[schedule] = remembered
        return outcome

    # --- what it says -------------------------------------------------------------------------

    def tried(self) -> str:
        stopped = " (cancelled)" if self.cancelled else ""
        unfinished = (f"; {self.not_run_as_written} of them did not run as written, so were not judged "
                      f"(the first: {self.first_unfinished})" if self.not_run_as_written else "")
        return (f"{self.runs} run(s){stopped} of schedules from seed {self.seed} against your consumer on lane "
                f"{self.lane}: one or two faults each among {', '.join(LANE_FAULTS)} (no crash points: the lab "
                f"does not run your code), with credits to {' and '.join(schedules.ACCOUNTS)}{unfinished}")

    def scenario_yaml(self, final: Schedule, outcome: Outcome, original: Schedule, reproduced: int,
                      attempts: int) -> str:
        found = ", ".join(f"{name.replace('_', ' ')} {count}" for name, count in outcome.anomalies.items())
        narrative = (
            f"The explorer ran fault schedules generated from seed {self.seed} against your consumer on lane "
            f"`{self.lane}`. Run {self.first_failure_run} was the first that added an anomaly to the lane's verdict "
            f"({found}). Its schedule had {len(original)} episode(s) ({self.length(original)} steps); shrinking "
            f"(fewer episodes, plainer credits, each candidate run again) left {len(final)} episode(s): "
            f"{describe_schedule(final)}."
            + (f" Run again {attempts} time(s), it showed the same anomalies {reproduced} time(s)." if attempts else "")
            + "\n\nThe setup resets your lab: the topic is re-created empty and your lane with it. **Stop your "
              "consumer before you prepare; start it again when the first step waits for it.**\n\n"
            + (f"**Why:** {outcome.why}\n" if outcome.why else ""))
        return compile_scenario(final, self.lane, title=f"Explored: your consumer on lane {self.lane} — {found}",
                                narrative=narrative, summary=f"The explorer's shortest schedule that makes your "
                                                             f"consumer show {found}.",
                                expect_verdict=dict(outcome.anomalies))


def _settled(verdict: dict[str, Any]) -> dict[str, Any] | None:
    return verdict if verdict and not verdict.get("pending") and not verdict.get("not_yet_applied") else None


def explore(ctx: ops.Context, lane: str, budget, seed: int, *, reproduce: int, max_shrink_runs: int,
            on_progress: OnProgress, should_stop: Callable[[], bool]) -> dict[str, Any]:
    """Search the learner's consumer on ``lane`` of ``ctx.lab`` for a failing schedule, shrink it, run it
    again; the result has search.Exploration's fields. ``budget`` is a search.Budget, checked already.
    Raises NotExplorable when the lab has no such lane or no consumer applies its credits."""
    if observe(ctx.engine, ctx.lab).groups.get(lane, {}).get("strategy") != OUTSIDE_STRATEGY:
        raise NotExplorable(f"lab {ctx.lab.name} has no lane {lane} for your consumer: create it first (POST /yours)")
    explorer = LaneExplorer(ctx, lane, budget, seed, reproduce=reproduce, max_shrink_runs=max_shrink_runs,
                            on_progress=on_progress, should_stop=should_stop)
    explorer.ready()
    failing = explorer.search()
    if failing is None:
        on_progress("done", explorer.runs, None, False)
        return dict(found=False, cancelled=explorer.cancelled, runs=explorer.runs,
                    seconds=round(time.monotonic() - explorer.started, 1), schedule_length=None,
                    original_length=None, reproduced=0, reproduce_attempts=0, why=None,
                    tried=explorer.tried(), scenario_yaml=None)
    final = explorer.shrink(failing)
    outcome = explorer.outcomes[final]
    length = explorer.length(final)
    reproduced = explorer.reproduce_final(final) if not explorer.cancelled else 0
    attempts = explorer.reproduce if not explorer.cancelled else 0
    on_progress("done", explorer.runs, length, True)
    return dict(found=True, cancelled=explorer.cancelled, runs=explorer.runs,
                seconds=round(time.monotonic() - explorer.started, 1), schedule_length=length,
                original_length=explorer.length(failing), reproduced=reproduced, reproduce_attempts=attempts,
                why=outcome.why, tried=explorer.tried(),
                scenario_yaml=explorer.scenario_yaml(final, outcome, failing, reproduced, attempts))
