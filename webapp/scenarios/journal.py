"""Record and replay.

Record: :func:`install` adds a hook pair to the operation registry (webapp/ops): every operation
that changes a lab — whoever calls it: the API, the dashboard's forms, the CLI, the scenario
runner — is appended, as it happens, to the lab's ``session_log`` table: the operation's name,
its validated arguments, what it returned, and what the lab looked like just before it (each
consumer's state, the verdict of the lab and of each lane). The registry knows nothing of this
module; the app factory and the headless runner call ``install()``.

Replay: ``export_yaml`` turns the log into an ordinary scenario file. Each operation becomes the
step the registry names for it (``op.step``) with its arguments, consumer ids mapped back to the
names they were started with and event ids to ``as:`` references; before it, a wait until the lab
looks as it did when the operation was first performed (that is "the same waits": a person who
killed a consumer after its effect landed is replayed as "wait until the verdict shows the
effect, then kill"). The last wait and the expectations are the lab's state at export: the replay
passes when a fresh lab ends with the same verdict. Nothing is replayed from wall-clock time:
event ids are new on replay (resends and source duplicates point at the replayed event), a reset
to a timestamp is replayed as the offsets it resolved to.
"""
from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

import yaml
from sqlalchemy import Engine, select
from sqlalchemy.exc import SQLAlchemyError

from .. import ops
from ..domain.lab import Lab
from ..domain.vocabulary import DEFAULT_GROUP, DEFAULT_STRATEGY
from ..store.schema import begin_in
from ..store.tables import session_log
from .conditions import VERDICT_FIELDS
from .observe import Snapshot, observe

log = logging.getLogger("idempotency_lab.journal")

LOG = session_log
# Verdict fields that only grow as consumers work, and the one that only shrinks: a replay that
# runs faster than the recording may be past the recorded value, never short of it.
GROWING = ("duplicates_applied", "transactions_applied_twice", "effects_lost", "source_duplicates_absorbed",
           "redeliveries_absorbed", "dead_letters", "audit_rows_duplicated")
SHRINKING = ("not_yet_applied",)
WAIT_TIMEOUT = 45.0


class NothingRecorded(LookupError):
    pass


# --- recording ----------------------------------------------------------------------------------

def install() -> None:
    """Record every state-changing operation in its lab's session log (once per process)."""
    ops.add_hooks(_before, _after)


def _before(ctx: ops.Context, op: ops.Operation) -> dict[str, Any] | None:
    return None if op.name == "reset_lab" else summarize(_snapshot(ctx.engine, ctx.lab))


def _after(ctx: ops.Context, op: ops.Operation, args: dict, before: dict[str, Any] | None, result: dict) -> None:
    append(ctx.engine, ctx.lab, op.name, args, before, result)


def append(engine: Engine, lab: Lab, operation: str, args: dict, before: dict[str, Any] | None, result: Any) -> None:
    """One entry of the lab's session log; recording never breaks the operation itself."""
    try:
        with begin_in(engine, lab.schema) as conn:
            if conn.exec_driver_sql("SELECT to_regclass('session_log')").scalar() is None:
                return  # no lab schema (yet): nothing to record into
            result = result if isinstance(result, dict) else {"value": result}
            conn.execute(LOG.insert().values(operation=operation, args=_jsonable(args), before=_jsonable(before or {}),
                                             result=_jsonable(result)))
    except SQLAlchemyError as error:
        log.warning("could not record %s in lab %s: %s", operation, lab.name, error)


def _snapshot(engine: Engine, lab: Lab) -> Snapshot | None:
    try:
        return observe(engine, lab, verdicts_only=True)
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
    return json.loads(json.dumps(value, default=str))


def session_log(engine: Engine, lab: Lab) -> list[dict[str, Any]]:
    with begin_in(engine, lab.schema) as conn:
        if conn.exec_driver_sql("SELECT to_regclass('session_log')").scalar() is None:
            return []
        return [dict(row) for row in conn.execute(select(LOG).order_by(LOG.c.id)).mappings()]


# --- export: the log as a scenario ----------------------------------------------------------------

class _Exporter:
    def __init__(self, lab: Lab, partitions: int):
        self.lab = lab
        self.partitions = partitions
        self.steps: list[dict[str, Any]] = []
        self.names: dict[int, str] = {}          # consumer id -> name in the scenario
        self.groups: set[str] = {DEFAULT_GROUP}
        self.lanes: set[str] = set()
        self.events: dict[str, str] = {}         # recorded event id -> reference
        self.last_wait: dict[str, Any] | None = None

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
                elif key in GROWING and value:
                    wanted[key] = f">= {value}"
                elif key in SHRINKING:
                    wanted[key] = f"<= {value}"
            conditions.append({"verdict": wanted, **({"lane": lane} if lane else {})})
        wait = {"all": conditions, "timeout": WAIT_TIMEOUT}
        if conditions and wait != self.last_wait:
            self.last_wait = wait
            self.steps.append({"wait": wait})

    def add(self, entry: dict[str, Any]) -> None:
        op = ops.OPERATIONS.get(entry["operation"])
        if op is None or op.step is None:
            return
        self.wait_for(entry["before"] or {})
        step = self.step(op, dict(entry["args"] or {}), entry["result"] or {})
        if step:
            at = entry["at"]
            step["note"] = f"recorded {at:%H:%M:%S}" if isinstance(at, datetime) else "recorded"
            self.steps.append(step)

    def step(self, op: ops.Operation, args: dict[str, Any], result: dict[str, Any]) -> dict[str, Any] | None:
        """The step that performs ``op`` again: its arguments minus the model's defaults, with the
        scenario's references for the consumer and the event it names."""
        fields = op.model.model_fields
        body = {k: v for k, v in args.items() if k in fields and v != fields[k].default}
        if "group" in body:
            body["group"] = self.lab.local_group(body["group"])
        consumer = None
        if "consumer_id" in fields:
            consumer = self.names.get(body.pop("consumer_id", None))
            if consumer is None:
                return None
        if "event_id" in body and (ref := self.events.get(str(body.pop("event_id")))):
            body["event"] = ref
        records = result.get("records") or []
        if "event_id" in fields and records and records[0].get("event_id"):
            body["as"] = self.events[str(records[0]["event_id"])] = f"e{len(self.events) + 1}"
        if op.step == "start":
            consumer_name = result.get("name") or body.get("name") or f"c{len(self.names) + 1}"
            while consumer_name in self.names.values():
                consumer_name += "_2"
            self.names[result["consumer_id"]] = body["name"] = consumer_name
            group = body.get("group", DEFAULT_GROUP)
            if group not in self.groups:  # started in a group of its own: create it first
                self.groups.add(group)
                self.steps.append({"group": {"group": group, "strategy": body.get("strategy", DEFAULT_STRATEGY)}})
        elif op.step == "group":
            self.groups.add(body["group"])
            self.lanes.update([body["lane"]] if body.get("lane") else [])
        elif op.step == "reset_offsets" and body.get("mode") == "timestamp":
            # A timestamp means other records on another day: replay the offsets it resolved to.
            body.pop("timestamp", None)
            body.update(mode="offset", offsets={int(p): int(o) for p, o in (result.get("offsets") or {}).items()})
            if not body["offsets"]:
                return None
        if op.step == "arm" and not body.get("point"):
            return {"disarm": consumer}
        if consumer is not None:
            return {op.step: {"consumer": consumer, **body} if body else consumer}
        return {op.step: body}


def export(engine: Engine, lab: Lab) -> dict[str, Any]:
    """The lab's session log as a scenario document (a dict, ready for YAML)."""
    entries = session_log(engine, lab)
    if not entries:
        raise NothingRecorded(f"lab {lab.name} has no recorded operations (nothing was done since its reset)")
    final = observe(engine, lab)
    exporter = _Exporter(lab, final.partitions)
    if entries[0]["operation"] == "reset_lab":
        first = entries.pop(0)
        exporter.partitions = int((first["result"] or {}).get("partitions") or (first["args"] or {}).get("partitions")
                                  or exporter.partitions)
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
        "setup": {"partitions": exporter.partitions, "groups": {DEFAULT_GROUP: {"strategy": DEFAULT_STRATEGY}}},
        "steps": exporter.steps,
        "expect": expect,
    }


class _Dumper(yaml.SafeDumper):
    pass


def _text(dumper, value: str):
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|" if "\n" in value else None)


_Dumper.add_representer(str, _text)


def export_yaml(engine: Engine, lab: Lab) -> str:
    document = export(engine, lab)
    return ("# Exported by `flask --app app scenario export`; replay with `flask --app app scenario run FILE`.\n"
            + yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110))
