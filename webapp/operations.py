"""Everything a person can do to a lab, validated once, shared by the JSON API, the dashboard's
forms, the CLI and the scenario runner: a scenario and a person clicking do the same thing.

Operations that need Kafka or a process go to a lab agent as commands; the rest are
plain database writes. Bad input raises InvalidRequest naming the field; unknown ids raise
NotFound. Each operation that changes a lab is ``@recorded`` in the lab's session log, which is
what record and replay export (webapp/scenarios/journal.py).
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, text

from . import commands, events, faultproxy, producer, strategies, timeline, ttl
from .db import CONTROL_SCHEMA, lab_session
from .kafka import OffsetReset
from .labs import NAME, Lab, ensure_schema, lab_schemas, seed_accounts
from .scenarios.journal import recorded
from .strategies.base import POINTS
from .waits import WaitTimeout, wait_until

C = CONTROL_SCHEMA
CONSUMER_VERBS = ("kill", "freeze", "thaw", "stop", "restart")
FAULT_ACTIONS = ("crash", "freeze")
DEFAULT_TTL_SECONDS = 7 * 24 * 3600


class InvalidRequest(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotFound(LookupError):
    pass


# --- validation helpers --------------------------------------------------------------------

def _choice(body: dict, field: str, choices, default=None) -> str:
    value = body.get(field, default)
    if value not in choices:
        raise InvalidRequest(field, f"must be one of {', '.join(map(str, choices))}")
    return value


def _whole(body: dict, field: str, low: int, high: int, default: int | None = None) -> int:
    value = body.get(field, default)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value.strip())
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidRequest(field, f"must be a whole number from {low} to {high}")
    return value


def _flag(body: dict, field: str, default: bool) -> bool:
    value = body.get(field, default)
    if isinstance(value, bool):
        return value
    if value in ("true", "on", "1", 1, "yes"):
        return True
    if value in ("false", "off", "0", 0, "no", "", None):
        return False
    raise InvalidRequest(field, "must be true or false")


def _name(body: dict, field: str, default: str | None = None, required: bool = True) -> str | None:
    value = body.get(field) or default
    if value is None and not required:
        return None
    if not isinstance(value, str) or not NAME.match(value):
        raise InvalidRequest(field, "must start with a letter: 1-24 lowercase letters, digits or _")
    return value


def _amount_cents(body: dict) -> int:
    """``amount_cents`` (integer) or ``amount`` in currency units (\"12.50\")."""
    if body.get("amount_cents") not in (None, ""):
        return _whole(body, "amount_cents", 1, events.MAX_AMOUNT_CENTS)
    raw = str(body.get("amount", "")).strip().replace(",", ".")
    try:
        cents = round(float(raw) * 100)
    except ValueError:
        raise InvalidRequest("amount", "must be a positive amount like 100 or 12.50") from None
    if not 1 <= cents <= events.MAX_AMOUNT_CENTS or raw.count(".") > 1 or len(raw.partition(".")[2]) > 2:
        raise InvalidRequest("amount", f"must be from 0.01 to {events.MAX_AMOUNT_CENTS / 100:,.2f}, two decimals at most")
    return cents


def _command(engine: Engine, lab: Lab, verb: str, args: dict, agent_id: str | None = None,
             field: str = "request") -> dict:
    try:
        return commands.run(engine, lab.name, verb, args, agent_id=agent_id)
    except commands.CommandNotFound as error:
        raise NotFound(str(error)) from None
    except commands.NoAgent:
        raise
    except commands.CommandError as error:
        message = str(error)
        named = message.split(":", 1)[0] if ":" in message else ""
        raise InvalidRequest(named if named.isidentifier() else field, message) from None


# --- publish -------------------------------------------------------------------------------

@recorded
def publish(engine: Engine, lab: Lab, body: dict) -> dict:
    mode = _choice(body, "mode", producer.MODES, default="normal")
    args: dict[str, Any] = {"mode": mode, "idempotent": _flag(body, "idempotent", True)}
    if mode == "poison":
        args["poison_kind"] = _choice(body, "poison_kind", tuple(events.POISON_PILLS), default="not-json")
    elif mode in ("resend", "source-duplicate"):
        if body.get("event_id"):
            args["event_id"] = str(body["event_id"])
    else:
        args["type"] = _choice(body, "type", events.EVENT_TYPES, default="credit")
        account = body.get("account_id")
        if not isinstance(account, str) or not events.ACCOUNT_ID.match(account):
            raise InvalidRequest("account_id", "choose an account")
        args["account_id"] = account
        if args["type"] == "credit":
            args["amount_cents"] = _amount_cents(body)
        else:
            args["status"] = _choice(body, "status", events.STATUSES)
        if mode == "burst":
            args["count"] = _whole(body, "count", 1, producer.MAX_BURST, default=10)
        if body.get("transaction_id"):
            if not events.TRANSACTION_ID.match(str(body["transaction_id"])):
                raise InvalidRequest("transaction_id", "1-64 letters, digits or ._:-")
            args["transaction_id"] = str(body["transaction_id"])
    return _command(engine, lab, "publish", args, field="mode")


# --- consumers and groups ------------------------------------------------------------------

@recorded
def start_consumer(engine: Engine, lab: Lab, body: dict) -> dict:
    group = _name(body, "group", default="payments")
    strategy = body.get("strategy") or None
    if strategy is not None:
        _choice(body, "strategy", strategies.NAMES)
    name = body.get("name") or None
    if name is not None and (not isinstance(name, str) or not NAME.match(name)):
        raise InvalidRequest("name", "1-24 lowercase letters, digits or _, starting with a letter")
    return _command(engine, lab, "consumer.start", {"group": group, "strategy": strategy, "name": name})


def consumer(engine: Engine, lab: Lab, consumer_id: int) -> dict:
    with engine.connect() as conn:
        row = conn.execute(text(f"SELECT * FROM {C}.consumers WHERE id = :id AND lab = :lab"),
                           {"id": consumer_id, "lab": lab.name}).mappings().first()
    if row is None:
        raise NotFound(f"no consumer {consumer_id} in lab {lab.name}")
    return dict(row)


@recorded
def consumer_action(engine: Engine, lab: Lab, consumer_id: int, verb: str) -> dict:
    if verb not in CONSUMER_VERBS:
        raise InvalidRequest("action", f"must be one of {', '.join(CONSUMER_VERBS)}")
    owner = consumer(engine, lab, consumer_id)["agent_id"]
    return _command(engine, lab, f"consumer.{verb}", {"consumer_id": consumer_id}, agent_id=owner)


@recorded
def arm(engine: Engine, lab: Lab, consumer_id: int, body: dict) -> dict:
    """Arm a crash point (``point`` and ``action``), once or ``always``; ``point`` empty disarms."""
    row = consumer(engine, lab, consumer_id)
    point = body.get("point") or None
    if point is None:
        values = {"point": None, "action": None, "always": False}
    else:
        point = _choice(body, "point", POINTS)
        values = {"point": point, "action": _choice(body, "action", FAULT_ACTIONS, default="crash"),
                  "always": _flag(body, "always", False)}
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {C}.consumers SET armed_point = :point, armed_action = :action, "
                          "armed_always = :always WHERE id = :id"), {**values, "id": consumer_id})
        _timeline(conn, lab, "fault", f"{row['name']}: " + (
            f"armed {values['action']} at {point} ({'every time' if values['always'] else 'once'})"
            if point else "disarmed"))
    return {"consumer_id": consumer_id, "armed": values}


@recorded
def set_step_mode(engine: Engine, lab: Lab, consumer_id: int, body: dict) -> dict:
    consumer(engine, lab, consumer_id)
    on = _flag(body, "on", True)
    with engine.begin() as conn:
        conn.execute(text(f"UPDATE {C}.consumers SET step_mode = :on WHERE id = :id"), {"on": on, "id": consumer_id})
    return {"consumer_id": consumer_id, "step_mode": on}


@recorded
def step(engine: Engine, lab: Lab, consumer_id: int) -> dict:
    """Let a consumer in step mode move past the point it waits at."""
    row = consumer(engine, lab, consumer_id)
    if not row["step_mode"]:
        raise InvalidRequest("step_mode", f"consumer {row['name']} is not in step mode")
    with engine.begin() as conn:
        advance = conn.execute(text(f"UPDATE {C}.consumers SET step_advance = step_advance + 1 WHERE id = :id "
                                    "RETURNING step_advance"), {"id": consumer_id}).scalar_one()
    return {"consumer_id": consumer_id, "step_advance": advance, "was_at": row["step_at"]}


@recorded
def create_group(engine: Engine, lab: Lab, body: dict) -> dict:
    """A consumer group with a strategy; with ``lane``, it applies to its own copy of the accounts."""
    group_id = lab.group_id(_name(body, "group"))
    strategy = _choice(body, "strategy", strategies.NAMES, default="none")
    lane = _name(body, "lane", required=False)
    effects_schema = lab.lane_schema(lane) if lane else lab.schema
    with engine.begin() as conn:
        if lane:
            ensure_schema(conn, effects_schema)
            seed_accounts(conn, effects_schema)
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
        created = conn.execute(text(
            "INSERT INTO consumer_groups (group_id, strategy, effects_schema) VALUES (:g, :s, :e) "
            "ON CONFLICT (group_id) DO NOTHING RETURNING group_id"),
            {"g": group_id, "s": strategy, "e": effects_schema}).first()
        if created is None:
            raise InvalidRequest("group", f"group {group_id} exists already")
        timeline.record(conn.exec_driver_sql, "strategy", f"group {group_id} created with {strategy}"
                        + (f" on lane {lane}" if lane else ""))
    return {"group_id": group_id, "strategy": strategy, "effects_schema": effects_schema}


@recorded
def set_strategy(engine: Engine, lab: Lab, group: str, body: dict) -> dict:
    strategy = _choice(body, "strategy", strategies.NAMES)
    group_id = lab.group_id(group)
    with engine.begin() as conn:
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
        updated = conn.execute(text("UPDATE consumer_groups SET strategy = :s WHERE group_id = :g RETURNING group_id"),
                               {"s": strategy, "g": group_id}).first()
        if updated is None:
            raise NotFound(f"no group {group_id} in lab {lab.name}")
        timeline.record(conn.exec_driver_sql, "strategy", f"{group_id} now uses {strategy} (from the next message)")
    return {"group_id": group_id, "strategy": strategy}


@recorded
def reset_offsets(engine: Engine, lab: Lab, group: str, body: dict) -> dict:
    mode = _choice(body, "mode", OffsetReset.MODES, default="earliest")
    args: dict[str, Any] = {"group": group, "mode": mode}
    if mode == "offset":
        offsets = body.get("offsets")
        if isinstance(offsets, str):
            try:
                offsets = json.loads(offsets)
            except json.JSONDecodeError:
                raise InvalidRequest("offsets", 'give partition: offset pairs, like {"0": 3}') from None
        if not isinstance(offsets, dict) or not offsets:
            raise InvalidRequest("offsets", 'give partition: offset pairs, like {"0": 3}')
        args["offsets"] = {str(_whole({"offsets": p}, "offsets", 0, 1000)): _whole({"offsets": o}, "offsets", 0, 2**62)
                           for p, o in offsets.items()}
    elif mode == "back":
        args["back"] = _whole(body, "back", 1, 1_000_000)
    elif mode == "timestamp":
        try:
            args["timestamp"] = datetime.fromisoformat(str(body.get("timestamp", ""))).isoformat()
        except ValueError:
            raise InvalidRequest("timestamp", "must be an ISO-8601 date and time, like 2026-11-30T09:00:00+00:00") from None
    return _command(engine, lab, "group.reset", args, field="group")


# --- TTL and lab ---------------------------------------------------------------------------

def ttl_settings(engine: Engine, lab: Lab) -> dict:
    with lab_session(lab.schema) as session:
        rows = dict(session.execute(text("SELECT key, value FROM settings WHERE key LIKE 'ttl%'")).all())
    return {"ttl_seconds": rows.get("ttl_seconds", DEFAULT_TTL_SECONDS),
            "ttl_schedule_seconds": rows.get("ttl_schedule_seconds")}


@recorded
def set_ttl(engine: Engine, lab: Lab, body: dict) -> dict:
    values = {}
    try:
        if "ttl_seconds" in body:
            values["ttl_seconds"] = ttl.check_seconds(body["ttl_seconds"])
        if "ttl_schedule_seconds" in body:
            every = body["ttl_schedule_seconds"]
            values["ttl_schedule_seconds"] = None if every in (None, "", 0, "0") else ttl.check_seconds(every)
    except ttl.InvalidTtl as error:
        raise InvalidRequest("ttl_seconds", str(error)) from None
    with engine.begin() as conn:
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
        for key, value in values.items():
            conn.execute(text("INSERT INTO settings (key, value) VALUES (:k, CAST(:v AS jsonb)) "
                              "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"),
                         {"k": key, "v": json.dumps(value)})
    return ttl_settings(engine, lab)


@recorded
def ttl_cleanup(engine: Engine, lab: Lab, body: dict) -> dict:
    """Run the TTL DELETE now in the lab's schema and its lanes'."""
    seconds = body.get("ttl_seconds", ttl_settings(engine, lab)["ttl_seconds"])
    try:
        seconds = ttl.check_seconds(seconds)
    except ttl.InvalidTtl as error:
        raise InvalidRequest("ttl_seconds", str(error)) from None
    deleted: dict[str, dict[str, int]] = {}
    with engine.begin() as conn:
        for schema in lab_schemas(conn, lab):
            conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": schema})
            deleted[schema] = ttl.cleanup(conn.exec_driver_sql, seconds)
        conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
        total = sum(n for counts in deleted.values() for n in counts.values())
        timeline.record(conn.exec_driver_sql, "ttl", f"TTL cleanup (older than {seconds:g}s) deleted {total} key(s)",
                        deleted=deleted)
    return {"ttl_seconds": seconds, "deleted": deleted}


@recorded
def reset_lab(engine: Engine, lab: Lab, body: dict, default_partitions: int = 3) -> dict:
    partitions = _whole(body, "partitions", 1, 12, default=default_partitions)
    return _command(engine, lab, "lab.reset", {"partitions": partitions}, field="partitions")


# --- the lost-ack fault proxy --------------------------------------------------------------

FAULT_PROXY_FRESH_SECONDS = 5.0
FAULT_PROXY_TAKE_TIMEOUT = 5.0
MAX_DROPPED_RESPONSES = 100
MAX_RESPONSE_DELAY_MS = 60_000


class NoFaultProxy(commands.NoAgent):
    """No fault proxy process answers: nothing would inject the fault."""


def fault_proxy_state(engine: Engine, lab: Lab) -> dict:
    """The fault proxy as it last reported: running, armed (and by which lab), counters."""
    with engine.connect() as conn:
        row = conn.execute(text(
            f"SELECT *, coalesce(heartbeat_at > now() - make_interval(secs => :fresh), false) AS running, "
            f"extract(epoch FROM now() - heartbeat_at) AS heartbeat_age FROM {C}.fault_proxies WHERE name = :name"),
            {"fresh": FAULT_PROXY_FRESH_SECONDS, "name": faultproxy.DEFAULT_NAME}).mappings().first()
    if row is None:
        return {"name": faultproxy.DEFAULT_NAME, "running": False, "armed": False, "armed_by": None,
                "armed_by_this_lab": False, "drop_produce_responses": 0, "delay_ms": 0, "listen": None,
                "upstream": None, "connections": 0, "produce_requests": 0, "responses_dropped": 0,
                "responses_delayed": 0, "heartbeat_age": None}
    armed = bool(row["running"]) and (row["drop_produce_responses"] > 0 or row["delay_ms"] > 0)
    return {"name": row["name"], "running": bool(row["running"]), "armed": armed,
            "armed_by": row["lab"] if armed else None, "armed_by_this_lab": armed and row["lab"] == lab.name,
            "drop_produce_responses": row["drop_produce_responses"], "delay_ms": row["delay_ms"],
            "listen": row["listen"], "upstream": row["upstream"], "connections": row["connections"],
            "produce_requests": row["produce_requests"], "responses_dropped": row["responses_dropped"],
            "responses_delayed": row["responses_delayed"],
            "heartbeat_age": float(row["heartbeat_age"]) if row["heartbeat_age"] is not None else None}


@recorded
def arm_fault_proxy(engine: Engine, lab: Lab, body: dict) -> dict:
    """Arm the lost-ack fault proxy: drop the next ``drop_produce_responses`` Produce responses and
    delay each Produce response by ``delay_ms``; both 0 disarms. Returns once the proxy has taken
    the setting, so a publish right after meets it. Its faults go to this lab's timeline."""
    if "drop_produce_responses" not in body and "delay_ms" not in body:
        raise InvalidRequest("drop_produce_responses", "give drop_produce_responses and/or delay_ms (both 0 disarms)")
    drops = _whole(body, "drop_produce_responses", 0, MAX_DROPPED_RESPONSES, default=0)
    delay = _whole(body, "delay_ms", 0, MAX_RESPONSE_DELAY_MS, default=0)
    name = faultproxy.DEFAULT_NAME
    with engine.begin() as conn:
        version = conn.execute(text(
            f"UPDATE {C}.fault_proxies SET lab = :lab, drop_produce_responses = :drops, delay_ms = :delay, "
            "version = version + 1, armed_at = now() "
            "WHERE name = :name AND heartbeat_at > now() - make_interval(secs => :fresh) RETURNING version"),
            {"lab": lab.name, "drops": drops, "delay": delay, "name": name,
             "fresh": FAULT_PROXY_FRESH_SECONDS}).scalar()
        if version is None:
            raise NoFaultProxy("no fault proxy is running: `make run` starts one with the embedded broker; "
                               "with docker compose, the faultproxy service (see README, \"Lost ack\")")
        conn.execute(text("SELECT pg_notify(:channel, :name)"), {"channel": faultproxy.CHANNEL, "name": name})
        parts = ([f"drop the next {drops} Produce response(s)"] if drops else []) + (
            [f"delay Produce responses by {delay} ms"] if delay else [])
        _timeline(conn, lab, "fault", "fault proxy " + ("armed: " + ", ".join(parts) if parts else "disarmed"),
                  drop_produce_responses=drops, delay_ms=delay)
    query = text(f"SELECT seen_version >= :version FROM {C}.fault_proxies WHERE name = :name")

    def taken() -> bool:
        with engine.connect() as conn:
            return bool(conn.execute(query, {"version": version, "name": name}).scalar())
    try:
        wait_until(taken, timeout=FAULT_PROXY_TAKE_TIMEOUT, interval=0.02,
                   message="the fault proxy did not take the new setting")
    except WaitTimeout as error:
        raise NoFaultProxy(f"{error}; is it running?") from None
    return fault_proxy_state(engine, lab)

def _timeline(conn, lab: Lab, kind: str, summary: str, **detail) -> None:
    conn.execute(text("SELECT set_config('search_path', :s, true)"), {"s": lab.schema})
    timeline.record(conn.exec_driver_sql, kind, summary, **detail)

