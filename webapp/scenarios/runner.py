"""Runs a scenario against a fresh lab, through the operations a person clicks.

Every step that changes the lab is ``ops.call(step.operation, ctx, args)``: the same registry
operation, with the same checks, as the API, the dashboard's forms and the CLI. The runner's own
part is the scenario's references (a consumer's name → its id, ``event: NAME`` → an event id).
Every wait and every expectation reads the lab through ``observe`` (the read model's panels and verdict.py).
The run's progress is a plain ``RunState`` so that the guided mode can keep it in PostgreSQL
between two clicks and the headless runner in memory.
"""
from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from .. import ops
from ..domain.group_health import REBALANCING, RECOVERING, STALLED
from ..domain.lab import Lab
from ..domain.vocabulary import LIVE_STATES, OUTSIDE_STRATEGY
from ..domain.waits import WaitTimeout, wait_until
from ..store import command_channel
from ..store.group_health import health_of_groups
from ..store.labdata import say
from ..store.schema import begin_in
from .conditions import Expectation, compare, describe_condition, format_comparison
from .loader import CAPABILITIES, Scenario, Step
from .observe import Snapshot, observe

POLL_INTERVAL = 0.2
# A warm-up step's keys (exercise 18: a million) are in well within this, on the agent.
WARMUP_TIMEOUT = 300.0
# What makes a step an error (not a failed wait): the operation refused, or named nothing.
OPERATION_ERRORS = (ops.InvalidRequest, ops.NotFound, command_channel.CommandError)

# Which broker can do what a scenario may require (docs/concepts/broker.md, measured).
SUPPORT = {"max-poll-interval-handover": {"tansu": False, "kafka": True}, "kafka": {"tansu": False, "kafka": True}}
NOT_SUPPORTED_WHY = {
    ("max-poll-interval-handover", "tansu"):
        "on the embedded Tansu broker a new member loops in JoinGroup/SyncGroup and is never assigned while a "
        "member stalls past max.poll.interval.ms (docs/concepts/broker.md): this hand-over does not complete on Tansu",
    ("kafka", "tansu"):
        "it shows Apache Kafka's own machinery (offsets retention, transaction markers or log retention, as its "
        "narrative says), and this lab runs the embedded Tansu broker, which was measured to differ (it delivered "
        "an aborted transaction's record to a read_committed consumer) or was not measured there (the docs' "
        "page on the embedded broker): run it on the docker compose stack, whose broker is Apache Kafka",
}
NO_FAULT_PROXY = ("it needs the fault proxy between the lab's Kafka clients and the broker, and this stack has "
                  "none (`make run` starts one with the embedded broker; with docker compose, the faultproxy service)")


class NotRunnable(Exception):
    """The scenario needs something this lab cannot do; the message says what and why."""


class StepFailed(Exception):
    """A wait that did not hold in time; the message says what was wanted and what was seen."""


@dataclass
class RunState:
    scenario: str
    lab: str
    position: int = 0                    # steps done; setup is done when ``prepared``
    prepared: bool = False
    status: str = "ready"                # ready | running | passed | failed | not-run | error
    reason: str | None = None
    error: str | None = None             # why the last click could not act (guided mode), shown once
    waiting: str | None = None           # guided mode: what the step running now waits for, while it runs
    consumers: dict[str, int] = field(default_factory=dict)
    events: dict[str, str] = field(default_factory=dict)
    steps: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    # The graded lane's verdict (its anomalies and their why), for a grading exercise.
    graded: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.time)
    seconds: float = 0.0

    @property
    def finished(self) -> bool:
        return self.status in ("passed", "failed", "not-run", "error")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RunState":
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})


# --- what this stack can do -------------------------------------------------------------------

def broker_kind(config: Mapping[str, Any], probe: bool = True) -> tuple[str, str]:
    """(kind, how we know): ``tansu``, ``kafka`` or ``unknown``.

    The ``LAB_BROKER_KIND`` setting wins; else, where allowed (the CLI and tests,
    never a web process), one metadata request: Tansu reports the cluster id ``tansu_cluster``.
    """
    explicit = config.get("LAB_BROKER_KIND")
    if explicit:
        return str(explicit).lower(), "LAB_BROKER_KIND"
    bootstrap = config.get("KAFKA_BOOTSTRAP_SERVERS")
    if not probe or not bootstrap:
        return "unknown", "not probed"
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient
    try:
        metadata = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=5)
    except KafkaException as error:
        return "unknown", f"the broker did not answer: {error}"
    cluster = metadata.cluster_id or ""
    return ("tansu" if cluster.startswith("tansu") else "kafka"), f"cluster id {cluster!r}"


# The operations that need the fault proxy between the lab's Kafka clients and the broker.
FAULT_PROXY_OPERATIONS = ("arm_fault_proxy", "block_commits", "cut_yours", "block_yours_commits")


def has_fault_proxy(ctx: ops.Context) -> bool:
    """Whether this stack was started with a lost-ack fault proxy: the lab's producer is set to go
    through one (``make run``), or one has reported to this database (compose, the tests), even if
    it is not answering now. Then a missing proxy is a failure, not a reason to skip."""
    producer, broker = ctx.config.get("KAFKA_PRODUCER_BOOTSTRAP_SERVERS"), ctx.config.get("KAFKA_BOOTSTRAP_SERVERS")
    if producer and broker and producer != broker:
        return True
    proxy = ops.call("get_fault_proxy", ctx)
    return proxy["running"] or proxy["heartbeat_age"] is not None


def preflight(scenario: Scenario, broker: str, ctx: ops.Context | None = None) -> str | None:
    """Why this scenario cannot run here, or None."""
    for capability in scenario.requires:
        supported = SUPPORT.get(capability, {}).get(broker)
        if supported is None:
            return (f"it needs a broker where {CAPABILITIES[capability]}, and the lab cannot tell which broker runs "
                    f"({broker}); set LAB_BROKER_KIND=kafka or tansu")
        if not supported:
            return NOT_SUPPORTED_WHY.get((capability, broker), f"the {broker} broker cannot do: {capability}")
    if ctx is not None and any(step.operation in FAULT_PROXY_OPERATIONS for step in scenario.steps) \
            and not has_fault_proxy(ctx):
        return NO_FAULT_PROXY
    return None


# --- lab names --------------------------------------------------------------------------------

def fresh_lab_name(engine: Engine, scenario_name: str) -> str:
    """``<scenario slug>_<n>``: the scenario's name plus a counter past every earlier run's lab."""
    slug = re.sub(r"[^a-z0-9]+", "_", scenario_name.lower()).strip("_")
    if not slug or not slug[0].isalpha():
        slug = "s" + slug
    slug = slug[:17].rstrip("_")
    with engine.connect() as conn:
        names = conn.execute(text("SELECT schema_name FROM information_schema.schemata WHERE schema_name LIKE :p"),
                             {"p": f"lab\\_{slug.replace('_', chr(92) + '_')}\\_%"}).scalars().all()
    numbers = [int(m.group(1)) for n in names if (m := re.fullmatch(rf"lab_{slug}_(\d+)", n))]
    return f"{slug}_{max(numbers, default=0) + 1}"


# --- conditions and expectations --------------------------------------------------------------

def evaluate(condition: dict[str, Any], snap: Snapshot, run: RunState) -> tuple[bool, str]:
    """(holds, what was observed)."""
    if "all" in condition:
        results = [evaluate(part, snap, run) for part in condition["all"]]
        return all(ok for ok, _ in results), "; ".join(seen for _, seen in results)
    lane = condition.get("lane")
    if "consumer" in condition:
        name = condition["consumer"]
        row = snap.consumers_by_id.get(run.consumers.get(name, -1))
        if row is None:
            return False, f"{name}: no row yet"
        checks = []
        if "state" in condition:
            checks.append(row["state"] in condition["state"])
        if "assigned" in condition:
            checks.append(bool(row["assigned"]) == condition["assigned"])
        if "step_at" in condition:
            checks.append(row["state"] == "stepping" and row["step_at"] == condition["step_at"])
        for key in ("applied", "absorbed", "commit_failures"):
            if key in condition:
                checks.append(compare(row[key], condition[key]))
        seen = (f"{name} {row['state']}, partitions {row['assigned'] or 'none'}, applied {row['applied']}, "
                f"absorbed {row['absorbed']}, commit failures {row['commit_failures']}"
                + (f", at {row['step_at']}" if row["state"] == "stepping" else ""))
        return all(checks), seen
    if "caught_up" in condition:
        group = condition["caught_up"]
        info = snap.groups.get(group, {})
        ends = snap.log_ends.get(info.get("lane"), {})
        committed = snap.committed.get(group, {})
        seen = (f"group {group}: log end " + ", ".join(f"p{p}={e}" for p, e in sorted(ends.items()) if e)
                + "; committed " + ", ".join(f"p{p}={c}" for p, c in sorted(committed.items())))
        return snap.caught_up(group), seen
    if "no_committed_offset" in condition:
        group = condition["no_committed_offset"]
        committed = snap.committed.get(group, {})
        seen = f"group {group}: committed " + (", ".join(f"p{p}={c if c is not None else 'none'}"
                                                         for p, c in sorted(committed.items())) or "not read yet")
        return snap.no_committed_offset(group), seen
    if "verdict" in condition:
        verdict = snap.verdicts.get(lane, {})
        seen = ", ".join(f"{k} {verdict.get(k)}" for k in condition["verdict"])
        return all(compare(verdict.get(k), c) for k, c in condition["verdict"].items()), seen
    if "account" in condition:
        account = snap.accounts.get(lane, {}).get(condition["account"])
        if account is None:
            return False, f"no account {condition['account']}"
        ok = True
        if "balance" in condition:
            ok = ok and compare(account["actual"], condition["balance"])
        if "status" in condition:
            ok = ok and account["status"] == condition["status"]
        return ok, f"{condition['account']} balance {account['actual']} cents, status {account['status']}"
    if "dedup" in condition:
        table = snap.dedup.get(lane, {}).get(condition["dedup"], {})
        ok = True
        if "rows" in condition:
            ok = ok and compare(table.get("rows"), condition["rows"])
        if "oldest_age" in condition:
            ok = ok and compare(table.get("oldest_age"), condition["oldest_age"])
        age = table.get("oldest_age")
        return ok, (f"{condition['dedup']}: {table.get('rows')} row(s)"
                    + (f", oldest {age:.1f} s old" if age is not None else ""))
    if "log_end" in condition:
        total = snap.log_end_total()
        return compare(total, condition["log_end"]), f"{total} record(s) in the topic"
    return False, "unknown condition"


def observed_value(expectation: Expectation, snap: Snapshot, run: RunState) -> Any:
    target = expectation.target
    lane = target.get("lane")
    if expectation.kind == "verdict":
        return snap.verdicts.get(lane, {}).get(target["field"])
    if expectation.kind == "account":
        return snap.accounts.get(lane, {}).get(target["account"], {}).get(target["field"])
    if expectation.kind == "dlq":
        return sum(v.get("dead_letters", 0) for v in snap.verdicts.values())
    if expectation.kind == "commit_failures":
        if "consumer" in target:
            row = snap.consumers_by_id.get(run.consumers.get(target["consumer"], -1))
            return row["commit_failures"] if row else None
        return sum(row["commit_failures"] for row in snap.consumers_by_id.values())
    if expectation.kind == "dedup":
        return snap.dedup.get(lane, {}).get(target["table"], {}).get("rows")
    if expectation.kind == "log_end":
        return snap.log_end_total()
    if expectation.kind == "notifications":
        return snap.notifications.get(target["account"], {}).get(target["field"], 0)
    if expectation.kind == "out_of_order":
        return snap.out_of_order.get(target["account"], 0)
    return None


def check_expectations(scenario: Scenario, snap: Snapshot, run: RunState) -> list[dict[str, Any]]:
    checks = []
    for expectation in scenario.expectations:
        value = observed_value(expectation, snap, run)
        checks.append({"label": expectation.label, "wanted": expectation.wanted, "observed": value,
                       "ok": compare(value, expectation.comparison), "line": expectation.line})
    return checks


# --- the runner -------------------------------------------------------------------------------

Echo = Callable[[str, dict[str, Any]], None]


class Runner:
    def __init__(self, engine: Engine, scenario: Scenario, run: RunState, *, broker: str = "unknown",
                 echo: Echo | None = None, config: Mapping[str, Any] | None = None,
                 waiting: Callable[[str], None] | None = None):
        """``waiting``: guided mode's; told what a step waits for while it waits (the agent's commands
        are then waited for patiently: a busy agent is slow, not failed)."""
        self.engine = engine
        self.scenario = scenario
        self.run = run
        self.lab = Lab(run.lab)
        self.ctx = ops.Context(engine, self.lab, dict(config or {}), waiting=waiting)
        self.waiting = waiting
        self.broker = broker
        self.echo = echo or (lambda kind, data: None)

    # --- the whole run --------------------------------------------------------------------

    def run_all(self) -> RunState:
        try:
            if not self.run.prepared:
                self.prepare()
            while not self.run.finished and self.run.position < len(self.scenario.steps):
                self.next_step()
            if not self.run.finished:
                self.conclude()
        finally:
            self.stop_consumers()
        return self.run

    def advance(self) -> None:
        """One click of the guided mode: prepare, or the next step, or the expectations."""
        if self.run.finished:
            return
        if not self.run.prepared:
            self.prepare()
            if self.run.status == "not-run":
                self.conclude()
        elif self.run.position < len(self.scenario.steps):
            self.next_step()
            if self.run.finished:
                self.stop_consumers()
        else:
            self.conclude()
            self.stop_consumers()

    def prepare(self) -> dict[str, Any]:
        """Check the scenario can run here, then a fresh lab: topics, accounts, groups, TTL."""
        started = time.monotonic()
        self.run.status = "running"
        reason = preflight(self.scenario, self.broker, self.ctx)
        if reason:
            self.run.status, self.run.reason = "not-run", reason
            result = {"index": 0, "action": "setup", "description": "check what the scenario needs",
                      "status": "not-run", "observed": reason, "seconds": 0.0}
            self.run.steps.append(result)
            self.echo("step", result)
            return result
        ops.call("reset_lab", self.ctx, {"partitions": self.scenario.partitions})
        done = [f"lab {self.lab.name}: {self.scenario.partitions} partition(s), 5 accounts"]
        created_by_steps = {s.args.get("group") for s in self.scenario.steps if s.action == "group"}
        for group in self.scenario.groups:
            if group.name == "payments" and not group.lane:
                if group.strategy != "none":
                    ops.call("set_strategy", self.ctx, {"group": "payments", "strategy": group.strategy})
            elif group.strategy == OUTSIDE_STRATEGY:
                # The learner's own consumer: its lane, group and role, as the "Your consumer" page makes them.
                ops.call("create_yours", self.ctx, {"lane": group.lane})
            elif group.name not in created_by_steps:
                ops.call("create_group", self.ctx, {"group": group.name, "strategy": group.strategy,
                                                    "lane": group.lane})
            else:
                continue
            done.append(f"group {group.name}: {group.strategy}" + (f" on lane {group.lane}" if group.lane else ""))
        if self.scenario.ttl:
            ops.call("set_ttl", self.ctx, self.scenario.ttl)
            done.append("TTL " + ", ".join(f"{k} {v:g} s" for k, v in self.scenario.ttl.items()))
        self.run.prepared = True
        result = {"index": 0, "action": "setup", "description": "a fresh lab", "status": "ok",
                  "observed": "; ".join(done), "seconds": round(time.monotonic() - started, 2)}
        self.run.steps.append(result)
        self._say(f"scenario {self.scenario.name}: setup — " + "; ".join(done))
        self.echo("step", result)
        return result

    def next_step(self) -> dict[str, Any]:
        step = self.scenario.steps[self.run.position]
        started = time.monotonic()
        self.echo("start", {"index": step.index, "description": step.describe()})
        status, observed = "ok", ""
        try:
            observed = self.wait(step) if step.operation is None else self.operate(step)
            if step.refused:
                raise StepFailed(f"expected a refusal saying {step.refused!r}, but it ran: {observed}")
        except StepFailed as failure:
            status, observed = "failed", str(failure)
        except NotRunnable as reason:
            status, observed = "not-run", str(reason)
        except OPERATION_ERRORS as error:
            if step.refused and step.refused in str(error):
                observed = f"refused, as expected: {error}"
            elif step.refused:
                status, observed = "failed", f"refused, but not saying {step.refused!r}: {error}"
            else:
                status, observed = "error", f"{type(error).__name__}: {error}"
        result = {"index": step.index, "action": step.action, "description": step.describe(), "status": status,
                  "observed": observed, "seconds": round(time.monotonic() - started, 2), "line": step.line}
        self.run.steps.append(result)
        self.run.position += 1
        self._say(f"scenario {self.scenario.name} step {step.index}/{len(self.scenario.steps)}: "
                  f"{step.describe()} — {status}: {observed}"[:1000])
        self.echo("step", result)
        if status == "not-run":
            self.run.status, self.run.reason = "not-run", observed
        elif status != "ok":
            self.conclude(failed_step=result)
        return result

    def conclude(self, failed_step: dict[str, Any] | None = None) -> RunState:
        snap = observe(self.engine, self.lab)
        self.run.checks = check_expectations(self.scenario, snap, self.run)
        if self.scenario.outside_lane:
            self.run.graded = snap.verdicts.get(self.scenario.outside_lane, {})
        if self.run.status == "not-run":
            pass
        elif failed_step is not None:
            self.run.status = "failed" if failed_step["status"] == "failed" else "error"
            self.run.reason = f"step {failed_step['index']} ({failed_step['description']}): {failed_step['observed']}"
        elif all(check["ok"] for check in self.run.checks):
            self.run.status = "passed"
        else:
            self.run.status = "failed"
            bad = [c for c in self.run.checks if not c["ok"]]
            self.run.reason = "; ".join(f"{c['label']}: wanted {c['wanted']}, observed {c['observed']}" for c in bad)
        self.run.seconds = round(time.time() - self.run.started, 1)
        self._say(f"scenario {self.scenario.name}: {self.run.status}" + (f" — {self.run.reason}" if self.run.reason else ""))
        self.echo("checks", {"checks": self.run.checks, "status": self.run.status, "reason": self.run.reason})
        return self.run

    def stop_consumers(self) -> None:
        """Stop every live consumer of this run's lab (stop sends SIGCONT first to a frozen one)."""
        snap = observe(self.engine, self.lab)
        for consumer_id, row in snap.consumers_by_id.items():
            if row["state"] in LIVE_STATES:
                try:
                    ops.call("stop_consumer", self.ctx, {"consumer_id": consumer_id})
                except OPERATION_ERRORS:
                    pass  # it ended by itself meanwhile

    # --- steps ----------------------------------------------------------------------------

    def operate(self, step: Step) -> str:
        """The step's operation, its references resolved: what a person clicking would do."""
        args = dict(step.args)
        if "consumer" in step.refs:
            args["consumer_id"] = self.run.consumers[step.refs["consumer"]]
        if "event" in step.refs:
            args["event_id"] = self.run.events[step.refs["event"]]
        try:
            result = ops.call(step.operation, self.ctx, args)
        except ops.NoFaultProxy as error:
            if has_fault_proxy(self.ctx):
                raise StepFailed(f"this stack has a lost-ack fault proxy, and it did not answer: {error}") from None
            raise NotRunnable(f"{NO_FAULT_PROXY}: {error}") from None
        if step.operation == "dedup_warmup":
            result = self._warmed_up(result)
        if step.action == "start":
            self.run.consumers[args["name"]] = result["consumer_id"]
        records = result.get("records") or []
        if "as" in step.refs and records and records[0].get("event_id"):
            self.run.events[step.refs["as"]] = records[0]["event_id"]
        if "records" in result:
            errors = [r["error"] for r in records if r.get("error")]
            where = ", ".join(f"p{r.get('partition')}@{r['offset']}" if r.get("offset") is not None
                              else f"p{r.get('partition')}@(no offset in the delivery report)" for r in records[:5])
            return (f"{len(records)} record(s) written: {where}" + (" …" if len(records) > 5 else "")
                    + (f"; delivery errors: {errors}" if errors else ""))
        return _short(result)

    def _warmed_up(self, started: dict[str, Any]) -> dict[str, Any]:
        """A warm-up runs on the agent: the step ends when its keys are in (as a person watching the
        Load panel would go on), so the next step never finds the lab busy with it."""
        def finished() -> dict[str, Any] | None:
            runs = ops.call("get_dedup_warmup", self.ctx)["runs"]
            run = next((r for r in runs if r["id"] == started["run_id"]), None)
            return run if run is not None and run["state"] not in ("starting", "running") else None
        try:
            run = wait_until(finished, timeout=WARMUP_TIMEOUT, interval=POLL_INTERVAL, message="")
        except WaitTimeout:
            raise StepFailed(f"warm-up run {started['run_id']} did not finish within {WARMUP_TIMEOUT:.0f} s") from None
        if run["state"] != "done":
            raise StepFailed(f"warm-up run {run['id']} {run['state']}: {run['error'] or 'cancelled'}")
        return {"keys": run["inserted"], "days": run["days"], "run_id": run["id"]}

    def wait(self, step: Step) -> str:
        condition = {k: v for k, v in step.args.items() if k != "timeout"}
        started = time.monotonic()
        seen = ""

        def holds() -> bool:
            nonlocal seen
            ok, seen = evaluate(condition, observe(self.engine, self.lab), self.run)
            if self.waiting is not None and not ok:
                self.waiting(f"waiting until {describe_condition(condition)} "
                             f"({time.monotonic() - started:.0f} of {step.args['timeout']:g} s); the lab shows: {seen}")
            return ok

        try:
            wait_until(holds, timeout=step.args["timeout"], message="", interval=POLL_INTERVAL)
        except WaitTimeout:
            recovered = self._recover_unassigned(condition)
            if not recovered:
                raise StepFailed(f"not within {step.args['timeout']:g} s: wanted {describe_condition(condition)}; "
                                 f"observed {seen}") from None
            try:
                wait_until(holds, timeout=step.args["timeout"], message="", interval=POLL_INTERVAL)
            except WaitTimeout:
                raise StepFailed(f"not within {step.args['timeout']:g} s, nor after recovering {recovered}: wanted "
                                 f"{describe_condition(condition)}; observed {seen}") from None
            return f"after {time.monotonic() - started:.1f} s and a recovery ({recovered}): {seen}"
        return f"after {time.monotonic() - started:.1f} s: {seen}"

    def _recover_unassigned(self, condition: dict) -> str:
        """A wait for an assignment that did not come: recover every group of the lab the broker left
        without one (recover_group), rather than fail the run; what was recovered, or "" when none."""
        def wants_assignment(c: dict) -> bool:
            return c.get("assigned") is True or any(wants_assignment(part) for part in c.get("all", ()))
        if not wants_assignment(condition):
            return ""
        with self.engine.connect() as conn:
            groups = [health.group_id for health, _ in health_of_groups(conn.exec_driver_sql, self.lab)
                      if health.state in (STALLED, REBALANCING, RECOVERING)]
        done = []
        for group_id in groups:
            result = ops.call("recover_group", self.ctx, {"group": self.lab.local_group(group_id)})
            done.append(f"{self.lab.local_group(group_id)}: " + "; ".join(result["steps"]))
            self._say(f"a step waited for an assignment that did not come: recovered group {done[-1]}")
        return "; ".join(done)

    def _say(self, summary: str) -> None:
        try:
            with begin_in(self.engine, self.lab.schema) as conn:
                say(conn, "scenario", summary)
        except SQLAlchemyError:  # the timeline note is a courtesy; never fail a run for it
            pass


def _short(value: Any, limit: int = 200) -> str:
    text_ = ", ".join(f"{k} {v}" for k, v in value.items()) if isinstance(value, dict) else str(value)
    return text_ if len(text_) <= limit else text_[:limit] + "…"


__all__ = ["NotRunnable", "RunState", "Runner", "broker_kind", "check_expectations", "evaluate", "format_comparison",
           "fresh_lab_name", "has_fault_proxy", "preflight"]
