"""Scenario files: YAML read with line numbers (marks.py), checked, turned into a Scenario.

A step is an operation of the registry (webapp/ops) under its step name: ``{publish: {...}}``
runs ``publish``, ``{start: {...}}`` runs ``start_consumer``, and so on (``op.step``). Its
arguments are checked by the operation's own model, so a limit or a choice lives in one place;
a pydantic error is mapped back to the YAML key and line it came from, and an unknown key gets
"did you mean". On top of the operation's fields a step may use the scenario's references, which
the runner resolves: ``consumer: NAME`` (a name given in an earlier start step) for a consumer
id, ``event: NAME`` for an event published earlier ``as: NAME``. Short forms: ``kill: c1`` and
``disarm: c1`` (arm with no point). Waits, expectations, setup and the header are the format's
own (conditions.py). The format is documented in docs/reference/scenario-format.md.
"""
from __future__ import annotations

import copy
import functools
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from .. import ops, strategies
from ..domain.vocabulary import DEFAULT_GROUP, DEFAULT_STRATEGY, OUTSIDE_STRATEGY, Limits
from ..ops.registry import describe_error
from .conditions import (  # noqa: F401  (re-exported)
    VERDICT_FIELDS,
    ConditionChecker,
    Expectation,
    Group,
    compare,
    describe_condition,
    format_comparison,
)
from .marks import LocatedDict, ScenarioError, hint, kind, located, parse_yaml

SEEDS = {"pt": "Idempotência — o pilar do at-least-once (source text 000, in Portuguese)",
         "en": "Idempotency, Part IV — Reliability (source text 001)"}
# What a scenario may require of the broker, and why (docs/concepts/broker.md).
CAPABILITIES = {
    "max-poll-interval-handover": "a member that stalls past max.poll.interval.ms hands its partitions to a "
                                  "new member",
    # Lessons of Apache Kafka's own machinery (offsets retention, transaction markers, log retention),
    # written for the docker compose stack's broker.
    "kafka": "Apache Kafka itself runs (the docker compose stack's broker)",
}
# Step name -> the operation it runs: every operation the registry marks as a scenario step.
STEP_OPERATIONS = {op.step: op for op in ops.OPERATIONS.values() if op.step}
SHORT_FORMS = {"disarm": "arm"}           # `disarm: c1` is `arm` with no point
ACTIONS = (*STEP_OPERATIONS, *SHORT_FORMS, "wait")
# `refused`: the step's operation is expected to be refused, with a message holding this text (a
# lesson in what a client or the lab will not do: an idempotent producer without its terms).
STEP_META = ("note", "title", "refused")
# Fields a step names by reference, resolved when it runs: field -> the step's key.
REFERENCES = {"consumer_id": "consumer", "event_id": "event"}
PLACEHOLDERS = {"consumer_id": 0, "event_id": "00000000-0000-0000-0000-000000000000"}
TOP_KEYS = ("title", "summary", "narrative", "sources", "requires", "setup", "steps", "expect", "recorded")
SETUP_KEYS = ("partitions", "groups", "ttl")


@dataclass
class Step:
    index: int          # 1-based
    action: str         # the step's name in the file: an operation's step, "disarm" or "wait"
    args: dict[str, Any]   # the operation's arguments by field name, or the wait's condition
    line: int
    note: str | None = None
    operation: str | None = None            # the registry operation it runs; None for a wait
    refs: dict[str, str] = field(default_factory=dict)   # consumer / event / as: names resolved at run time
    refused: str | None = None              # the refusal expected, as text its message holds

    def describe(self) -> str:
        return describe_step(self.action, self.args, self.refs) + (", expecting a refusal" if self.refused else "")


@dataclass
class Scenario:
    name: str
    source: str
    title: str
    narrative: str
    summary: str = ""
    sources: list[dict[str, str]] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)
    partitions: int = 1
    groups: list[Group] = field(default_factory=list)
    ttl: dict[str, Any] = field(default_factory=dict)
    steps: list[Step] = field(default_factory=list)
    expectations: list[Expectation] = field(default_factory=list)
    recorded: dict[str, Any] | None = None

    def lane_of(self, group: str) -> str | None:
        return next((g.lane for g in self.groups if g.name == group), None)

    @property
    def lanes(self) -> list[str]:
        return [g.lane for g in self.groups if g.lane]

    @property
    def outside_lane(self) -> str | None:
        """The lane of the learner's own consumer, when the scenario grades one."""
        return next((g.lane for g in self.groups if g.strategy == OUTSIDE_STRATEGY), None)


def field_keys(model) -> dict[str, str]:
    """The keys a file may use for a model's fields: each field's name and its validation aliases."""
    keys: dict[str, str] = {}
    for name, info in model.model_fields.items():
        if name in REFERENCES:
            continue
        alias = info.validation_alias
        choices = getattr(alias, "choices", None) or ([alias] if isinstance(alias, str) else [])
        keys.update({key: name for key in [name, *choices] if isinstance(key, str)})
    return keys


def describe_step(action: str, a: dict[str, Any], refs: dict[str, str]) -> str:
    consumer = refs.get("consumer", "")
    if action == "publish":
        mode = a.get("mode", "normal")
        if mode in ("resend", "source-duplicate"):
            return f"publish {mode} of {refs.get('event') or 'the newest event'}"
        if mode == "poison":
            return f"publish a poison pill ({a.get('poison_kind', 'not-json')})"
        if a.get("type", "credit") == "credit":
            cents = a["amount_cents"] if "amount_cents" in a else Decimal(a.get("amount", 0)) * 100
            what = f"credit {a.get('account_id')} +{cents / 100:.2f}"
        else:
            what = f"{a['type']} {a.get('account_id')} = " + next(
                (str(a[k]) for k in ("status", "balance_cents", "score") if k in a), "?")
        plain = ("" if a.get("idempotent", True) else " (plain producer)") + (
            f", {a['max_in_flight']} request(s) in flight" if a.get("max_in_flight") else "") + (
            f", acks={a['acks']}" if a.get("acks") else "") + (
            f", retries={a['retries']}" if a.get("retries") is not None else "")
        return (f"publish {a.get('count', 10)} × {what}" if mode == "burst" else f"publish {what}") + plain
    if action == "start":
        return (f"start consumer {a['name']} in group {a.get('group', DEFAULT_GROUP)}"
                + (f" ({a['strategy']})" if a.get("strategy") else ""))
    if action == "arm":
        return (f"arm {consumer}: {a.get('action', 'crash')} at {a['point']}"
                + (" (every time)" if a.get("always") else " (once)")) if a.get("point") else f"disarm {consumer}"
    if action == "step_mode":
        return f"step mode {'on' if a.get('on', True) else 'off'} for {consumer}"
    if action == "group":
        return (f"create group {a['group']} ({a.get('strategy', DEFAULT_STRATEGY)})"
                + (f" on lane {a['lane']}" if a.get("lane") else ""))
    if action == "strategy":
        return f"switch group {a['group']} to {a['strategy']}"
    if action == "reset_offsets" and a.get("mode") == "expire":
        return (f"expire the committed offsets of group {a['group']} (as the broker does once the group has "
                "been empty for offsets.retention.minutes)")
    if action == "reset_offsets":
        mode = a.get("mode", "earliest")
        extra = {"back": f" back {a.get('back')}", "offset": f" to {a.get('offsets')}",
                 "timestamp": f" to {a.get('timestamp')}"}.get(mode, "")
        return f"reset offsets of group {a['group']} ({mode}{extra})"
    if action == "ttl":
        return "set the dedup TTL: " + ", ".join(f"{k} {v:g} s" for k, v in a.items())
    if action == "ttl_cleanup":
        return "run the TTL cleanup now" + (f" ({a['ttl_seconds']:g} s)" if "ttl_seconds" in a else "")
    if action == "lost_ack":
        return (f"arm the fault proxy: drop the next {a.get('drop_produce_responses', 0)} Produce response(s)"
                + (f", delay {a['delay_ms']} ms" if a.get("delay_ms") else ""))
    if action == "block_commits":
        if a.get("blocked", True) is False:
            return f"let {consumer}'s offset commits through again"
        return f"block {consumer}'s offset commits at the fault proxy (at most {a.get('seconds', 60)} s)"
    if action == "wait":
        return "wait until " + describe_condition(a) + f" (at most {a['timeout']:g} s)"
    if consumer:
        return f"{action} {consumer}"
    summary = STEP_OPERATIONS[action].summary.split(":")[0].split(" (")[0] if action in STEP_OPERATIONS else action
    return f"{summary}: " + ", ".join(f"{k} {v}" for k, v in a.items()) if a else summary


class StepChecker(ConditionChecker):
    def step(self, raw: Any, line: int, index: int) -> Step:
        where = f"step {index}"
        if not isinstance(raw, dict):
            self.fail(line, f"{where} must be a mapping with one action ({', '.join(ACTIONS)}), not {kind(raw)}")
        actions = [k for k in raw if k not in STEP_META]
        unknown = [k for k in actions if k not in ACTIONS]
        if unknown:
            close = hint(unknown[0], ACTIONS + STEP_META)
            self.fail(raw.line_of(unknown[0]), f"unknown action {unknown[0]!r} in {where}"
                      + (f": {close}" if close else "") + f" (actions: {', '.join(ACTIONS)})")
        if len(actions) != 1:
            self.fail(raw.line_of(actions[1]) if actions else raw.line,
                      f"{where} has two actions ({actions[0]!r} and {actions[1]!r}): one action per step" if actions
                      else f"{where} has no action: give one of {', '.join(ACTIONS)}")
        action = actions[0]
        note = self.text(raw, "note", where)
        refused = self.text(raw, "refused", where)
        value, value_line = raw[action], raw.line_of(action)
        where = f"{where} ({action})"
        if refused is not None and action == "wait":
            self.fail(raw.line_of("refused"), f"{where}: `refused` is for a step that runs an operation, not a wait")
        if action == "wait":
            args = self.wait(self.mapping(value, value_line, where), where)
            return Step(index=index, action=action, args=args, line=value_line, note=note)
        op = STEP_OPERATIONS[SHORT_FORMS.get(action, action)]
        fields = op.model.model_fields
        if value is None:
            value = located(value_line)
        elif not isinstance(value, dict) and "consumer_id" in fields:
            value = located(value_line, consumer=value)
        body = self.mapping(value, value_line, where)
        keys = {} if action in SHORT_FORMS else field_keys(op.model)
        references = [key for name, key in REFERENCES.items() if name in fields]
        references += ["as"] if "event_id" in fields else []
        self.keys(body, (*keys, *references), where=where)
        raw_args = {k: v for k, v in body.items() if k not in references}
        refs: dict[str, str] = {}
        if "consumer_id" in fields:
            refs["consumer"] = self.consumer(body, where)
        if "event" in body:
            refs["event"] = self.name(body["event"], body.line_of("event"), f"{where}.event")
            if refs["event"] not in self.events:
                self.fail(body.line_of("event"), f"{where}: no earlier publish step named its event {refs['event']!r} "
                          "(name one with `as: NAME`)")
        if "as" in body:
            refs["as"] = self.name(body["as"], body.line_of("as"), f"{where}.as")
        args = self.validate(op, raw_args, body, keys, where, refs)
        if action == "arm" and not args.get("point"):
            self.fail(body.line, f"{where} needs 'point' (to disarm, write `disarm: {refs['consumer']}`)")
        self.declare(op.step, args, body, keys, where)
        if "as" in refs:
            self.events.add(refs["as"])
        return Step(index=index, action=action, args=args, line=value_line, note=note, operation=op.name, refs=refs,
                    refused=refused)

    def validate(self, op, raw_args: dict, body: LocatedDict, keys: dict[str, str], where: str,
                 refs: dict[str, str] | None = None) -> dict[str, Any]:
        """The operation's arguments (by field name) from a step's keys, or the first error at its line."""
        refs = refs or {}
        placeholders = {name: PLACEHOLDERS[name] for name, key in REFERENCES.items() if key in refs}
        try:
            args = op.model.model_validate({**raw_args, **placeholders})
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            loc = first.get("loc") or ("body",)  # pydantic names a field by the alias the file used
            first = {**first, "loc": (keys.get(loc[0], loc[0]), *loc[1:])}
            self._refuse(body, keys, where, *describe_error(op.model, first))
        except ops.InvalidRequest as error:
            self._refuse(body, keys, where, error.field, error.message)
        dumped = args.model_dump(mode="json", exclude_unset=True, by_alias=False)
        return {k: v for k, v in dumped.items() if k not in placeholders}

    def _refuse(self, body: LocatedDict, keys: dict[str, str], where: str, name: str, message: str):
        key = next((k for k in body if keys.get(k) == name), None)
        if key is None:
            label = next((k for k, field_name in keys.items() if field_name == name), name)
            self.fail(body.line, f"{where} needs {label!r}" + ("" if message == "is required" else f": {message}"))
        close = hint(body[key], message.removeprefix("must be one of ").split(", ")) \
            if message.startswith("must be one of") else ""
        joint = " " if message.startswith(("must", "is ")) else ": "
        self.fail(body.line_of(key), f"{where}: {key}{joint}{message}" + (f"; {close}" if close else ""))

    def declare(self, step: str, args: dict, body: LocatedDict, keys: dict[str, str], where: str) -> None:
        """What a step adds to the scenario (a consumer's name, a group, a lane) and the groups it names."""
        line = body.line_of(next((k for k in body if keys.get(k) == "group"), "group"))
        if step == "group":
            if args["group"] in self.groups:
                self.fail(line, f"{where}: group {args['group']!r} exists already")
            self.groups[args["group"]] = Group(args["group"], args.get("strategy", DEFAULT_STRATEGY), args.get("lane"))
            if args.get("lane"):
                self.lanes.add(args["lane"])
            return
        if "group" in STEP_OPERATIONS[step].model.model_fields:
            self.group(located(line, group=args.get("group", DEFAULT_GROUP)), where)
        if step == "start":
            name_line = body.line_of(next((k for k in body if keys.get(k) == "name"), "name"))
            if "name" not in args:
                self.fail(body.line, f"{where} needs 'consumer' (its name, for the steps that follow)")
            if args["name"] in self.consumers:
                self.fail(name_line, f"{where}: consumer {args['name']!r} was started already")
            self.consumers[args["name"]] = args.get("group", DEFAULT_GROUP)


# --- the whole file ---------------------------------------------------------------------------

def load(path: str | Path) -> Scenario:
    """The scenario in ``path``, checked. Parsed once per version of the file (its modification
    time and size): the guided page and the agent load it at every step, and parsing the YAML
    with line numbers costs tens of milliseconds. Each caller gets its own copy."""
    path = Path(path)
    try:
        stat = path.stat()
    except OSError as error:
        raise ScenarioError(str(path), None, f"cannot read: {error}") from None
    return copy.deepcopy(_load(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _load(path: Path, mtime_ns: int, size: int) -> Scenario:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(str(path), None, f"cannot read: {error}") from None
    return loads(text, source=str(path), name=path.stem)


def loads(text: str, source: str = "<scenario>", name: str = "scenario") -> Scenario:
    data = parse_yaml(text, source)
    c = StepChecker(source, {})
    top = c.mapping(data, 1, "a scenario file")
    c.keys(top, TOP_KEYS, required=("title", "narrative", "steps", "expect"), where="the scenario")
    scenario = Scenario(name=name, source=source, title=c.text(top, "title", "title", required=True).strip(),
                        narrative=c.text(top, "narrative", "narrative", required=True),
                        summary=(c.text(top, "summary", "summary") or "").strip())
    _header(c, top, scenario)
    _setup(c, c.mapping(top.get("setup", LocatedDict()), top.line_of("setup"), "setup"), scenario)
    steps = top["steps"]
    if not isinstance(steps, list) or not steps:
        c.fail(top.line_of("steps"), "steps must be a non-empty list")
    scenario.steps = [c.step(raw, steps.line_of(i), i + 1) for i, raw in enumerate(steps)]
    scenario.groups = list(c.groups.values())
    scenario.expectations = c.expectations(top["expect"], top.line_of("expect"))
    return scenario


def _header(c: StepChecker, top: LocatedDict, scenario: Scenario) -> None:
    if "sources" in top:
        sources = top["sources"]
        if not isinstance(sources, list):
            c.fail(top.line_of("sources"), "sources must be a list of {seed: pt|en, quote: ...}")
        for i, item in enumerate(sources):
            where = f"sources[{i + 1}]"
            item = c.mapping(item, sources.line_of(i), where)
            c.keys(item, ("seed", "quote", "why", "paraphrase", "gloss"), required=("seed", "quote"), where=where)
            # paraphrase: the text says in other words what the source text says (shown as such,
            # never as a quotation); without it, the quote is the source text's own words.
            # gloss: an English rendering of a Portuguese quote (source text 000), shown under it.
            scenario.sources.append({"seed": c.choice(item, "seed", tuple(SEEDS), where),
                                     "quote": c.text(item, "quote", where, required=True).strip(),
                                     "why": (c.text(item, "why", where) or "").strip(),
                                     "paraphrase": c.flag(item, "paraphrase", where, default=False),
                                     "gloss": (c.text(item, "gloss", where) or "").strip()})
    if "requires" in top:
        requires = top["requires"]
        if not isinstance(requires, list):
            c.fail(top.line_of("requires"), "requires must be a list of broker capabilities")
        for i, capability in enumerate(requires):
            if not isinstance(capability, str) or capability not in CAPABILITIES:
                c.fail(requires.line_of(i), f"requires: unknown broker capability {capability!r} "
                       f"(known: {', '.join(CAPABILITIES)})")
            scenario.requires.append(capability)
    if "recorded" in top:
        scenario.recorded = c.mapping(top["recorded"], top.line_of("recorded"), "recorded")


def _setup(c: StepChecker, setup: LocatedDict, scenario: Scenario) -> None:
    c.keys(setup, SETUP_KEYS, where="setup")
    scenario.partitions = c.number(setup, "partitions", "setup", Limits.PARTITIONS, default=1)
    raw_groups = c.mapping(setup.get("groups", located(setup.line, payments=located(setup.line, strategy="none"))),
                           setup.line_of("groups"), "setup.groups")
    for group_name, spec in raw_groups.items():
        line, where = raw_groups.line_of(group_name), f"setup.groups.{group_name}"
        c.name(group_name, line, "setup.groups: a group name")
        spec = c.mapping(located(line, strategy=spec) if isinstance(spec, str) else spec, line, where)
        c.keys(spec, ("strategy", "lane"), required=("strategy",), where=where)
        lane = c.name(spec["lane"], spec.line_of("lane"), f"{where}.lane") if "lane" in spec else None
        if lane and lane in c.lanes:
            c.fail(spec.line_of("lane"), f"{where}: lane {lane!r} is used by another group")
        strategy = c.choice(spec, "strategy", (*strategies.NAMES, OUTSIDE_STRATEGY), where)
        if strategy == OUTSIDE_STRATEGY and lane != group_name:
            # The lab names an outside consumer's group after its lane (create_yours): one name for both.
            c.fail(line, f"{where}: your consumer's group is named after its lane: write "
                   f"`{lane or group_name}: {{strategy: {OUTSIDE_STRATEGY}, lane: {lane or group_name}}}`")
        c.groups[group_name] = Group(group_name, strategy, lane)
        c.lanes.update([lane] if lane else [])
    if "ttl" in setup:
        ttl_op = STEP_OPERATIONS["ttl"]
        body = c.mapping(setup["ttl"], setup.line_of("ttl"), "setup.ttl")
        keys = field_keys(ttl_op.model)
        c.keys(body, tuple(keys), where="setup.ttl")
        scenario.ttl = c.validate(ttl_op, dict(body), body, keys, "setup.ttl")
