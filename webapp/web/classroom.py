"""Classroom mode in the browser: /join, the instructor's board (/class) and the presenter (/present).

Which lab a request works in is decided here, once (:func:`request_lab`, behind
``web.current_lab()``):

- an attendee's browser session is bound to the attendee's own lab by /join; every page, panel,
  form and API call of that session works in it;
- a change (POST) for any other lab is refused with 403: ``?lab=`` naming another lab, or a
  session that is viewing another lab read-only;
- the instructor (signed in with LAB_TOKEN; without a token, whoever is not an attendee on this
  loopback-only server) may view any lab read-only: the API's GETs take ``?lab=``, and the board's
  "open read-only" puts the browser session in a view of that lab (dashboard and presenter);
- attendees may view another attendee's lab only when the instructor allows it
  (``LAB_CLASS_VIEW_OTHERS=1``);
- outside classroom mode, LAB_NAME as always.
"""
from __future__ import annotations

import csv
import io
import json
import time
from functools import lru_cache
from pathlib import Path
from typing import Any

from flask import (Blueprint, Flask, Response, abort, current_app, g, has_request_context, jsonify, redirect,
                   render_template, request, session, url_for)
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from ..store import classroom, command_channel
from .. import ops
from ..readmodel import state
from ..store.connection import CONTROL_SCHEMA
from .db import db, lab_session
from ..domain.lab import InvalidLabName, Lab
from ..scenarios import built_in, load
from ..scenarios.loader import Scenario
from ..scenarios.runner import RunState
from .security import client_address, token_guesses, token_matches, too_many_guesses
from .scenarios import markdown

bp = Blueprint("classroom", __name__)
C = CONTROL_SCHEMA

ATTENDEE_LAB, ATTENDEE_NAME, VIEWING = "attendee_lab", "attendee_name", "view_lab"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# The blueprints whose every request works in the request's lab: an unbound visitor joins first.
LAB_BLUEPRINTS = ("dashboard", "controls", "api", "scenarios")
# What an attendee (no LAB_TOKEN) may POST on this blueprint; everything else here is the instructor's.
ATTENDEE_POSTS = ("classroom.join", "classroom.leave", "classroom.view", "classroom.stop_viewing")
TOUCH_EVERY_SECONDS = 10.0
BOARD_LOCK_TIMEOUT = "200ms"
JOIN_TIMEOUT = 120.0  # seconds a join waits for an agent to create the attendee's lab
_touched: dict[str, float] = {}


# --- who is asking, and for which lab ---------------------------------------------------------

def _config() -> dict[str, Any]:
    return current_app.config


def in_class() -> bool:
    return classroom.enabled(_config())


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def is_instructor() -> bool:
    """Signed in with LAB_TOKEN (browser) or sending it (script). Without a token the server is
    loopback-only: whoever is not an attendee sits at the instructor's machine. A Bearer token from
    an address that guessed too often is not even compared (ratelimit.py)."""
    token = _config().get("LAB_TOKEN")
    if token:
        if session.get("lab_token_ok"):
            return True
        return not token_guesses().retry_after(client_address()) and token_matches(_bearer(), token)
    return not session.get(ATTENDEE_LAB)


def own_lab() -> str | None:
    """The attendee's lab this browser session is bound to (classroom mode only)."""
    return session.get(ATTENDEE_LAB) if in_class() else None


def home_lab() -> Lab:
    """The lab this session drives: the attendee's own, else LAB_NAME."""
    return Lab(own_lab() or _config()["LAB_NAME"])


def may_view(name: str) -> bool:
    return (name == home_lab().name or is_instructor()
            or (in_class() and bool(_config().get("LAB_CLASS_VIEW_OTHERS"))))


def viewing() -> str | None:
    """The lab this session views read-only, if it views one other than its own."""
    name = session.get(VIEWING)
    return name if name and name != home_lab().name else None


def attendee_may_post() -> bool:
    """For security.py: an attendee's session may POST without LAB_TOKEN (its own lab only, which
    request_lab enforces), and anyone may join."""
    if request.endpoint in ("classroom.join", "classroom.leave"):
        return in_class()
    if not own_lab():
        return False
    return request.blueprint != "classroom" or request.endpoint in ATTENDEE_POSTS


def request_lab() -> Lab:
    """The lab of this request (see the module); 403 for a change to another lab."""
    if not has_request_context():
        return Lab(_config()["LAB_NAME"])
    if "classroom_lab" not in g:
        g.classroom_lab = _resolve()
    return g.classroom_lab


def _named(name: str) -> Lab:
    try:
        return Lab(name)
    except InvalidLabName as error:
        abort(403, f"{error}: there is no such lab to work in")


def _resolve() -> Lab:
    home = home_lab()
    asked = request.args.get("lab") if request.path.startswith("/api/") else None
    if request.method in SAFE_METHODS:
        if asked:
            if not may_view(asked):
                abort(403, f"lab {asked} is not yours to view: you work in lab {home.name}")
            return _named(asked)
        shown = viewing()
        return Lab(shown) if shown and may_view(shown) else home
    if asked and asked != home.name:
        abort(403, f"lab {asked} is not yours: you may drive only your own lab, {home.name}")
    if viewing():
        abort(403, f"this browser views lab {viewing()} read-only: leave the view to drive lab {home.name}")
    return home


def require_drivable(lab_name: str) -> None:
    """403 unless this session may change ``lab_name`` (a guided run's lab, for instance)."""
    if not in_class():
        return
    own = own_lab()
    if own is not None and lab_name != own:
        abort(403, f"lab {lab_name} is not yours: you may drive only your own lab, {own}")
    if own is None and not is_instructor():
        abort(403, "join the class first")


def guided_run_lab() -> Lab | None:
    """The lab a guided run started by this session works in: the attendee's own lab; None for a
    fresh lab of its own (outside classroom mode, or the instructor)."""
    own = own_lab()
    return Lab(own) if own else None


def require_instructor() -> None:
    if is_instructor():
        return
    if _bearer() is not None:
        wait = token_guesses().retry_after(client_address())
        if wait:  # guessed too often: refused without a look at the token, as at sign-in
            abort(too_many_guesses(wait))
        token_guesses().record_failure(client_address())  # a wrong token counts as a guess, as at sign-in
    if _config().get("LAB_TOKEN") and not own_lab():
        abort(redirect(url_for("auth.sign_in", next=request.path)))
    abort(403, "the class board is the instructor's: sign in with the lab token")


# --- app wiring -------------------------------------------------------------------------------

def init_app(app: Flask) -> None:
    app.register_blueprint(bp)

    @app.before_request
    def join_first():
        """In classroom mode every lab page works in the visitor's own lab: join to get one."""
        if not classroom.enabled(app.config) or request.blueprint not in LAB_BLUEPRINTS:
            return None
        own = own_lab()
        if own:
            _touch(own)
            return None
        if is_instructor():
            return None
        if request.path.startswith("/api/"):
            return jsonify(error="join the class first (/join), or send Authorization: Bearer <LAB_TOKEN>"), 403
        return redirect(url_for("classroom.join", next=request.path))

    def forbidden(error):
        message = getattr(error, "description", None) or "Not allowed."
        if request.path.startswith("/api/"):
            return jsonify(error=message), 403
        return render_template("errors/error.html", code=403, message=message), 403

    app.register_error_handler(403, forbidden)

    @app.context_processor
    def classroom_context() -> dict[str, Any]:
        return {"classroom_banner": banner}


def _touch(lab: str) -> None:
    now = time.monotonic()
    if now - _touched.get(lab, 0.0) < TOUCH_EVERY_SECONDS:
        return
    _touched[lab] = now
    try:
        classroom.touch(db.engine, lab)
    except SQLAlchemyError:
        pass  # last activity is a courtesy of the board; never fail a page for it


def banner() -> dict[str, Any] | None:
    """What the dashboard's classroom line says: who you are, what you view, your exercise."""
    if not has_request_context() or not in_class():
        return None
    shown = viewing()
    own = own_lab()
    if not shown and not own:
        return {"instructor": is_instructor(), "name": None, "lab": None, "viewing": None, "run": None}
    run = None
    if own and not shown:
        with db.engine.connect() as conn:
            run = classroom.latest_runs(conn, [own]).get(own)
    return {"instructor": is_instructor(), "name": session.get(ATTENDEE_NAME), "lab": own, "viewing": shown,
            "run": run}


# --- /join ------------------------------------------------------------------------------------

@bp.route("/join", methods=["GET", "POST"])
def join():
    if not in_class():
        return render_template("errors/error.html", code=404, message=(
            "This lab runs no class: the instructor turns classroom mode on with LAB_CLASS_CODE "
            "(or LAB_CLASSROOM=1).")), 404
    code = classroom.class_code(_config())
    values = request.form.to_dict() if request.method == "POST" else {}
    if request.method == "GET":
        return render_template("classroom/join.html", needs_code=bool(code), values=values, errors={},
                               me=session.get(ATTENDEE_NAME), my_lab=own_lab())
    # The class code is a shared secret like the lab token: guesses share its limit per address.
    wait = token_guesses().retry_after(client_address()) if code else 0
    if wait:
        return too_many_guesses(wait)
    try:
        name = classroom.clean_name(values.get("name"))
        if code and not token_matches(str(values.get("code", "")).strip(), code):
            token_guesses().record_failure(client_address())
            raise classroom.ClassroomError("code", "that is not this class's code: ask the instructor")
        attendee, created = _open_lab(code, name)
    except classroom.ClassroomError as error:
        status = 403 if error.field == "code" else (409 if error.field == "class" else 400)
        return render_template("classroom/join.html", needs_code=bool(code), values=values,
                               errors={error.field: str(error)}, me=None, my_lab=None), status
    except ops.NoAgent:
        return render_template("classroom/join.html", needs_code=bool(code), values=values,
                               errors={"class": "No lab agent is running, so no lab can be opened: "
                                                "tell the instructor."}, me=None, my_lab=None), 503
    session.pop(VIEWING, None)
    session[ATTENDEE_LAB], session[ATTENDEE_NAME] = attendee.lab, attendee.name
    return redirect(url_for("dashboard.index"), code=303)


def _open_lab(code: str, name: str) -> tuple[classroom.Attendee, bool]:
    """The attendee's lab: reopened when they joined before, else created (through an agent)."""
    with db.engine.connect() as conn:
        found = classroom.find_attendee(conn, code, name)
        if found is not None:
            return found, False
        full = classroom.lab_count_limit_reached(conn, _config())
        if full:
            raise classroom.ClassroomError("class", full)
        taken = set(classroom.lab_names(conn))
    lab_name = classroom.new_lab_name(name)
    while lab_name in taken:
        lab_name = classroom.new_lab_name(name)
    lab = Lab(lab_name)
    if not command_channel.live_agents(db.engine):
        raise ops.NoAgent("no lab agent is running")
    try:
        # A whole class joining at once queues its labs at the agents: wait longer than for a click.
        command_channel.run(db.engine, lab.name, "lab.ensure", {"partitions": _config()["LAB_PARTITIONS"]},
                     timeout=JOIN_TIMEOUT)
    except command_channel.CommandError as error:
        raise classroom.ClassroomError("class", f"your lab could not be created ({error}): try again") from None
    return classroom.add_attendee(db.engine, code, name, lab.name), True


@bp.post("/join/leave")
def leave():
    """Unbind this browser from its lab (the lab stays; joining again with the name reopens it)."""
    for key in (ATTENDEE_LAB, ATTENDEE_NAME, VIEWING):
        session.pop(key, None)
    return redirect(url_for("classroom.join"), code=303)


# --- viewing another lab read-only ------------------------------------------------------------

@bp.post("/labs/<name>/view")
def view(name: str):
    """Look at lab ``name`` read-only in this browser (dashboard, presenter); controls refuse."""
    lab = _named(name)
    if not may_view(lab.name):
        abort(403, f"lab {lab.name} is not yours to view")
    if lab.name == home_lab().name:
        session.pop(VIEWING, None)
    else:
        session[VIEWING] = lab.name
    target = request.form.get("to")
    return redirect(url_for("classroom.present") if target == "present" else url_for("dashboard.index"), code=303)


@bp.post("/labs/view/leave")
def stop_viewing():
    session.pop(VIEWING, None)
    return redirect(url_for("classroom.board") if is_instructor() and in_class() else url_for("dashboard.index"),
                    code=303)


# --- the instructor's board -------------------------------------------------------------------

def cards() -> list[dict[str, Any]]:
    """One card per attendee of this class: exercise and step, verdict, consumers, last activity."""
    code = classroom.class_code(_config())
    with db.engine.connect() as conn:
        people = classroom.attendees(conn, code)
        labs = [person.lab for person in people]
        runs = classroom.latest_runs(conn, labs)
        consumers = classroom.live_consumers(conn, labs)
        idle = {lab: classroom.idle_seconds(conn, Lab(lab)) for lab in labs}
    result = []
    for person in people:
        lab = Lab(person.lab)
        try:
            with lab_session(lab.schema) as session_:
                # The board must never hold up (or deadlock with) a lab being reset or dropped: a
                # lock it cannot get at once makes the card say "unavailable" until the next refresh.
                session_.execute(text(f"SET LOCAL lock_timeout = '{BOARD_LOCK_TIMEOUT}'"))
                verdict = state.verdict(session_, lab)
        except SQLAlchemyError:
            verdict = None
        run = runs.get(person.lab)
        scenario = exercise(run["scenario"]) if run else None
        progress = RunState.from_dict(run["progress"]) if run else None
        quiet = min(t for t in (idle.get(person.lab), person.seen_seconds_ago) if t is not None)
        result.append({
            "name": person.name, "lab": person.lab, "joined_at": person.joined_at,
            "exercise": scenario.title if scenario else (run["scenario"] if run else None),
            "run_id": run["id"] if run else None, "run_status": run["status"] if run else None,
            "step": progress.position if progress else None,
            "steps": len(scenario.steps) if scenario else None,
            "verdict": verdict.status if verdict else "unavailable",
            "duplicates_applied": verdict.duplicates_applied if verdict else None,
            "effects_lost": verdict.effects_lost if verdict else None,
            "consumers": consumers.get(person.lab, 0),
            "idle_seconds": round(quiet, 1),
        })
    return result


@lru_cache(maxsize=64)
def _parsed(path: Path, modified: float) -> Scenario:
    return load(path)


def exercise(name: str) -> Scenario | None:
    """A built-in exercise by name, parsed once per version of its file (the board and the
    presenter ask every second; parsing all of them takes about a second)."""
    path = next((p for p in built_in() if p.stem == name), None)
    return _parsed(path, path.stat().st_mtime) if path else None


def _exercises() -> list[tuple[str, str]]:
    return [(path.stem, _parsed(path, path.stat().st_mtime).title) for path in built_in()]


@bp.get("/class")
def board():
    require_instructor()
    if not in_class():
        return render_template("errors/error.html", code=404, message=(
            "This lab runs no class: set LAB_CLASS_CODE (or LAB_CLASSROOM=1) to turn classroom mode on.")), 404
    return render_template("classroom/board.html", cards=cards(), exercises=_exercises(),
                           notice=request.args.get("notice"), code=classroom.class_code(_config()))


@bp.get("/class/cards")
def board_cards():
    """The cards alone: the board refreshes them every few seconds."""
    require_instructor()
    return render_template("classroom/_cards.html", cards=cards())


@bp.post("/class/start")
def start_for_everyone():
    """A guided run of one exercise in every attendee's lab; each attendee steps through it."""
    require_instructor()
    name = request.form.get("scenario", "")
    scenario = exercise(name) if name else None
    if scenario is None:
        abort(400, f"no exercise named {name!r}")
    code = classroom.class_code(_config())
    with db.engine.begin() as conn:
        people = classroom.attendees(conn, code)
        for person in people:
            run = RunState(scenario=scenario.name, lab=person.lab)
            conn.execute(text(f"INSERT INTO {C}.scenario_runs (scenario, lab, status, progress) "
                              "VALUES (:n, :lab, 'ready', CAST(:p AS jsonb))"),
                         {"n": scenario.name, "lab": person.lab, "p": json.dumps(run.as_dict())})
    return redirect(url_for("classroom.board", notice=f"{scenario.title}: started in {len(people)} lab(s)"),
                    code=303)


def _reset(labs: list[str]) -> None:
    """Ask the agents to reset these labs; they do it one after the other, the board shows it."""
    if not command_channel.live_agents(db.engine):
        abort(503, "no lab agent is running: nothing can be reset")
    partitions = _config()["LAB_PARTITIONS"]
    for lab in labs:
        command_channel.enqueue(db.engine, lab, "lab.reset", {"partitions": partitions})


@bp.post("/class/labs/<name>/reset")
def reset_one(name: str):
    require_instructor()
    lab = _named(name)
    with db.engine.connect() as conn:
        if classroom.attendee_of_lab(conn, lab.name) is None:
            abort(404, f"no attendee works in lab {lab.name}")
    _reset([lab.name])
    return redirect(url_for("classroom.board", notice=f"lab {lab.name}: reset requested"), code=303)


@bp.post("/class/reset")
def reset_all():
    require_instructor()
    with db.engine.connect() as conn:
        labs = [person.lab for person in classroom.attendees(conn, classroom.class_code(_config()))]
    _reset(labs)
    return redirect(url_for("classroom.board", notice=f"{len(labs)} lab(s): reset requested"), code=303)


CSV_COLUMNS = ("name", "lab", "exercise", "run_status", "step", "steps", "verdict", "duplicates_applied",
               "effects_lost", "consumers", "idle_seconds")


@bp.get("/class/results.csv")
def results_csv():
    require_instructor()
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for card in cards():
        writer.writerow(card)
    return Response(out.getvalue(), mimetype="text/csv",
                    headers={"Content-Disposition": "attachment; filename=class-results.csv"})


# --- the presenter view -----------------------------------------------------------------------

PRESENT_PANELS = ("partitions", "consumers", "verdict", "accounts", "timeline", "sql")


def _present_run(lab: Lab) -> tuple[dict[str, Any] | None, Any, RunState | None]:
    with db.engine.connect() as conn:
        run = classroom.latest_runs(conn, [lab.name]).get(lab.name)
    if run is None:
        return None, None, None
    return run, exercise(run["scenario"]), RunState.from_dict(run["progress"])


@bp.get("/present")
def present():
    """One 1280×720 screen: the current exercise's step and note, and its essential panels."""
    from . import current_lab, dashboard

    lab = current_lab()
    run, scenario, progress = _present_run(lab)
    panels = {name: dashboard.panel_context(name) for name in PRESENT_PANELS}
    return render_template("classroom/present.html", lab=lab, panels=panels, run=run, scenario=scenario,
                           progress=progress, read_only=bool(viewing()), markdown=markdown)


@bp.get("/present/guide")
def present_guide():
    """The presenter's step line, polled every second."""
    from . import current_lab

    lab = current_lab()
    run, scenario, progress = _present_run(lab)
    return render_template("classroom/_present_guide.html", lab=lab, run=run, scenario=scenario, progress=progress,
                           markdown=markdown)
