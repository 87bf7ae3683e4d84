"""``GET /healthz``: PostgreSQL and Kafka, as truthfully as a Kafka-free web process can know.

Kafka's state comes from the lab agent, which asks the broker every second; a silent agent is
reported as such rather than guessed healthy.
"""
from __future__ import annotations

from flask import Blueprint, jsonify
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from ..domain.vocabulary import AGENT_FRESH_SECONDS
from ..readmodel.health import agent_health
from .db import db

bp = Blueprint("health", __name__)


@bp.get("/healthz")
def healthz():
    report = {"postgres": {"ok": False}, "kafka": {"ok": False}, "agent": {"ok": False}}
    try:
        with db.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        report["postgres"] = {"ok": True}
        from sqlalchemy.orm import Session
        with Session(db.engine) as session:
            agent = agent_health(session)
    except SQLAlchemyError as error:
        report["postgres"]["error"] = str(error.__cause__ or error).splitlines()[0]
        agent = None
    if agent is None:
        report["kafka"]["error"] = "unknown: PostgreSQL is down, and the lab agent reports through it"
    elif not agent or agent["age"] > AGENT_FRESH_SECONDS:
        reason = "no lab agent has reported" if not agent else f"the lab agent last reported {agent['age']:.0f}s ago"
        report["agent"]["error"] = reason
        report["kafka"]["error"] = f"unknown: {reason}"
    else:
        report["agent"] = {"ok": True, "id": agent["id"]}
        report["kafka"] = {"ok": bool(agent["kafka_ok"])}
        if not agent["kafka_ok"]:
            report["kafka"]["error"] = agent["kafka_error"]
    healthy = all(part["ok"] for part in report.values())
    return jsonify(status="ok" if healthy else "unavailable", **report), 200 if healthy else 503
