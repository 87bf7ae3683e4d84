"""Scenario files: YAML read with line numbers, checked against the format, turned into a Scenario.

PyYAML's nodes carry marks; a SafeLoader subclass keeps the line of every mapping key and list
item, so an error names ``file:line`` and what was wrong there ("unknown key 'consumr' in step
3 (start): did you mean 'consumer'?"). The format is documented in the README ("Scenarios").
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .. import events, producer, strategies
from ..kafka import OffsetReset
from ..labs import NAME
from ..strategies.base import POINTS

CONSUMER_STATES = ("starting", "running", "frozen", "stepping", "crashed", "killed", "stopped", "failed")
VERDICT_FIELDS = ("transactions", "duplicates_applied", "transactions_applied_twice", "effects_lost",
                  "source_duplicates_absorbed", "source_duplicates", "redeliveries_absorbed", "dead_letters",
                  "not_yet_applied")
DEDUP_TABLES = ("processed_events", "processed_transactions")
SEEDS = {"pt": "Idempotência — o pilar do at-least-once (seeds/000)",
         "en": "Idempotency, Part IV — Reliability (seeds/001)"}
# What a scenario may require of the broker, and why (../shared/BROKER.md).
CAPABILITIES = {
    "max-poll-interval-handover": "a member that stalls past max.poll.interval.ms hands its partitions to a "
                                  "new member",
}
MAX_TIMEOUT = 120.0
DEFAULT_TIMEOUT = 30.0
COMPARISON = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(-?\d+(?:\.\d+)?)\s*$")


class ScenarioError(ValueError):
    """A scenario file that does not follow the format; the message carries ``file:line``."""

    def __init__(self, source: str, line: int | None, message: str):
        self.source = source
        self.line = line
        self.problem = message
        super().__init__(f"{source}:{line}: {message}" if line else f"{source}: {message}")


# --- YAML with line numbers ---------------------------------------------------------------

class LocatedDict(dict):
    line: int = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: dict[Any, int] = {}

    def line_of(self, key) -> int:
        return self.lines.get(key, self.line)


class LocatedList(list):
    line: int = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps line numbers and refuses duplicate keys."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int)):
            raise ScenarioError(loader.name, line, f"a key must be a word, not {key!r}")
        if key in result:
            raise ScenarioError(loader.name, line, f"key {key!r} appears twice (first on line {result.lines[key]})")
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = line
    return result


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    result = LocatedList()
    result.line = node.start_mark.line + 1
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.lines.append(item.start_mark.line + 1)
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def parse_yaml(text: str, source: str) -> Any:
    loader = _Loader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        raise ScenarioError(source, mark.line + 1 if mark else None,
                            f"not valid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise ScenarioError(source, None, f"not valid YAML: {error}") from None
    finally:
        loader.dispose()


# --- the model --------------------------------------------------------------------------------

@dataclass
class Step:
    index: int          # 1-based
    action: str
    args: dict[str, Any]
    line: int
    note: str | None = None

    def describe(self) -> str:
        return describe_step(self.action, self.args)


@dataclass
class Expectation:
    label: str          # what is checked, like "verdict.duplicates_applied" or "lane atomic: acc-1 actual"
    kind: str           # verdict | account | dlq | commit_failures | dedup | log_end
    target: dict[str, Any]
    comparison: tuple[str, float] | str
    line: int

    @property
    def wanted(self) -> str:
        return format_comparison(self.comparison)


@dataclass
class Group:
    name: str
    strategy: str
    lane: str | None = None


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


# --- checking helpers -------------------------------------------------------------------------

class _Checker:
    def __init__(self, source: str):
        self.source = source

    def fail(self, line: int | None, message: str):
        raise ScenarioError(self.source, line, message)

    def mapping(self, value: Any, line: int, where: str) -> LocatedDict:
        if not isinstance(value, dict):
            self.fail(line, f"{where} must be a mapping (key: value lines), not {_kind(value)}")
        return value

    def keys(self, mapping: LocatedDict, allowed, required=(), where: str = "") -> None:
        for key in mapping:
            if key not in allowed:
                hint = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1)
                self.fail(mapping.line_of(key), f"unknown key {key!r} in {where}"
                          + (f": did you mean {hint[0]!r}?" if hint else "")
                          + f" (allowed: {', '.join(allowed)})")
        for key in required:
            if key not in mapping:
                self.fail(mapping.line, f"{where} needs {key!r}")

    def text(self, mapping, key, where, required=False, default=None) -> str | None:
        if key not in mapping:
            if required:
                self.fail(getattr(mapping, "line", None), f"{where} needs {key!r}")
            return default
        value = mapping[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(mapping.line_of(key), f"{where}.{key} must be text, not {_kind(value)}")
        return value

    def choice(self, mapping, key, choices, where, default=None):
        if key not in mapping:
            if default is None:
                self.fail(mapping.line, f"{where} needs {key!r} (one of {', '.join(map(str, choices))})")
            return default
        value = mapping[key]
        if value not in choices:
            hint = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            self.fail(mapping.line_of(key), f"{where}.{key}: {value!r} is not one of {', '.join(map(str, choices))}"
                      + (f"; did you mean {hint[0]!r}?" if hint else ""))
        return value

    def number(self, mapping, key, where, low, high, default=None, whole=True):
        if key not in mapping:
            if default is None:
                self.fail(mapping.line, f"{where} needs {key!r}")
            return default
        value = mapping[key]
        ok = isinstance(value, int) if whole else isinstance(value, (int, float))
        if not ok or isinstance(value, bool) or not low <= value <= high:
            self.fail(mapping.line_of(key), f"{where}.{key} must be a {'whole ' if whole else ''}number from "
                      f"{low} to {high}, not {value!r}")
        return value

    def flag(self, mapping, key, where, default: bool) -> bool:
        if key not in mapping:
            return default
        if not isinstance(mapping[key], bool):
            self.fail(mapping.line_of(key), f"{where}.{key} must be true or false, not {mapping[key]!r}")
        return mapping[key]

    def name(self, value, line, where) -> str:
        if not isinstance(value, str) or not NAME.match(value):
            self.fail(line, f"{where} must be a name: a lowercase letter, then up to 23 lowercase letters, digits "
                      f"or _ (got {value!r})")
        return value

    def comparison(self, value, line, where):
        if isinstance(value, bool):
            self.fail(line, f"{where}: give a number or a comparison like '>= 1', not {value!r}")
        if isinstance(value, (int, float)):
            return ("==", value)
        if isinstance(value, str):
            match = COMPARISON.match(value)
            if match:
                return (match.group(1) or "==", float(match.group(2)) if "." in match.group(2) else int(match.group(2)))
        self.fail(line, f"{where}: give a number or a comparison like '>= 1', '< 3', not {value!r}")


def _kind(value: Any) -> str:
    if value is None:
        return "nothing"
    return {dict: "a mapping", LocatedDict: "a mapping", list: "a list", LocatedList: "a list", str: "text",
            bool: "true/false", int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def format_comparison(comparison) -> str:
    if isinstance(comparison, tuple):
        op, number = comparison
        return f"{number}" if op == "==" else f"{op} {number}"
    return str(comparison)


def compare(observed: Any, comparison) -> bool:
    if isinstance(comparison, tuple):
        op, number = comparison
        if observed is None or isinstance(observed, bool) or not isinstance(observed, (int, float)):
            return False
        return {">=": observed >= number, "<=": observed <= number, ">": observed > number,
                "<": observed < number, "==": observed == number, "!=": observed != number}[op]
    if isinstance(comparison, (list, tuple)):
        return observed in comparison
    return observed == comparison


# --- steps --------------------------------------------------------------------------------------

CONSUMER_VERBS = ("kill", "freeze", "thaw", "stop", "restart", "disarm", "step")
STEP_KEYS = {
    "publish": ("account", "amount", "amount_cents", "type", "status", "mode", "count", "event", "as",
                "idempotent", "transaction_id", "poison_kind"),
    "start": ("consumer", "group"),
    "arm": ("consumer", "point", "action", "always"),
    "step_mode": ("consumer", "on"),
    "group": ("name", "strategy", "lane"),
    "strategy": ("group", "strategy"),
    "reset_offsets": ("group", "mode", "offsets", "back", "timestamp"),
    "ttl": ("seconds", "schedule_seconds"),
    "ttl_cleanup": ("seconds",),
    "lost_ack": ("drop_produce_responses", "delay_ms"),
    "wait": ("timeout", "consumer", "state", "assigned", "step_at", "applied", "absorbed", "commit_failures",
             "caught_up", "verdict", "lane", "account", "balance", "status", "dedup", "rows", "oldest_age",
             "log_end", "all"),
    **{verb: ("consumer",) for verb in CONSUMER_VERBS},
}
ACTIONS = tuple(STEP_KEYS)
STEP_META = ("note", "title")


def describe_step(action: str, a: dict[str, Any]) -> str:
    if action == "publish":
        mode = a.get("mode", "normal")
        if mode in ("resend", "source-duplicate"):
            return f"publish {mode} of {a.get('event') or 'the newest event'}"
        if mode == "poison":
            return f"publish a poison pill ({a.get('poison_kind', 'not-json')})"
        what = (f"credit {a['account']} +{a['amount_cents'] / 100:.2f}" if a.get("type", "credit") == "credit"
                else f"set_status {a['account']} = {a.get('status')}")
        producer_kind = "" if a.get("idempotent", True) else " (plain producer)"
        return (f"publish {a['count']} × {what}" if mode == "burst" else f"publish {what}") + producer_kind
    if action == "start":
        return f"start consumer {a['consumer']} in group {a['group']}"
    if action in CONSUMER_VERBS:
        return f"{action.replace('disarm', 'disarm')} {a['consumer']}"
    if action == "arm":
        return (f"arm {a['consumer']}: {a['action']} at {a['point']}"
                + (" (every time)" if a.get("always") else " (once)"))
    if action == "step_mode":
        return f"step mode {'on' if a['on'] else 'off'} for {a['consumer']}"
    if action == "group":
        return f"create group {a['name']} ({a['strategy']})" + (f" on lane {a['lane']}" if a.get("lane") else "")
    if action == "strategy":
        return f"switch group {a['group']} to {a['strategy']}"
    if action == "reset_offsets":
        extra = {"back": f" back {a.get('back')}", "offset": f" to {a.get('offsets')}",
                 "timestamp": f" to {a.get('timestamp')}"}.get(a["mode"], "")
        return f"reset offsets of group {a['group']} ({a['mode']}{extra})"
    if action == "ttl":
        return "set the dedup TTL: " + ", ".join(f"{k} {v}" for k, v in a.items())
    if action == "ttl_cleanup":
        return "run the TTL cleanup now" + (f" ({a['seconds']} s)" if "seconds" in a else "")
    if action == "lost_ack":
        return (f"arm the fault proxy: drop the next {a['drop_produce_responses']} Produce response(s)"
                + (f", delay {a['delay_ms']} ms" if a.get("delay_ms") else ""))
    if action == "wait":
        return "wait until " + describe_condition(a) + f" (at most {a['timeout']:g} s)"
    return action


def describe_condition(c: dict[str, Any]) -> str:
    if "all" in c:
        return " and ".join(describe_condition(part) for part in c["all"])
    lane = f" on lane {c['lane']}" if c.get("lane") else ""
    if "consumer" in c:
        parts = []
        if "state" in c:
            parts.append(f"is {' or '.join(c['state'])}")
        if c.get("assigned") is not None:
            parts.append("is assigned a partition" if c["assigned"] else "has no partition")
        if "step_at" in c:
            parts.append(f"waits at {c['step_at']}")
        for key in ("applied", "absorbed", "commit_failures"):
            if key in c:
                parts.append(f"{key} {format_comparison(c[key])}")
        return f"consumer {c['consumer']} " + " and ".join(parts)
    if "caught_up" in c:
        return f"group {c['caught_up']} has consumed and committed everything published"
    if "verdict" in c:
        return "verdict " + ", ".join(f"{k} {format_comparison(v)}" for k, v in c["verdict"].items()) + lane
    if "account" in c:
        parts = []
        if "balance" in c:
            parts.append(f"balance {format_comparison(c['balance'])} cents")
        if "status" in c:
            parts.append(f"status {c['status']}")
        return f"account {c['account']} " + " and ".join(parts) + lane
    if "dedup" in c:
        parts = [f"{k} {format_comparison(c[k])}" for k in ("rows", "oldest_age") if k in c]
        return f"{c['dedup']} " + " and ".join(parts) + lane
    if "log_end" in c:
        return f"the topic holds {format_comparison(c['log_end'])} record(s)"
    return "?"


class _StepChecker(_Checker):
    def __init__(self, source: str, groups: dict[str, Group]):
        super().__init__(source)
        self.groups = groups
        self.consumers: dict[str, str] = {}   # name -> group
        self.events: set[str] = set()
        self.lanes = {g.lane for g in groups.values() if g.lane}

    def step(self, raw: Any, line: int, index: int) -> Step:
        where = f"step {index}"
        if not isinstance(raw, dict):
            self.fail(line, f"{where} must be a mapping with one action ({', '.join(ACTIONS)}), not {_kind(raw)}")
        actions = [k for k in raw if k not in STEP_META]
        if len(actions) != 1:
            if not actions:
                self.fail(raw.line, f"{where} has no action: give one of {', '.join(ACTIONS)}")
            unknown = [k for k in actions if k not in ACTIONS]
            if unknown:
                self._unknown_action(raw, unknown[0], where)
            self.fail(raw.line_of(actions[1]), f"{where} has two actions ({actions[0]!r} and {actions[1]!r}): "
                      "one action per step")
        action = actions[0]
        if action not in ACTIONS:
            self._unknown_action(raw, action, where)
        note = self.text(raw, "note", where) if "note" in raw else None
        value = raw[action]
        value_line = raw.line_of(action)
        where = f"{where} ({action})"
        if action in CONSUMER_VERBS and not isinstance(value, dict):
            value = LocatedDict(consumer=value)
            value.line = value_line
        if action == "ttl_cleanup" and value is None:
            value = LocatedDict()
            value.line = value_line
        body = self.mapping(value, value_line, where)
        self.keys(body, STEP_KEYS[action], where=where)
        args = getattr(self, f"_act_{action}")(body, where)
        return Step(index=index, action=action, args=args, line=value_line, note=note)

    def _unknown_action(self, raw, action, where):
        hint = difflib.get_close_matches(str(action), ACTIONS + STEP_META, n=1)
        self.fail(raw.line_of(action), f"unknown action {action!r} in {where}"
                  + (f": did you mean {hint[0]!r}?" if hint else "") + f" (actions: {', '.join(ACTIONS)})")

    def _consumer(self, body, where, new=False) -> str:
        if "consumer" not in body:
            self.fail(body.line, f"{where} needs 'consumer' (a name given in a start step)")
        name = self.name(body["consumer"], body.line_of("consumer"), f"{where}.consumer")
        if new:
            if name in self.consumers:
                self.fail(body.line_of("consumer"), f"{where}: consumer {name!r} was started already")
        elif name not in self.consumers:
            self.fail(body.line_of("consumer"), f"{where}: no consumer {name!r} was started before this step"
                      + (f" (started: {', '.join(self.consumers)})" if self.consumers else ""))
        return name

    def _group_name(self, body, where, key="group") -> str:
        group = self.name(body.get(key, "payments"), body.line_of(key), f"{where}.{key}")
        if group not in self.groups:
            self.fail(body.line_of(key), f"{where}: no group {group!r} in setup.groups or an earlier group step"
                      f" (groups: {', '.join(self.groups)})")
        return group

    def _lane(self, body, where) -> str | None:
        if "lane" not in body:
            return None
        lane = self.name(body["lane"], body.line_of("lane"), f"{where}.lane")
        if lane not in self.lanes:
            self.fail(body.line_of("lane"), f"{where}: no group works on lane {lane!r}"
                      + (f" (lanes: {', '.join(sorted(self.lanes))})" if self.lanes else ""))
        return lane

    def _act_publish(self, body, where):
        args: dict[str, Any] = {"mode": self.choice(body, "mode", producer.MODES, where, default="normal"),
                                "idempotent": self.flag(body, "idempotent", where, True)}
        if "as" in body:
            ref = self.name(body["as"], body.line_of("as"), f"{where}.as")
            self.events.add(ref)
            args["as"] = ref
        mode = args["mode"]
        if mode == "poison":
            args["poison_kind"] = self.choice(body, "poison_kind", tuple(events.POISON_PILLS), where,
                                              default="not-json")
            return args
        if mode in ("resend", "source-duplicate"):
            if "event" in body:
                ref = self.name(body["event"], body.line_of("event"), f"{where}.event")
                if ref not in self.events:
                    self.fail(body.line_of("event"), f"{where}: no earlier publish step named its event {ref!r} "
                              "(name one with `as: NAME`)")
                args["event"] = ref
            for key in ("account", "amount", "amount_cents", "type", "status", "count", "transaction_id"):
                if key in body:
                    self.fail(body.line_of(key), f"{where}: {key!r} does not apply to mode {mode} "
                              "(it repeats an earlier event)")
            return args
        account = body.get("account", "acc-1")
        if not isinstance(account, str) or not events.ACCOUNT_ID.match(account):
            self.fail(body.line_of("account"), f"{where}.account must be an account id like acc-1")
        args["account"] = account
        args["type"] = self.choice(body, "type", events.EVENT_TYPES, where, default="credit")
        if args["type"] == "credit":
            if "amount" in body and "amount_cents" in body:
                self.fail(body.line_of("amount_cents"), f"{where}: give amount or amount_cents, not both")
            if "amount_cents" in body:
                args["amount_cents"] = self.number(body, "amount_cents", where, 1, events.MAX_AMOUNT_CENTS)
            else:
                amount = self.number(body, "amount", where, 0.01, events.MAX_AMOUNT_CENTS / 100, default=100,
                                     whole=False)
                args["amount_cents"] = round(amount * 100)
            if "status" in body:
                self.fail(body.line_of("status"), f"{where}: status is for type set_status")
        else:
            args["status"] = self.choice(body, "status", events.STATUSES, where)
        if mode == "burst":
            args["count"] = self.number(body, "count", where, 1, producer.MAX_BURST, default=10)
        elif "count" in body:
            self.fail(body.line_of("count"), f"{where}: count is for mode burst")
        if "transaction_id" in body:
            tid = body["transaction_id"]
            if not isinstance(tid, str) or not events.TRANSACTION_ID.match(tid):
                self.fail(body.line_of("transaction_id"), f"{where}.transaction_id: 1-64 letters, digits or ._:-")
            args["transaction_id"] = tid
        return args

    def _act_start(self, body, where):
        name = self._consumer(body, where, new=True)
        group = self._group_name(body, where)
        self.consumers[name] = group
        return {"consumer": name, "group": group}

    def _act_kill(self, body, where):
        return {"consumer": self._consumer(body, where)}

    _act_freeze = _act_thaw = _act_stop = _act_restart = _act_disarm = _act_step = _act_kill

    def _act_arm(self, body, where):
        return {"consumer": self._consumer(body, where), "point": self.choice(body, "point", POINTS, where),
                "action": self.choice(body, "action", ("crash", "freeze"), where, default="crash"),
                "always": self.flag(body, "always", where, False)}

    def _act_step_mode(self, body, where):
        return {"consumer": self._consumer(body, where), "on": self.flag(body, "on", where, True)}

    def _act_group(self, body, where):
        name = self.name(body.get("name"), body.line_of("name"), f"{where}.name")
        if name in self.groups:
            self.fail(body.line_of("name"), f"{where}: group {name!r} exists already")
        strategy = self.choice(body, "strategy", strategies.NAMES, where)
        lane = self.name(body["lane"], body.line_of("lane"), f"{where}.lane") if "lane" in body else None
        self.groups[name] = Group(name, strategy, lane)
        if lane:
            self.lanes.add(lane)
        return {"name": name, "strategy": strategy, "lane": lane}

    def _act_strategy(self, body, where):
        return {"group": self._group_name(body, where), "strategy": self.choice(body, "strategy", strategies.NAMES, where)}

    def _act_reset_offsets(self, body, where):
        args = {"group": self._group_name(body, where),
                "mode": self.choice(body, "mode", OffsetReset.MODES, where, default="earliest")}
        if args["mode"] == "offset":
            offsets = self.mapping(body.get("offsets"), body.line_of("offsets"), f"{where}.offsets")
            args["offsets"] = {str(p): o for p, o in offsets.items()}
            for p, o in offsets.items():
                if not isinstance(p, int) or not isinstance(o, int) or o < 0:
                    self.fail(offsets.line_of(p), f"{where}.offsets: partition: offset, whole numbers (got {p}: {o})")
        elif args["mode"] == "back":
            args["back"] = self.number(body, "back", where, 1, 1_000_000)
        elif args["mode"] == "timestamp":
            args["timestamp"] = str(self.text(body, "timestamp", where, required=True))
        return args

    def _act_ttl(self, body, where):
        if not body:
            self.fail(body.line, f"{where} needs seconds and/or schedule_seconds")
        args = {}
        if "seconds" in body:
            args["seconds"] = self.number(body, "seconds", where, 0, 90 * 24 * 3600, whole=False)
        if "schedule_seconds" in body:
            args["schedule_seconds"] = self.number(body, "schedule_seconds", where, 0, 90 * 24 * 3600, whole=False)
        return args

    def _act_ttl_cleanup(self, body, where):
        return ({"seconds": self.number(body, "seconds", where, 0, 90 * 24 * 3600, whole=False)}
                if "seconds" in body else {})

    def _act_lost_ack(self, body, where):
        return {"drop_produce_responses": self.number(body, "drop_produce_responses", where, 1, 100, default=1),
                "delay_ms": self.number(body, "delay_ms", where, 0, 60_000, default=0)}

    def _act_wait(self, body, where):
        timeout = self.number(body, "timeout", where, 0.5, MAX_TIMEOUT, default=DEFAULT_TIMEOUT, whole=False)
        condition = self.condition(body, where)
        return {**condition, "timeout": float(timeout)}

    def condition(self, body: LocatedDict, where: str) -> dict[str, Any]:
        subjects = [k for k in ("consumer", "caught_up", "verdict", "account", "dedup", "log_end", "all") if k in body]
        if len(subjects) != 1:
            self.fail(body.line, f"{where}: say what to wait for with exactly one of consumer, caught_up, verdict, "
                      f"account, dedup, log_end, all" + (f" (got {', '.join(subjects)})" if subjects else ""))
        subject = subjects[0]
        allowed = {"consumer": ("consumer", "state", "assigned", "step_at", "applied", "absorbed", "commit_failures"),
                   "caught_up": ("caught_up",), "verdict": ("verdict", "lane"),
                   "account": ("account", "balance", "status", "lane"), "dedup": ("dedup", "rows", "oldest_age", "lane"),
                   "log_end": ("log_end",), "all": ("all",)}[subject]
        self.keys(body, allowed + ("timeout",), where=f"{where} (waiting on {subject})")
        c: dict[str, Any] = {}
        if subject == "all":
            parts = body["all"]
            if not isinstance(parts, list) or not parts:
                self.fail(body.line_of("all"), f"{where}.all must be a list of conditions")
            c["all"] = [self.condition(self.mapping(p, parts.line_of(i), f"{where}.all[{i + 1}]"), f"{where}.all[{i + 1}]")
                        for i, p in enumerate(parts)]
            return c
        lane = self._lane(body, where)
        if lane:
            c["lane"] = lane
        if subject == "consumer":
            c["consumer"] = self._consumer(body, where)
            if "state" in body:
                states = body["state"] if isinstance(body["state"], list) else [body["state"]]
                for state in states:
                    if state not in CONSUMER_STATES:
                        hint = difflib.get_close_matches(str(state), CONSUMER_STATES, n=1)
                        self.fail(body.line_of("state"), f"{where}.state: {state!r} is not one of "
                                  f"{', '.join(CONSUMER_STATES)}" + (f"; did you mean {hint[0]!r}?" if hint else ""))
                c["state"] = list(states)
            if "assigned" in body:
                c["assigned"] = self.flag(body, "assigned", where, True)
            if "step_at" in body:
                c["step_at"] = self.choice(body, "step_at", POINTS, where)
            for key in ("applied", "absorbed", "commit_failures"):
                if key in body:
                    c[key] = self.comparison(body[key], body.line_of(key), f"{where}.{key}")
            if len(c) == 1:
                self.fail(body.line, f"{where}: say what consumer {c['consumer']!r} should reach (state, assigned, "
                          "step_at, applied, absorbed or commit_failures)")
        elif subject == "caught_up":
            c["caught_up"] = self._group_name(body, where, key="caught_up")
        elif subject == "verdict":
            c["verdict"] = self.verdict(body["verdict"], body.line_of("verdict"), f"{where}.verdict")
        elif subject == "account":
            c["account"] = self.text(body, "account", where)
            if "balance" in body:
                c["balance"] = self.comparison(body["balance"], body.line_of("balance"), f"{where}.balance")
            if "status" in body:
                c["status"] = self.choice(body, "status", events.STATUSES, where)
            if "balance" not in c and "status" not in c:
                self.fail(body.line, f"{where}: give the account's balance (cents) or status to wait for")
        elif subject == "dedup":
            c["dedup"] = self.choice(body, "dedup", DEDUP_TABLES, where)
            for key in ("rows", "oldest_age"):
                if key in body:
                    c[key] = self.comparison(body[key], body.line_of(key), f"{where}.{key}")
            if "rows" not in c and "oldest_age" not in c:
                self.fail(body.line, f"{where}: give rows or oldest_age (seconds) to wait for")
        else:
            c["log_end"] = self.comparison(body["log_end"], body.line_of("log_end"), f"{where}.log_end")
        return c

    def verdict(self, value, line, where) -> dict[str, Any]:
        mapping = self.mapping(value, line, where)
        if not mapping:
            self.fail(line, f"{where}: name at least one verdict field ({', '.join(VERDICT_FIELDS)})")
        self.keys(mapping, VERDICT_FIELDS, where=where)
        return {k: self.comparison(v, mapping.line_of(k), f"{where}.{k}") for k, v in mapping.items()}


# --- the whole file ---------------------------------------------------------------------------

TOP_KEYS = ("title", "summary", "narrative", "sources", "requires", "setup", "steps", "expect", "recorded")
SETUP_KEYS = ("partitions", "groups", "ttl")
EXPECT_KEYS = ("verdict", "accounts", "dlq", "commit_failures", "dedup", "log_end", "lanes")
LANE_EXPECT_KEYS = ("verdict", "accounts", "dedup")


def load(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ScenarioError(str(path), None, f"cannot read: {error}") from None
    return loads(text, source=str(path), name=path.stem)


def loads(text: str, source: str = "<scenario>", name: str = "scenario") -> Scenario:
    data = parse_yaml(text, source)
    c = _Checker(source)
    top = c.mapping(data, 1, "a scenario file")
    c.keys(top, TOP_KEYS, required=("title", "narrative", "steps", "expect"), where="the scenario")
    scenario = Scenario(name=name, source=source, title=c.text(top, "title", "title", required=True).strip(),
                        narrative=c.text(top, "narrative", "narrative", required=True),
                        summary=(c.text(top, "summary", "summary") or "").strip())
    if "sources" in top:
        sources = top["sources"]
        if not isinstance(sources, list):
            c.fail(top.line_of("sources"), "sources must be a list of {seed: pt|en, quote: ...}")
        for i, item in enumerate(sources):
            item = c.mapping(item, sources.line_of(i), f"sources[{i + 1}]")
            c.keys(item, ("seed", "quote", "why"), required=("seed", "quote"), where=f"sources[{i + 1}]")
            scenario.sources.append({"seed": c.choice(item, "seed", tuple(SEEDS), f"sources[{i + 1}]"),
                                     "quote": c.text(item, "quote", f"sources[{i + 1}]", required=True).strip(),
                                     "why": (c.text(item, "why", f"sources[{i + 1}]") or "").strip()})
    if "requires" in top:
        requires = top["requires"]
        if not isinstance(requires, list):
            c.fail(top.line_of("requires"), "requires must be a list of broker capabilities")
        for i, capability in enumerate(requires):
            if capability not in CAPABILITIES:
                c.fail(requires.line_of(i), f"requires: unknown broker capability {capability!r} "
                       f"(known: {', '.join(CAPABILITIES)})")
            scenario.requires.append(capability)
    if "recorded" in top:
        scenario.recorded = c.mapping(top["recorded"], top.line_of("recorded"), "recorded")

    groups: dict[str, Group] = {}
    setup = c.mapping(top.get("setup", LocatedDict()), top.line_of("setup"), "setup")
    c.keys(setup, SETUP_KEYS, where="setup")
    scenario.partitions = c.number(setup, "partitions", "setup", 1, 12, default=1)
    raw_groups = setup.get("groups", LocatedDict(payments=LocatedDict(strategy="none")))
    raw_groups = c.mapping(raw_groups, setup.line_of("groups"), "setup.groups")
    for group_name, spec in raw_groups.items():
        line = raw_groups.line_of(group_name)
        c.name(group_name, line, "setup.groups: a group name")
        if isinstance(spec, str):
            spec = LocatedDict(strategy=spec)
            spec.line = line
        spec = c.mapping(spec, line, f"setup.groups.{group_name}")
        c.keys(spec, ("strategy", "lane"), required=("strategy",), where=f"setup.groups.{group_name}")
        lane = c.name(spec["lane"], spec.line_of("lane"), f"setup.groups.{group_name}.lane") if "lane" in spec else None
        if lane and any(g.lane == lane for g in groups.values()):
            c.fail(spec.line_of("lane"), f"setup.groups.{group_name}: lane {lane!r} is used by another group")
        groups[group_name] = Group(group_name, c.choice(spec, "strategy", strategies.NAMES,
                                                        f"setup.groups.{group_name}"), lane)
    scenario.groups = list(groups.values())
    if "ttl" in setup:
        ttl = c.mapping(setup["ttl"], setup.line_of("ttl"), "setup.ttl")
        c.keys(ttl, ("seconds", "schedule_seconds"), where="setup.ttl")
        scenario.ttl = {k: c.number(ttl, k, "setup.ttl", 0, 90 * 24 * 3600, whole=False) for k in ttl}

    steps = top["steps"]
    if not isinstance(steps, list) or not steps:
        c.fail(top.line_of("steps"), "steps must be a non-empty list")
    checker = _StepChecker(source, groups)
    for i, raw in enumerate(steps):
        scenario.steps.append(checker.step(raw, steps.line_of(i), i + 1))
    scenario.groups = list(checker.groups.values())
    scenario.expectations = _expectations(checker, top["expect"], top.line_of("expect"))
    return scenario


def _expectations(c: _StepChecker, raw, line) -> list[Expectation]:
    expect = c.mapping(raw, line, "expect")
    if not expect:
        c.fail(line, "expect must hold at least one expectation")
    c.keys(expect, EXPECT_KEYS, where="expect")
    result: list[Expectation] = []
    _expect_scope(c, expect, None, result, "expect")
    if "dlq" in expect:
        result.append(Expectation("dead letters (DLQ)", "dlq", {},
                                  c.comparison(expect["dlq"], expect.line_of("dlq"), "expect.dlq"), expect.line_of("dlq")))
    if "log_end" in expect:
        result.append(Expectation("records in the topic", "log_end", {},
                                  c.comparison(expect["log_end"], expect.line_of("log_end"), "expect.log_end"),
                                  expect.line_of("log_end")))
    if "commit_failures" in expect:
        value = expect["commit_failures"]
        if isinstance(value, dict):
            for name, comparison in value.items():
                if name not in c.consumers:
                    c.fail(value.line_of(name), f"expect.commit_failures: no consumer {name!r} was started")
                result.append(Expectation(f"{name} commit failures", "commit_failures", {"consumer": name},
                                          c.comparison(comparison, value.line_of(name),
                                                       f"expect.commit_failures.{name}"), value.line_of(name)))
        else:
            result.append(Expectation("commit failures (all consumers)", "commit_failures", {},
                                      c.comparison(value, expect.line_of("commit_failures"), "expect.commit_failures"),
                                      expect.line_of("commit_failures")))
    if "lanes" in expect:
        lanes = c.mapping(expect["lanes"], expect.line_of("lanes"), "expect.lanes")
        for lane, scope in lanes.items():
            if lane not in c.lanes:
                c.fail(lanes.line_of(lane), f"expect.lanes: no group works on lane {lane!r}"
                       + (f" (lanes: {', '.join(sorted(c.lanes))})" if c.lanes else ""))
            scope = c.mapping(scope, lanes.line_of(lane), f"expect.lanes.{lane}")
            c.keys(scope, LANE_EXPECT_KEYS, where=f"expect.lanes.{lane}")
            _expect_scope(c, scope, lane, result, f"expect.lanes.{lane}")
    return result


def _expect_scope(c: _StepChecker, scope: LocatedDict, lane: str | None, result: list, where: str) -> None:
    prefix = f"lane {lane}: " if lane else ""
    target = {"lane": lane} if lane else {}
    if "verdict" in scope:
        for key, comparison in c.verdict(scope["verdict"], scope.line_of("verdict"), f"{where}.verdict").items():
            result.append(Expectation(f"{prefix}verdict {key}", "verdict", {**target, "field": key}, comparison,
                                      scope["verdict"].line_of(key)))
    if "accounts" in scope:
        accounts = c.mapping(scope["accounts"], scope.line_of("accounts"), f"{where}.accounts")
        for account, spec in accounts.items():
            spec = c.mapping(spec, accounts.line_of(account), f"{where}.accounts.{account}")
            c.keys(spec, ("actual", "expected", "status", "expected_status"), where=f"{where}.accounts.{account}")
            if not spec:
                c.fail(spec.line, f"{where}.accounts.{account}: give actual, expected, status or expected_status")
            for key, value in spec.items():
                if key in ("status", "expected_status"):
                    comparison = c.choice(spec, key, events.STATUSES, f"{where}.accounts.{account}")
                else:
                    comparison = c.comparison(value, spec.line_of(key), f"{where}.accounts.{account}.{key}")
                unit = " (cents)" if key in ("actual", "expected") else ""
                result.append(Expectation(f"{prefix}{account} {key}{unit}", "account",
                                          {**target, "account": account, "field": key}, comparison, spec.line_of(key)))
    if "dedup" in scope:
        dedup = c.mapping(scope["dedup"], scope.line_of("dedup"), f"{where}.dedup")
        c.keys(dedup, DEDUP_TABLES, where=f"{where}.dedup")
        for table, value in dedup.items():
            result.append(Expectation(f"{prefix}{table} rows", "dedup", {**target, "table": table},
                                      c.comparison(value, dedup.line_of(table), f"{where}.dedup.{table}"),
                                      dedup.line_of(table)))
