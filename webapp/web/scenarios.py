"""Guided mode: pick an exercise, read its narrative, press "next step", watch the lab react.

Each guided run works in a fresh lab of its own and drives it through the scenario runner,
which calls the same operations as every other control. The run's progress (which step is
next, what each step observed, the consumers' ids) lives in ``lab_control.scenario_runs``, so
a reload, a second browser or a second web worker sees the same run.
"""
from __future__ import annotations

import json
from functools import lru_cache

from flask import Blueprint, abort, current_app, redirect, render_template, request, url_for
from markdown_it import MarkdownIt
from markupsafe import Markup
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from .. import commands, operations, state
from ..db import CONTROL_SCHEMA, db, lab_session
from ..labs import Lab
from ..scenarios import ScenarioError, built_in, load
from ..scenarios.loader import SEEDS, Scenario
from ..scenarios.observe import observe
from ..scenarios.runner import RunState, Runner, broker_kind, check_expectations, fresh_lab_name

bp = Blueprint("scenarios", __name__, url_prefix="/scenarios")
C = CONTROL_SCHEMA
# CommonMark with raw HTML off: a scenario's narrative can format text, never inject markup.
_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})


def markdown(source: str) -> Markup:
    return Markup(_markdown.render(source or ""))  # noqa: S704 - markdown-it escapes raw HTML (html=False)


@lru_cache(maxsize=1)
def _table_ready(url: str) -> bool:
    from ..models import ScenarioRun
    ScenarioRun.__table__.create(db.engine, checkfirst=True)
    return True


def _ensure_table() -> None:
    _table_ready(str(db.engine.url))


def _catalogue() -> list[tuple[str, Scenario | None, str | None]]:
    items = []
    for path in built_in():
        try:
            items.append((path.stem, load(path), None))
        except ScenarioError as error:
            items.append((path.stem, None, str(error)))
    return items


def _scenario(name: str) -> Scenario:
    path = next((p for p in built_in() if p.stem == name), None)
    if path is None:
        abort(404)
    return load(path)


def _run_row(run_id: int) -> dict:
    _ensure_table()
    with db.engine.connect() as conn:
        row = conn.execute(text(f"SELECT * FROM {C}.scenario_runs WHERE id = :id"), {"id": run_id}).mappings().first()
    if row is None:
        abort(404)
    return dict(row)


def _save(run_id: int, run: RunState) -> None:
    with db.engine.begin() as conn:
        conn.execute(text(f"UPDATE {C}.scenario_runs SET progress = CAST(:p AS jsonb), status = :s, "
                          "updated_at = now() WHERE id = :id"),
                     {"p": json.dumps(run.as_dict(), default=str), "s": run.status, "id": run_id})


@bp.get("/")
def index():
    _ensure_table()
    with db.engine.connect() as conn:
        runs = conn.execute(text(f"SELECT id, scenario, lab, status, created_at FROM {C}.scenario_runs "
                                 "ORDER BY id DESC LIMIT 12")).mappings().all()
    return render_template("scenarios/index.html", catalogue=_catalogue(), runs=runs)


@bp.post("/<name>/runs")
def start(name: str):
    scenario = _scenario(name)
    _ensure_table()
    lab = Lab(fresh_lab_name(db.engine, scenario.name))
    run = RunState(scenario=scenario.name, lab=lab.name)
    with db.engine.begin() as conn:
        run_id = conn.execute(text(f"INSERT INTO {C}.scenario_runs (scenario, lab, status, progress) "
                                   "VALUES (:n, :lab, 'ready', CAST(:p AS jsonb)) RETURNING id"),
                              {"n": scenario.name, "lab": lab.name, "p": json.dumps(run.as_dict())}).scalar_one()
    return redirect(url_for("scenarios.show", run_id=run_id), code=303)


def _context(run_id: int) -> dict:
    row = _run_row(run_id)
    scenario = _scenario(row["scenario"])
    run = RunState.from_dict(row["progress"])
    done = {step["index"]: step for step in run.steps}
    next_label = ("Prepare a fresh lab" if not run.prepared and not run.finished else
                  f"Next step ({run.position + 1} of {len(scenario.steps)})" if run.position < len(scenario.steps)
                  and not run.finished else "Check the expectations" if not run.finished else None)
    return {"row": row, "scenario": scenario, "run": run, "done": done, "next_label": next_label,
            "markdown": markdown, "seeds": SEEDS}


@bp.get("/runs/<int:run_id>")
def show(run_id: int):
    return render_template("scenarios/run.html", **_context(run_id))


@bp.post("/runs/<int:run_id>/next")
def next_step(run_id: int):
    _run_row(run_id)
    with db.engine.begin() as conn:
        # A step waits at most a couple of minutes; a claim older than that belonged to a worker that died.
        claimed = conn.execute(text(f"UPDATE {C}.scenario_runs SET busy = true, updated_at = now() WHERE id = :id "
                                    "AND (NOT busy OR updated_at < now() - interval '3 minutes') "
                                    "RETURNING progress, scenario"), {"id": run_id}).first()
    if claimed is None:
        return _respond(run_id, error="A step of this run is already running; wait for it."), 409
    error = None
    try:
        scenario = _scenario(claimed.scenario)
        run = RunState.from_dict(claimed.progress)
        broker, _ = broker_kind(current_app.config, probe=False)
        runner = Runner(db.engine, scenario, run, broker=broker)
        try:
            if run.finished:
                pass
            elif not run.prepared:
                runner.prepare()
                if run.status == "not-run":
                    runner.conclude()
            elif run.position < len(scenario.steps):
                runner.next_step()
                if run.finished:
                    runner.stop_consumers()
            else:
                runner.conclude()
                runner.stop_consumers()
        except commands.NoAgent as problem:
            error = str(problem)
        except (operations.InvalidRequest, operations.NotFound, commands.CommandError) as problem:
            error = f"{type(problem).__name__}: {problem}"
        _save(run_id, run)
    finally:
        with db.engine.begin() as conn:
            conn.execute(text(f"UPDATE {C}.scenario_runs SET busy = false WHERE id = :id"), {"id": run_id})
    return _respond(run_id, error=error)


def _respond(run_id: int, error: str | None = None):
    if request.headers.get("HX-Request"):
        return render_template("scenarios/_guide.html", error=error, **_context(run_id))
    return redirect(url_for("scenarios.show", run_id=run_id), code=303)


@bp.get("/runs/<int:run_id>/live")
def live(run_id: int):
    """The run's lab, live: accounts (per lane), verdict, consumers, expectations, timeline."""
    context = _context(run_id)
    lab = Lab(context["row"]["lab"])
    try:
        snap = observe(db.engine, lab)
        checks = check_expectations(context["scenario"], snap, context["run"])
        with lab_session(lab.schema) as session:
            entries = state.timeline(session, limit=10) if snap.groups else []
    except SQLAlchemyError:
        snap, checks, entries = None, [], []
    return render_template("scenarios/_live.html", snap=snap, checks=checks, entries=entries, **context)
