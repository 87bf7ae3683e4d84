"""The JSON API under /api/v1: every control of the lab, for scripts and workshops.

Errors are JSON: 400 ``{"error", "field"}`` for bad input, 404 for unknown ids, 503 when no
lab agent runs. State-changing requests must be ``application/json`` (see security.py).
"""
from __future__ import annotations

from functools import wraps

from flask import Blueprint, current_app, jsonify, request

from .. import commands, operations, state
from ..db import db
from . import current_lab, lab_db

bp = Blueprint("api", __name__, url_prefix="/api/v1")


def _body() -> dict:
    if request.mimetype != "application/json":
        raise operations.InvalidRequest("body", "send Content-Type: application/json")
    body = request.get_json(silent=True)
    if body is None and request.content_length:
        raise operations.InvalidRequest("body", "is not valid JSON")
    if body is not None and not isinstance(body, dict):
        raise operations.InvalidRequest("body", "must be a JSON object")
    return body or {}


def endpoint(view):
    """Run an operation with the current lab; map its errors to JSON responses."""
    @wraps(view)
    def wrapper(*args, **kwargs):
        try:
            return view(current_lab(), *args, **kwargs)
        except operations.InvalidRequest as error:
            return jsonify(error=error.message, field=error.field), 400
        except operations.NotFound as error:
            return jsonify(error=str(error)), 404
        except commands.NoAgent as error:
            return jsonify(error=str(error)), 503
    return wrapper


@bp.get("/state")
@endpoint
def get_state(lab):
    with lab_db() as (_, session):
        return jsonify(
            lab=lab.name, topic=lab.topic,
            accounts=[{**line.__dict__, "difference": line.difference} for line in state.accounts(session, lab)],
            verdict=state.verdict(session, lab).as_dict(),
            producer_duplicates=state.producer_duplicates(session, lab),
            groups=state.groups_list(session),
            consumers=[_consumer_json(c) for c in state.consumers(session, lab)],
            partitions=[{"partition": p.partition, "log_end": p.log_end, "committed": p.committed,
                         "positions": p.positions} for p in state.partitions(session, lab)],
            ttl=operations.ttl_settings(db.engine, lab))


def _consumer_json(row: dict) -> dict:
    keys = ("id", "name", "group_id", "strategy", "state", "pid", "assigned", "positions", "applied_positions",
            "generation", "applied", "absorbed", "dead_lettered", "commit_failures", "armed_point",
            "armed_action", "armed_always", "step_mode", "step_at", "redelivery_window", "heartbeat_age",
            "last_error", "exit_code")
    return {key: row.get(key) for key in keys}


@bp.post("/publish")
@endpoint
def publish(lab):
    return jsonify(operations.publish(db.engine, lab, _body())), 201


@bp.post("/consumers")
@endpoint
def create_consumer(lab):
    return jsonify(operations.start_consumer(db.engine, lab, _body())), 201


@bp.get("/consumers/<int:consumer_id>")
@endpoint
def get_consumer(lab, consumer_id):
    return jsonify(_consumer_json(operations.consumer(db.engine, lab, consumer_id)))


@bp.post("/consumers/<int:consumer_id>/<any(kill, freeze, thaw, stop, restart):action>")
@endpoint
def consumer_action(lab, consumer_id, action):
    _body()
    return jsonify(operations.consumer_action(db.engine, lab, consumer_id, action))


@bp.post("/consumers/<int:consumer_id>/arm")
@endpoint
def arm(lab, consumer_id):
    return jsonify(operations.arm(db.engine, lab, consumer_id, _body()))


@bp.post("/consumers/<int:consumer_id>/step-mode")
@endpoint
def step_mode(lab, consumer_id):
    return jsonify(operations.set_step_mode(db.engine, lab, consumer_id, _body()))


@bp.post("/consumers/<int:consumer_id>/step")
@endpoint
def step(lab, consumer_id):
    _body()
    return jsonify(operations.step(db.engine, lab, consumer_id))


@bp.post("/groups")
@endpoint
def create_group(lab):
    return jsonify(operations.create_group(db.engine, lab, _body())), 201


@bp.post("/groups/<group>/strategy")
@endpoint
def set_strategy(lab, group):
    return jsonify(operations.set_strategy(db.engine, lab, group, _body()))


@bp.post("/groups/<group>/reset-offsets")
@endpoint
def reset_offsets(lab, group):
    return jsonify(operations.reset_offsets(db.engine, lab, group, _body()))


@bp.get("/ttl")
@endpoint
def get_ttl(lab):
    return jsonify(operations.ttl_settings(db.engine, lab))


@bp.post("/ttl")
@endpoint
def set_ttl(lab):
    return jsonify(operations.set_ttl(db.engine, lab, _body()))


@bp.post("/ttl/cleanup")
@endpoint
def ttl_cleanup(lab):
    return jsonify(operations.ttl_cleanup(db.engine, lab, _body()))


@bp.get("/fault-proxy")
@endpoint
def get_fault_proxy(lab):
    return jsonify(operations.fault_proxy_state(db.engine, lab))


@bp.post("/fault-proxy")
@endpoint
def arm_fault_proxy(lab):
    return jsonify(operations.arm_fault_proxy(db.engine, lab, _body()))

@bp.post("/lab/reset")
@endpoint
def reset_lab(lab):
    return jsonify(operations.reset_lab(db.engine, lab, _body(), current_app.config["LAB_PARTITIONS"]))
