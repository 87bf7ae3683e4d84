"""Record and replay.

Record: every operation that changes a lab (``webapp.operations``: publish, start_consumer,
consumer_action, arm, ... — the same calls the API, the dashboard's forms, the CLI and the
scenario runner make) is appended, as it happens, to the lab's ``session_log`` table: the
operation, its arguments, what it returned, and what the lab looked like just before it
(each consumer's state, the verdict of the lab and of each lane).

Replay: ``export_yaml`` turns the log into an ordinary scenario file. Each operation becomes a
step; before it, a wait until the lab looks as it did when the operation was first performed
(that is "the same waits": a person who killed a consumer after its effect landed is replayed
as "wait until the verdict shows the effect, then kill"). The last wait and the expectations
are the lab's state at export: the replay passes when a fresh lab ends with the same verdict.
Nothing is replayed from wall-clock time: event ids are new on replay (resends and source
duplicates point at the replayed event), a reset to a timestamp is replayed as the offsets it
resolved to.
"""
from __future__ import annotations

import functools
import logging
from datetime import datetime, timezone
from typing import Any, Callable

import yaml
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from ..labs import Lab
from .loader import VERDICT_FIELDS
from .observe import Snapshot, observe

log = logging.getLogger("idempotency_lab.journal")

CONSUMER_OPERATIONS = ("consumer_action", "arm", "set_step_mode", "step")
# Verdict fields that only grow as consumers work, and the one that only shrinks: a replay that
# runs faster than the recording may be past the recorded value, never short of it.
GROWING = ("duplicates_applied", "transactions_applied_twice", "effects_lost", "source_duplicates_absorbed",
           "redeliveries_absorbed", "dead_letters")
SHRINKING = ("not_yet_applied",)
WAIT_TIMEOUT = 45.0


class NothingRecorded(LookupError):
    pass


# --- recording ----------------------------------------------------------------------------------

def recorded(function: Callable) -> Callable:
    """Decorate an operation of ``webapp.operations`` that changes a lab: each call is appended to
    the lab's session log, under the operation's name, with what the lab looked like before it."""
    name = function.__name__

    @functools.wraps(function)
    def wrapper(engine: Engine, lab: Lab, *args: Any, **kwargs: Any) -> Any:
        before = _snapshot(engine, lab) if name != "reset_lab" else None
        result = function(engine, lab, *args, **kwargs)
        try:
            _append(engine, lab, name, args, before, result)
        except SQLAlchemyError as error:  # recording must never break the operation itself
            log.warning("could not record %s in lab %s: %s", name, lab.name, error)
        return result
    return wrapper


def _snapshot(engine: Engine, lab: Lab) -> Snapshot | None:
    try:
        return observe(engine, lab)
    except SQLAlchemyError as error:
        log.warning("could not observe lab %s before an operation: %s", lab.name, error)
        return None


def summarize(snap: Snapshot | None) -> dict[str, Any]:
    """The part of a snapshot a replay waits for: consumers (in start order) and verdicts."""
    if snap is None:
        return {}
    return {"consumers": [{"id": c["id"], "name": c["name"], "state": c["state"], "assigned": bool(c["assigned"])}
                          for _, c in sorted(snap.consumers_by_id.items())],
            "verdicts": {lane or "": verdict for lane, verdict in snap.verdicts.items()}}


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def _append(engine: Engine, lab: Lab, name: str, args: tuple, before: Snapshot | None, result: Any) -> None:
    from ..models import SessionOperation

    recorded: dict[str, Any] = {}
    if name in CONSUMER_OPERATIONS:
        recorded["consumer_id"] = args[0]
        rest = args[1:]
    else:
        rest = args
    if name in ("set_strategy", "reset_offsets"):
        recorded["group"], rest = rest[0], rest[1:]
    if name == "consumer_action":
        recorded["verb"], rest = rest[0], rest[1:]
    if rest and isinstance(rest[0], dict):
        recorded["body"] = rest[0]
    with engine.begin() as conn:
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
        if conn.execute(text("SELECT to_regclass('session_log')")).scalar() is None:
            if conn.execute(text("SELECT to_regclass('consumer_groups')")).scalar() is None:
                return  # no lab schema (yet): nothing to record into
            SessionOperation.__table__.create(conn, checkfirst=True)
        conn.execute(text("INSERT INTO session_log (operation, args, before, result) "
                          "VALUES (:op, CAST(:args AS jsonb), CAST(:before AS jsonb), CAST(:result AS jsonb))"),
                     {"op": name, "args": _dumps(recorded), "before": _dumps(summarize(before)),
                      "result": _dumps(result if isinstance(result, dict) else {"value": result})})


def _dumps(value: Any) -> str:
    import json
    return json.dumps(_jsonable(value))


def session_log(engine: Engine, lab: Lab) -> list[dict[str, Any]]:
    with engine.begin() as conn:
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
        if conn.execute(text("SELECT to_regclass('session_log')")).scalar() is None:
            return []
        return [dict(row) for row in conn.execute(text(
            "SELECT id, at, operation, args, before, result FROM session_log ORDER BY id")).mappings()]


# --- export: the log as a scenario ----------------------------------------------------------------

class _Exporter:
    def __init__(self, lab: Lab, partitions: int):
        self.lab = lab
        self.partitions = partitions
        self.steps: list[dict[str, Any]] = []
        self.names: dict[int, str] = {}          # consumer id -> name in the scenario
        self.groups: dict[str, dict[str, Any]] = {"payments": {"strategy": "none"}}
        self.lanes: dict[str, str] = {}          # lane -> group
        self.events: dict[str, str] = {}         # recorded event id -> ref
        self.last_wait: dict[str, Any] | None = None

    def consumer(self, consumer_id: int) -> str | None:
        return self.names.get(consumer_id)

    def wait_for(self, summary: dict[str, Any], final: bool = False) -> None:
        conditions: list[dict[str, Any]] = []
        for item in summary.get("consumers", []):
            name = self.names.get(item["id"])
            if name is None:
                continue
            state = item["state"]
            condition: dict[str, Any] = {"consumer": name,
                                         "state": ["starting", "running"] if state in ("starting", "running") else state}
            if state == "running" and item["assigned"] and not final:
                condition["assigned"] = True
            conditions.append(condition)
        for lane, verdict in sorted(summary.get("verdicts", {}).items()):
            if lane and lane not in self.lanes:
                continue
            wanted = {}
            for key in VERDICT_FIELDS:
                value = verdict.get(key, 0)
                if final or key not in GROWING + SHRINKING:
                    wanted[key] = value
                elif key in GROWING:
                    if value:
                        wanted[key] = f">= {value}"
                elif key in SHRINKING:
                    wanted[key] = f"<= {value}"
            condition = {"verdict": wanted}
            if lane:
                condition["lane"] = lane
            conditions.append(condition)
        if not conditions:
            return
        wait = {"all": conditions, "timeout": WAIT_TIMEOUT}
        if wait == self.last_wait:
            return
        self.last_wait = wait
        self.steps.append({"wait": wait})

    def add(self, entry: dict[str, Any]) -> None:
        op, args, result = entry["operation"], entry["args"] or {}, entry["result"] or {}
        body = args.get("body") or {}
        handler = getattr(self, f"_{op}", None)
        if handler is None:
            return
        self.wait_for(entry["before"] or {})
        step = handler(args, body, result)
        if step:
            step.setdefault("note", f"recorded {entry['at']:%H:%M:%S}" if isinstance(entry["at"], datetime)
                            else "recorded")
            self.steps.append(step)

    # one method per operation: the scenario step that performs it again
    def _publish(self, args, body, result):
        mode = body.get("mode", "normal")
        step: dict[str, Any] = {"mode": mode}
        if body.get("idempotent") is not None and body.get("idempotent") not in (True, "true", "on", "1", 1, "yes"):
            step["idempotent"] = False
        if mode == "poison":
            step["poison_kind"] = body.get("poison_kind", "not-json")
        elif mode in ("resend", "source-duplicate"):
            ref = self.events.get(str(body.get("event_id"))) if body.get("event_id") else None
            if ref:
                step["event"] = ref
        else:
            step["account"] = body.get("account_id")
            step["type"] = body.get("type", "credit")
            if step["type"] == "credit":
                if body.get("amount_cents") not in (None, ""):
                    step["amount_cents"] = int(body["amount_cents"])
                else:
                    step["amount_cents"] = round(float(str(body.get("amount")).strip().replace(",", ".")) * 100)
            else:
                step["status"] = body.get("status")
            if mode == "burst":
                step["count"] = int(body.get("count") or 10)
            if body.get("transaction_id"):
                step["transaction_id"] = body["transaction_id"]
        records = result.get("records") or []
        if records and records[0].get("event_id"):
            ref = f"e{len(self.events) + 1}"
            self.events[str(records[0]["event_id"])] = ref
            step["as"] = ref
        return {"publish": step}

    def _start_consumer(self, args, body, result):
        name = result.get("name") or f"c{len(self.names) + 1}"
        while name in self.names.values():
            name = f"{name}_2"
        self.names[result["consumer_id"]] = name
        group = body.get("group") or "payments"
        group = group[len(self.lab.name) + 1:] if group.startswith(f"{self.lab.name}.") else group
        steps = []
        if group not in self.groups:
            self.groups[group] = {"strategy": body.get("strategy") or "none"}
            steps.append({"group": {"name": group, "strategy": self.groups[group]["strategy"]}})
        start = {"start": {"consumer": name, "group": group}}
        if steps:
            self.steps.extend(steps)
        return start

    def _consumer_action(self, args, body, result):
        name = self.consumer(args.get("consumer_id"))
        return {args["verb"]: name} if name else None

    def _arm(self, args, body, result):
        name = self.consumer(args.get("consumer_id"))
        if not name:
            return None
        if not body.get("point"):
            return {"disarm": name}
        step = {"consumer": name, "point": body["point"], "action": body.get("action") or "crash"}
        if body.get("always") in (True, "true", "on", "1", 1, "yes"):
            step["always"] = True
        return {"arm": step}

    def _set_step_mode(self, args, body, result):
        name = self.consumer(args.get("consumer_id"))
        return {"step_mode": {"consumer": name, "on": bool(result.get("step_mode"))}} if name else None

    def _step(self, args, body, result):
        name = self.consumer(args.get("consumer_id"))
        return {"step": name} if name else None

    def _create_group(self, args, body, result):
        group = result["group_id"][len(self.lab.name) + 1:]
        lane = body.get("lane") or None
        self.groups[group] = {"strategy": result["strategy"], **({"lane": lane} if lane else {})}
        if lane:
            self.lanes[lane] = group
        return {"group": {"name": group, "strategy": result["strategy"], **({"lane": lane} if lane else {})}}

    def _set_strategy(self, args, body, result):
        group = str(args.get("group"))
        group = group[len(self.lab.name) + 1:] if group.startswith(f"{self.lab.name}.") else group
        return {"strategy": {"group": group, "strategy": result["strategy"]}}

    def _reset_offsets(self, args, body, result):
        group = str(args.get("group"))
        group = group[len(self.lab.name) + 1:] if group.startswith(f"{self.lab.name}.") else group
        mode = body.get("mode", "earliest")
        step: dict[str, Any] = {"group": group, "mode": mode}
        if mode == "back":
            step["back"] = int(body.get("back"))
        elif mode in ("offset", "timestamp"):
            # A timestamp means other records on another day: replay the offsets it resolved to.
            step["mode"] = "offset"
            step["offsets"] = {int(p): int(o) for p, o in (result.get("offsets") or {}).items()}
            if not step["offsets"]:
                return None
        return {"reset_offsets": step}

    def _set_ttl(self, args, body, result):
        step = {}
        if "ttl_seconds" in body:
            step["seconds"] = float(result.get("ttl_seconds", body["ttl_seconds"]))
        if "ttl_schedule_seconds" in body:
            step["schedule_seconds"] = float(result.get("ttl_schedule_seconds") or 0)
        return {"ttl": step} if step else None

    def _ttl_cleanup(self, args, body, result):
        return {"ttl_cleanup": {"seconds": float(result["ttl_seconds"])}}

    def _arm_fault_proxy(self, args, body, result):
        drops = int(body.get("drop_produce_responses") or 0)
        if drops < 1:
            return None
        return {"lost_ack": {"drop_produce_responses": drops, "delay_ms": int(body.get("delay_ms") or 0)}}

    def _reset_lab(self, args, body, result):
        self.partitions = int(result.get("partitions") or self.partitions)
        return None


def export(engine: Engine, lab: Lab) -> dict[str, Any]:
    """The lab's session log as a scenario document (a dict, ready for YAML)."""
    entries = session_log(engine, lab)
    if not entries:
        raise NothingRecorded(f"lab {lab.name} has no recorded operations (nothing was done since its reset)")
    final = observe(engine, lab)
    exporter = _Exporter(lab, final.partitions)
    if entries[0]["operation"] == "reset_lab":
        exporter._reset_lab({}, {}, entries[0]["result"] or {})
        entries = entries[1:]
    for entry in entries:
        exporter.add(entry)
    summary = summarize(final)
    exporter.last_wait = None
    exporter.wait_for(summary, final=True)
    expect: dict[str, Any] = {}
    lanes: dict[str, Any] = {}
    for lane, verdict in summary["verdicts"].items():
        if lane and lane not in exporter.lanes:
            continue
        scope = {"verdict": {k: verdict[k] for k in VERDICT_FIELDS},
                 "accounts": {account: {"actual": line["actual"], "expected": line["expected"]}
                              for account, line in final.accounts.get(lane or None, {}).items()}}
        if lane:
            lanes[lane] = scope
        else:
            expect.update(scope)
    if lanes:
        expect["lanes"] = lanes
    now = datetime.now(timezone.utc)
    groups = {"payments": {"strategy": "none"}}
    return {
        "title": f"Recorded session of lab {lab.name}",
        "summary": f"{len(entries)} operation(s) recorded in lab {lab.name}, exported {now:%Y-%m-%d %H:%M} UTC",
        "narrative": (
            f"A session recorded in lab **{lab.name}** and exported as a scenario. Replaying it performs the same "
            "operations in the same order against a fresh lab and, before each one, waits until the lab looks as "
            "it did when the operation was first performed (consumer states and the verdict). It passes when the "
            "fresh lab ends with the same verdict and the same balances.\n\n"
            "*The effect must not repeat* — whatever the recording showed, the replay must show again."),
        "recorded": {"lab": lab.name, "exported_at": now.isoformat(timespec="seconds"), "operations": len(entries)},
        "setup": {"partitions": exporter.partitions, "groups": groups},
        "steps": exporter.steps,
        "expect": expect,
    }


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper, value: str):
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def export_yaml(engine: Engine, lab: Lab) -> str:
    document = export(engine, lab)
    return ("# Exported by `flask --app app scenario export`; replay with `flask --app app scenario run FILE`.\n"
            + yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110))
