"""Guided mode: pick an exercise, read its narrative, press "next step", watch the lab react.

Each guided run works in a fresh lab of its own (an attendee's in their own lab; a grading exercise
in the lab the learner's consumer connects to) and drives it through the scenario runner, which
calls the same operations as every other control. A click claims the run and hands the step to a
lab agent (command ``scenario.step``, webapp/scenarios/guided.py): a step may wait for a minute,
and no web request waits that long. The run's progress (which step is next, what each step
observed, the consumers' ids, whether a step is running) lives in ``lab_control.scenario_runs``,
so a reload, a second browser or a second web worker sees the same run. The page is pushed the
run's steps and live panel as they change (``RunFeed``, web/push.py), or polls them when push is
unavailable.
"""
from __future__ import annotations

import logging
from functools import lru_cache

from flask import Blueprint, abort, current_app, redirect, render_template, request, url_for
from markdown_it import MarkdownIt
from markupsafe import Markup
from sqlalchemy.exc import SQLAlchemyError

from ..domain import commands, verbs
from ..domain.lab import Lab
from ..readmodel.timeline import timeline
from ..scenarios import ScenarioError, built_in, guided, load
from ..scenarios.claims import claims_markdown
from ..scenarios.loader import SEEDS, Scenario
from ..scenarios.observe import observe
from ..scenarios.runner import RunState, broker_kind, check_expectations, fresh_lab_name, preflight
from ..store import command_channel, scenario_runs
from ..store.classroom import lab_count_limit_reached
from . import push
from .access import (
    current_lab,
    guided_run_lab,
    in_class,
    is_instructor,
    readable_labs,
    require_drivable,
    require_readable,
)
from .db import db, lab_session
from .markdown import markdown

log = logging.getLogger("idempotency_lab.web")
# How long a click waits for an agent to take the step (it answers at once and runs it on a thread).
HAND_OVER_SECONDS = 10.0

bp = Blueprint("scenarios", __name__, url_prefix="/scenarios")


@lru_cache(maxsize=1)
def claims_table() -> Markup:
    """The table from each claim of the seeds to its exercise and tests, as HTML, rendered from the
    one data file the documentation renders too (webapp/scenarios/claims.yaml)."""
    table_markdown = MarkdownIt("commonmark", {"html": False}).enable("table")
    return Markup(table_markdown.render(claims_markdown()))  # noqa: S704 - raw HTML is off


def _catalogue() -> list[tuple[str, Scenario | None, str | None]]:
    items = []
    for path in built_in():
        try:
            items.append((path.stem, load(path), None))
        except ScenarioError as error:
            items.append((path.stem, None, str(error)))
    return items


def cannot_run_here(scenario: Scenario) -> str | None:
    """Why this lab cannot run ``scenario`` (a broker it needs and does not run), or None. The web
    never probes the broker: with LAB_BROKER_KIND unset (``make run`` sets it for its embedded
    broker) the guided run's first step checks, on the agent."""
    if not scenario.requires:
        return None
    broker, _ = broker_kind(current_app.config, probe=False)
    return None if broker == "unknown" else preflight(scenario, broker)


def _scenario(name: str) -> Scenario:
    """A guided run's scenario by the name it goes by: a built-in exercise or an exploration's result."""
    scenario = guided.scenario_named(db.engine, name)
    if scenario is None:
        abort(404)
    return scenario


def _run_row(run_id: int) -> dict:
    """The run's row; 404 when there is none, or it is another lab's this session may not read."""
    with db.engine.connect() as conn:
        row = scenario_runs.get(conn, run_id)
    if row is None:
        abort(404)
    require_readable(row["lab"])
    return row


@bp.get("/")
def index():
    with db.engine.connect() as conn:
        runs = scenario_runs.recent(conn, labs=readable_labs())
    catalogue = _catalogue()
    cannot_run = {name: why for name, scenario, _ in catalogue if scenario and (why := cannot_run_here(scenario))}
    return render_template("scenarios/index.html", catalogue=catalogue, runs=runs, claims=claims_table(),
                           own_lab=guided_run_lab(), cannot_run=cannot_run)


@bp.post("/<name>/runs")
def start(name: str):
    path = next((p for p in built_in() if p.stem == name), None)
    if path is None:
        abort(404)
    return _start_guided(load(path))


@bp.post("/explorations/<int:exploration_id>/runs")
def start_explored(exploration_id: int):
    """Replay an exploration's scenario guided, click by click, as an exercise is run."""
    scenario, explored_lab, missing = guided.explored_scenario(db.engine, exploration_id)
    if explored_lab is None:
        abort(404)
    require_readable(explored_lab)
    if scenario is None:
        abort(409, missing)
    return _start_guided(scenario)


def _start_guided(scenario: Scenario):
    """Start a guided run of ``scenario`` in the lab a guided run of this session works in."""
    refused = cannot_run_here(scenario)
    if refused:
        abort(409, f"this lab cannot run {scenario.name}: {refused}")
    lab = guided_run_lab()
    if lab is None and scenario.outside_lane:
        # A grading exercise grades the learner's consumer, which connects to this session's lab
        # (the "Your consumer" page's): the run works there, never in a fresh lab it cannot know.
        lab = current_lab()
        require_drivable(lab.name)
    if lab is None:  # a fresh lab of its own: one more on this server
        with db.engine.connect() as conn:
            refused = lab_count_limit_reached(conn, current_app.config)
        if refused:
            abort(409, refused)
        lab = Lab(fresh_lab_name(db.engine, scenario.name))
    run = RunState(scenario=scenario.name, lab=lab.name)
    with db.engine.begin() as conn:
        run_id = scenario_runs.insert(conn, scenario.name, lab.name, run.as_dict())
    return redirect(url_for("scenarios.show", run_id=run_id), code=303)


def _context(run_id: int) -> dict:
    return run_context(_run_row(run_id))


def run_context(row: dict) -> dict:
    """What the run's page and partials show, from its row (the caller checked the session may read it)."""
    scenario = _scenario(row["scenario"])
    run = RunState.from_dict(row["progress"])
    done = {step["index"]: step for step in run.steps}
    next_label = ("Prepare a fresh lab" if not run.prepared and not run.finished else
                  f"Next step ({run.position + 1} of {len(scenario.steps)})" if run.position < len(scenario.steps)
                  and not run.finished else "Check the expectations" if not run.finished else None)
    watch, story = what_to_watch(scenario.narrative)
    return {"row": row, "scenario": scenario, "run": run, "done": done, "next_label": next_label,
            "explored_from": guided.exploration_of(scenario.name),
            "busy": bool(row["busy"]), "markdown": markdown, "seeds": SEEDS, "watch": watch, "story": story,
            "help": guided.failure_help(run), "takeaway": guided.takeaways().get(scenario.name),
            "next_exercise": guided.next_exercise(scenario.name) if run.finished else None}


WATCH_MARK = "**What to watch:**"


def what_to_watch(narrative: str) -> tuple[str | None, str]:
    """(the narrative's "What to watch" paragraph, the rest of it): the guided page keeps the first
    in view beside the panels and folds the story."""
    paragraphs = narrative.strip().split("\n\n")
    watch = next((p for p in paragraphs if p.lstrip().startswith(WATCH_MARK)), None)
    return watch, "\n\n".join(p for p in paragraphs if p is not watch)


@bp.app_context_processor
def site_nav() -> dict:
    """The header's links (templates/layout.html): Board only for the instructor of a class; and
    the exercises' titles, for the pages that name a run by its exercise."""
    return {"site_nav_board": lambda: in_class() and is_instructor(), "exercise_title": exercise_title}


def exercise_title(name: str) -> str:
    """An exercise's title for a person ("1 · A naive consumer credits twice"), its file's name if unknown;
    an exploration's scenario by its exploration ("Replay of exploration 4")."""
    exploration_id = guided.exploration_of(name)
    if exploration_id is not None:
        return f"Replay of exploration {exploration_id}"
    path = next((p for p in built_in() if p.stem == name), None)
    try:
        return load(path).title if path else name
    except ScenarioError:
        return name


@bp.get("/runs/<int:run_id>")
def show(run_id: int):
    return render_template("scenarios/run.html", push=bool(current_app.config.get("LIVE_PUSH")), **_context(run_id))


@bp.get("/runs/<int:run_id>/guide")
def guide(run_id: int):
    """The steps panel alone: what the page polls while a step runs when push is unavailable."""
    return render_template("scenarios/_guide.html", error=None, **_context(run_id))


@bp.get("/runs/<int:run_id>/stream")
def run_stream(run_id: int):
    """The run's steps panel (event ``run-guide``) and live panel (``run-live``) as server-sent
    events, each whenever it changes: the HTML of ``/guide`` and ``/live``."""
    row = _run_row(run_id)
    return push.stream_of([RunFeed(row["id"], Lab(row["lab"]))], str(row["id"]))


def _gone(element_id: str) -> str:
    """What a run's panel shows once the run's row is gone (a class reset deletes its lab's runs)."""
    return (f'<section class="panel" id="{element_id}"><p class="badge bad" role="alert">This run is no longer '
            f'here: its lab was reset or dropped. <a href="{url_for("scenarios.index")}">Back to the exercises</a>'
            '</p></section>')


class RunFeed(push.Partials):
    """A guided run's steps and live panels, rendered once a look for every viewer of the run."""
    gap = 0.5  # its live panel reads the whole lab (observe): at most twice a second

    def __init__(self, run_id: int, lab: Lab):
        super().__init__(f"run:{run_id}", lab, {"run-guide": self._guide, "run-live": self._live})
        self.run_id = run_id

    def _row(self) -> dict | None:
        with db.engine.connect() as conn:
            return scenario_runs.get(conn, self.run_id)

    def _guide(self) -> str:
        row = self._row()
        if row is None:
            return _gone("guide")
        return render_template("scenarios/_guide.html", error=None, **run_context(row))

    def _live(self) -> str:
        row = self._row()
        return _gone("live-gone") if row is None else live_html(run_context(row))


@bp.post("/runs/<int:run_id>/next")
def next_step(run_id: int):
    row = _run_row(run_id)
    require_drivable(row["lab"])
    if not guided.claim(db.engine, run_id):
        return _respond(run_id, error="A step of this run is already running; wait for it."), 409
    if not command_channel.live_agents(db.engine):
        guided.release(db.engine, run_id)
        return _respond(run_id, error="No lab agent is running: start the lab with `make run` "
                                      "(or `flask --app app lab agent`).")
    try:
        step = commands.encode(verbs.SCENARIO_STEP, commands.ScenarioStep(run_id=run_id))
        command_id = command_channel.enqueue(db.engine, row["lab"], verbs.SCENARIO_STEP, step)
        command_channel.wait_for(db.engine, command_id, HAND_OVER_SECONDS)
    except command_channel.CommandStillRunning:
        # A busy agent took the step late: it runs, and releases the run when it ends. Released
        # here, a second click would start the same step again beside it (seen at 30 attendees: a
        # step's events published twice).
        return _respond(run_id)
    except command_channel.CommandError as problem:
        guided.release(db.engine, run_id)  # withdrawn: no agent will run it
        return _respond(run_id, error=f"{type(problem).__name__}: {problem}")
    return _respond(run_id)


def _respond(run_id: int, error: str | None = None):
    if request.headers.get("HX-Request"):
        context = _context(run_id)
        return render_template("scenarios/_guide.html", error=error or context["run"].error, **context)
    return redirect(url_for("scenarios.show", run_id=run_id), code=303)


@bp.get("/runs/<int:run_id>/live")
def live(run_id: int):
    """The run's lab, live: accounts (per lane), verdict, consumers, expectations, timeline."""
    return live_html(_context(run_id))


def live_html(context: dict) -> str:
    lab = Lab(context["row"]["lab"])
    try:
        snap = observe(db.engine, lab)
        checks = check_expectations(context["scenario"], snap, context["run"])
        with lab_session(lab.schema) as session:
            entries = timeline(session, limit=10) if snap.groups else []
    except SQLAlchemyError:
        snap, checks, entries = None, [], []
    return render_template("scenarios/_live.html", snap=snap, checks=checks, entries=entries, **context)
