"""What a scenario waits for and expects: conditions on consumers, groups, the verdict, accounts,
the dedup tables and the log, checked with their lines and described for a person.

These are not operations (nothing changes in the lab), so they are the scenario format's own;
their words come from the lab's vocabulary (consumer states, crash points, statuses)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from ..domain import events
from ..domain.lab import NAME, NAME_RULE
from ..domain.vocabulary import CONSUMER_STATES, CRASH_POINTS, DEDUP_TABLES, DEFAULT_GROUP
from .marks import Checker, LocatedDict, hint

VERDICT_FIELDS = ("transactions", "duplicates_applied", "transactions_applied_twice", "effects_lost",
                  "source_duplicates_absorbed", "source_duplicates", "redeliveries_absorbed", "dead_letters",
                  "not_yet_applied", "sets_regressed", "sets_changed_by_redelivery",
                  "audit_rows_duplicated")
# How long one wait step may take (seconds): a scenario's own bound, not an operation's.
WAIT_SECONDS = (0.5, 120.0)
DEFAULT_WAIT = 30.0
COMPARISON = re.compile(r"^\s*(>=|<=|==|!=|>|<)?\s*(-?\d+(?:\.\d+)?)\s*$")
SUBJECTS = {"consumer": ("consumer", "state", "assigned", "step_at", "applied", "absorbed", "commit_failures"),
            "caught_up": ("caught_up",), "no_committed_offset": ("no_committed_offset",), "verdict": ("verdict", "lane"),
            "account": ("account", "balance", "status", "lane"), "dedup": ("dedup", "rows", "oldest_age", "lane"),
            "log_end": ("log_end",), "all": ("all",)}
WAIT_KEYS = tuple(dict.fromkeys(key for keys in SUBJECTS.values() for key in keys)) + ("timeout",)
EXPECT_KEYS = ("verdict", "accounts", "dlq", "commit_failures", "dedup", "log_end", "lanes", "notifications",
               "out_of_order")
# Per account, as the Notifications panel counts them (webapp/readmodel/notifications.py).
NOTIFICATION_FIELDS = ("sent", "received", "delivered", "duplicates", "replays")
LANE_EXPECT_KEYS = ("verdict", "accounts", "dedup")


@dataclass
class Group:
    name: str
    strategy: str
    lane: str | None = None


@dataclass
class Expectation:
    label: str          # what is checked, like "verdict duplicates_applied" or "lane atomic: acc-1 actual"
    kind: str           # verdict | account | dlq | commit_failures | dedup | log_end
    target: dict[str, Any]
    comparison: tuple[str, float] | str
    line: int

    @property
    def wanted(self) -> str:
        return format_comparison(self.comparison)


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
    return observed == comparison


def describe_condition(c: dict[str, Any]) -> str:
    if "all" in c:
        return " and ".join(describe_condition(part) for part in c["all"])
    lane = f" on lane {c['lane']}" if c.get("lane") else ""
    if "consumer" in c:
        parts = [f"is {' or '.join(c['state'])}"] if "state" in c else []
        if c.get("assigned") is not None:
            parts.append("is assigned a partition" if c["assigned"] else "has no partition")
        if "step_at" in c:
            parts.append(f"waits at {c['step_at']}")
        parts += [f"{key} {format_comparison(c[key])}" for key in ("applied", "absorbed", "commit_failures")
                  if key in c]
        return f"consumer {c['consumer']} " + " and ".join(parts)
    if "caught_up" in c:
        return f"group {c['caught_up']} has consumed and committed everything published"
    if "no_committed_offset" in c:
        return (f"the broker holds no committed offset of group {c['no_committed_offset']} "
                "(as the lab reads the group's offsets, every few seconds)")
    if "verdict" in c:
        return "verdict " + ", ".join(f"{k} {format_comparison(v)}" for k, v in c["verdict"].items()) + lane
    if "account" in c:
        parts = ([f"balance {format_comparison(c['balance'])} cents"] if "balance" in c else []) + (
            [f"status {c['status']}"] if "status" in c else [])
        return f"account {c['account']} " + " and ".join(parts) + lane
    if "dedup" in c:
        return f"{c['dedup']} " + " and ".join(f"{k} {format_comparison(c[k])}" for k in ("rows", "oldest_age")
                                              if k in c) + lane
    if "log_end" in c:
        return f"the topic holds {format_comparison(c['log_end'])} record(s)"
    return "?"


class ConditionChecker(Checker):
    """Checks waits and expectations against what the steps so far declared: groups, lanes and
    consumers by name."""

    def __init__(self, source: str, groups: dict[str, Group]):
        super().__init__(source)
        self.groups = groups
        self.consumers: dict[str, str] = {}   # name -> group
        self.events: set[str] = set()
        self.lanes = {g.lane for g in groups.values() if g.lane}

    def name(self, value, line, where) -> str:
        if not isinstance(value, str) or not NAME.match(value):
            self.fail(line, f"{where} must be a name: {NAME_RULE} (got {value!r})")
        return value

    def comparison(self, value, line, where):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return ("==", value)
        match = COMPARISON.match(value) if isinstance(value, str) else None
        if match is None:
            self.fail(line, f"{where}: give a number or a comparison like '>= 1', '< 3', not {value!r}")
        number = match.group(2)
        return (match.group(1) or "==", float(number) if "." in number else int(number))

    def consumer(self, body, where, key="consumer") -> str:
        if key not in body:
            self.fail(body.line, f"{where} needs {key!r} (a name given in a start step)")
        name = self.name(body[key], body.line_of(key), f"{where}.{key}")
        if name not in self.consumers:
            self.fail(body.line_of(key), f"{where}: no consumer {name!r} was started before this step"
                      + (f" (started: {', '.join(self.consumers)})" if self.consumers else ""))
        return name

    def group(self, body, where, key="group") -> str:
        group = self.name(body.get(key, DEFAULT_GROUP), body.line_of(key), f"{where}.{key}")
        if group not in self.groups:
            self.fail(body.line_of(key), f"{where}: no group {group!r} in setup.groups or an earlier group step"
                      f" (groups: {', '.join(self.groups)})")
        return group

    def lane(self, body, where, key="lane") -> str:
        lane = self.name(body[key], body.line_of(key), f"{where}.{key}")
        if lane not in self.lanes:
            self.fail(body.line_of(key), f"{where}: no group works on lane {lane!r}"
                      + (f" (lanes: {', '.join(sorted(self.lanes))})" if self.lanes else ""))
        return lane

    # --- waits ------------------------------------------------------------------------------

    def wait(self, body: LocatedDict, where: str) -> dict[str, Any]:
        timeout = self.number(body, "timeout", where, WAIT_SECONDS, default=DEFAULT_WAIT, whole=False)
        return {**self.condition(body, where), "timeout": float(timeout)}

    def condition(self, body: LocatedDict, where: str) -> dict[str, Any]:
        subjects = [key for key in SUBJECTS if key in body]
        if len(subjects) != 1:
            self.fail(body.line, f"{where}: say what to wait for with exactly one of {', '.join(SUBJECTS)}"
                      + (f" (got {', '.join(subjects)})" if subjects else ""))
        subject = subjects[0]
        self.keys(body, SUBJECTS[subject] + ("timeout",), where=f"{where} (waiting on {subject})")
        c: dict[str, Any] = {"lane": self.lane(body, where)} if "lane" in body else {}
        if subject == "all":
            parts = body["all"]
            if not isinstance(parts, list) or not parts:
                self.fail(body.line_of("all"), f"{where}.all must be a list of conditions")
            return {"all": [self.condition(self.mapping(part, parts.line_of(i), f"{where}.all[{i + 1}]"),
                                           f"{where}.all[{i + 1}]") for i, part in enumerate(parts)]}
        if subject == "consumer":
            c["consumer"] = self.consumer(body, where)
            if "state" in body:
                states = body["state"] if isinstance(body["state"], list) else [body["state"]]
                for state in states:
                    if state not in CONSUMER_STATES:
                        close = hint(state, CONSUMER_STATES)
                        self.fail(body.line_of("state"), f"{where}.state: {state!r} is not one of "
                                  f"{', '.join(CONSUMER_STATES)}" + (f"; {close}" if close else ""))
                c["state"] = list(states)
            if "assigned" in body:
                c["assigned"] = self.flag(body, "assigned", where, True)
            if "step_at" in body:
                c["step_at"] = self.choice(body, "step_at", CRASH_POINTS, where)
            c.update({key: self.comparison(body[key], body.line_of(key), f"{where}.{key}")
                      for key in ("applied", "absorbed", "commit_failures") if key in body})
            if len(c) == 1:
                self.fail(body.line, f"{where}: say what consumer {c['consumer']!r} should reach (state, assigned, "
                          "step_at, applied, absorbed or commit_failures)")
        elif subject == "caught_up":
            c["caught_up"] = self.group(body, where, key="caught_up")
        elif subject == "no_committed_offset":
            c["no_committed_offset"] = self.group(body, where, key="no_committed_offset")
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
            c["dedup"] = self.choice(body, "dedup", tuple(DEDUP_TABLES), where)
            c.update({key: self.comparison(body[key], body.line_of(key), f"{where}.{key}")
                      for key in ("rows", "oldest_age") if key in body})
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

    # --- expectations -----------------------------------------------------------------------

    def expectations(self, raw, line) -> list[Expectation]:
        expect = self.mapping(raw, line, "expect")
        if not expect:
            self.fail(line, "expect must hold at least one expectation")
        self.keys(expect, EXPECT_KEYS, where="expect")
        result: list[Expectation] = []
        self._scope(expect, None, result, "expect")
        for key, label in (("dlq", "dead letters (DLQ)"), ("log_end", "records in the topic")):
            if key in expect:
                result.append(Expectation(label, key, {}, self.comparison(expect[key], expect.line_of(key),
                                                                         f"expect.{key}"), expect.line_of(key)))
        if "commit_failures" in expect:
            value = expect["commit_failures"]
            if isinstance(value, dict):
                for name, comparison in value.items():
                    if name not in self.consumers:
                        self.fail(value.line_of(name), f"expect.commit_failures: no consumer {name!r} was started")
                    result.append(Expectation(f"{name} commit failures", "commit_failures", {"consumer": name},
                                              self.comparison(comparison, value.line_of(name),
                                                              f"expect.commit_failures.{name}"), value.line_of(name)))
            else:
                result.append(Expectation("commit failures (all consumers)", "commit_failures", {},
                                          self.comparison(value, expect.line_of("commit_failures"),
                                                          "expect.commit_failures"), expect.line_of("commit_failures")))
        if "notifications" in expect:
            self._notifications(expect, result)
        if "out_of_order" in expect:
            self._out_of_order(expect, result)
        if "lanes" in expect:
            lanes = self.mapping(expect["lanes"], expect.line_of("lanes"), "expect.lanes")
            for lane, scope in lanes.items():
                if lane not in self.lanes:
                    self.fail(lanes.line_of(lane), f"expect.lanes: no group works on lane {lane!r}"
                              + (f" (lanes: {', '.join(sorted(self.lanes))})" if self.lanes else ""))
                scope = self.mapping(scope, lanes.line_of(lane), f"expect.lanes.{lane}")
                self.keys(scope, LANE_EXPECT_KEYS, where=f"expect.lanes.{lane}")
                self._scope(scope, lane, result, f"expect.lanes.{lane}")
        return result

    def _out_of_order(self, expect: LocatedDict, result: list) -> None:
        """``out_of_order: {acc-1: ">= 1", acc-2: 0}``: records of each account that landed after a
        record their producer sent later (webapp/readmodel/ordering.py)."""
        accounts = self.mapping(expect["out_of_order"], expect.line_of("out_of_order"), "expect.out_of_order")
        if not accounts:
            self.fail(accounts.line, "expect.out_of_order: give at least one account and a count")
        for account, value in accounts.items():
            result.append(Expectation(f"{account} records out of order", "out_of_order", {"account": account},
                                      self.comparison(value, accounts.line_of(account), f"expect.out_of_order.{account}"),
                                      accounts.line_of(account)))

    def _notifications(self, expect: LocatedDict, result: list) -> None:
        """``notifications: {acc-1: {sent: 2, received: 2, duplicates: 1}}``: the lab's, per account."""
        accounts = self.mapping(expect["notifications"], expect.line_of("notifications"), "expect.notifications")
        for account, spec in accounts.items():
            here = f"expect.notifications.{account}"
            spec = self.mapping(spec, accounts.line_of(account), here)
            self.keys(spec, NOTIFICATION_FIELDS, where=here)
            if not spec:
                self.fail(spec.line, f"{here}: give {', '.join(NOTIFICATION_FIELDS)}")
            for key, value in spec.items():
                result.append(Expectation(f"{account} notifications {key}", "notifications",
                                          {"account": account, "field": key},
                                          self.comparison(value, spec.line_of(key), f"{here}.{key}"), spec.line_of(key)))

    def _scope(self, scope: LocatedDict, lane: str | None, result: list, where: str) -> None:
        prefix, target = (f"lane {lane}: ", {"lane": lane}) if lane else ("", {})
        if "verdict" in scope:
            for key, comparison in self.verdict(scope["verdict"], scope.line_of("verdict"), f"{where}.verdict").items():
                result.append(Expectation(f"{prefix}verdict {key}", "verdict", {**target, "field": key}, comparison,
                                          scope["verdict"].line_of(key)))
        if "accounts" in scope:
            accounts = self.mapping(scope["accounts"], scope.line_of("accounts"), f"{where}.accounts")
            for account, spec in accounts.items():
                here = f"{where}.accounts.{account}"
                spec = self.mapping(spec, accounts.line_of(account), here)
                self.keys(spec, ("actual", "expected", "status", "expected_status"), where=here)
                if not spec:
                    self.fail(spec.line, f"{here}: give actual, expected, status or expected_status")
                for key, value in spec.items():
                    comparison = (self.choice(spec, key, events.STATUSES, here) if key in ("status", "expected_status")
                                  else self.comparison(value, spec.line_of(key), f"{here}.{key}"))
                    unit = " (cents)" if key in ("actual", "expected") else ""
                    result.append(Expectation(f"{prefix}{account} {key}{unit}", "account",
                                              {**target, "account": account, "field": key}, comparison,
                                              spec.line_of(key)))
        if "dedup" in scope:
            dedup = self.mapping(scope["dedup"], scope.line_of("dedup"), f"{where}.dedup")
            self.keys(dedup, tuple(DEDUP_TABLES), where=f"{where}.dedup")
            for table, value in dedup.items():
                result.append(Expectation(f"{prefix}{table} rows", "dedup", {**target, "table": table},
                                          self.comparison(value, dedup.line_of(table), f"{where}.dedup.{table}"),
                                          dedup.line_of(table)))
