"""What the dashboard's Explorer panel shows of the lab's explorations (ops.get_explorations): the
newest one, its progress against its budget, and its result with the shrunk schedule's steps as the
scenario runner would do them (the scenario file read by the scenarios' own loader)."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import Lab
from ..domain.vocabulary import OUTSIDE_STRATEGY
from ..scenarios import ScenarioError
from ..scenarios.loader import loads
from ..store import schema
from ..store.tables import consumer_groups
from .db import db


def _seconds_since(iso: str | None, until: str | None = None) -> float | None:
    if iso is None:
        return None
    end = datetime.fromisoformat(until) if until else datetime.now(timezone.utc)
    return max(0.0, (end - datetime.fromisoformat(iso)).total_seconds())


def scenario_steps(scenario_yaml: str | None) -> tuple[list[str], str | None]:
    """The steps of an exploration's scenario file, described; or why they cannot be read."""
    if not scenario_yaml:
        return [], None
    try:
        scenario = loads(scenario_yaml, source="<exploration>", name="explored")
    except ScenarioError as error:
        return [], str(error)
    return [step.describe() for step in scenario.steps], None


def panel_data(explorations: list[dict[str, Any]]) -> dict[str, Any]:
    """The panel's context: the newest exploration (``shown``, with its progress, elapsed time and
    result steps) and the ones before it."""
    if not explorations:
        return {"shown": None, "earlier": []}
    shown = dict(explorations[0])
    result = shown.get("result") or {}
    shown["active"] = shown["state"] in ("queued", "running")
    shown["elapsed"] = _seconds_since(shown.get("started_at") or shown.get("created_at"), shown.get("finished_at"))
    runs, done = shown.get("budget_runs"), shown.get("runs_done") or 0
    shown["progress"] = min(1.0, done / runs) if runs else None
    shown["steps"], shown["steps_error"] = scenario_steps(result.get("scenario_yaml"))
    return {"shown": shown, "result": result, "earlier": explorations[1:]}


def your_lanes(lab: Lab) -> list[str]:
    """The lab's lanes for a learner's own consumer (the explorer's form offers them); none when
    the lab's tables cannot be read (a lab not set up yet)."""
    try:
        with schema.connect_in(db.engine, lab.schema) as conn:
            schemas = conn.execute(select(consumer_groups.c.effects_schema)
                                   .where(consumer_groups.c.strategy == OUTSIDE_STRATEGY)).scalars().all()
    except SQLAlchemyError:
        return []
    return sorted({lane for lane in map(lab.lane_of, schemas) if lane})
