"""Classroom mode in the browser: /join, the instructor's board (/class) and the presenter (/present).

Which lab a request works in, and who may change it, is decided once, in access.py (the rules of
classroom mode are written there): these are the pages.
"""
from __future__ import annotations

import csv
import io
import time
from typing import Any

from flask import (
    Blueprint,
    Flask,
    Response,
    abort,
    current_app,
    has_request_context,
    jsonify,
    make_response,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from sqlalchemy.exc import SQLAlchemyError

from .. import ops
from ..domain import commands, verbs
from ..domain.lab import Lab
from ..scenarios.runner import RunState
from ..store import classroom, command_channel, scenario_runs
from . import push
from .access import (
    ATTENDEE_GENERATION,
    ATTENDEE_LAB,
    ATTENDEE_NAME,
    VIEWING,
    current_lab,
    end_attendee_session,
    home_lab,
    in_class,
    is_instructor,
    may_view,
    named_lab,
    own_lab,
    require_instructor,
    session_was_revoked,
    viewing,
)
from .board import cards_html, class_board, exercise, exercises
from .db import db
from .markdown import markdown
from .panels import panel_context
from .security import client_address, code_guesses, token_matches

bp = Blueprint("classroom", __name__)

# The blueprints whose every request works in the request's lab: an unbound visitor joins first.
LAB_BLUEPRINTS = ("dashboard", "controls", "api", "scenarios", "push")
# The classroom pages that show a lab (the presenter view): an unbound visitor joins first too.
LAB_ENDPOINTS = ("classroom.present", "classroom.present_guide", "classroom.present_stream")
TOUCH_EVERY_SECONDS = 10.0
JOIN_TIMEOUT = 120.0  # seconds a join waits for an agent to create the attendee's lab
_touched: dict[str, float] = {}


def _config() -> dict[str, Any]:
    return current_app.config


# --- app wiring -------------------------------------------------------------------------------

def init_app(app: Flask) -> None:
    app.register_blueprint(bp)

    @app.before_request
    def signed_out_if_revoked():
        """A browser session of an attendee who left or was handed over since it joined is signed out."""
        if not classroom.enabled(app.config) or not session.get(ATTENDEE_LAB) or not session_was_revoked():
            return None
        end_attendee_session()
        message = ("This browser was signed out of its lab: the attendee left the class, or the instructor handed "
                   "the lab over to another browser. Join again with your name and your rejoin code.")
        if request.path.startswith("/api/"):
            return jsonify(error=message), 403
        if request.endpoint in ("classroom.join", "static"):
            return None
        return redirect(url_for("classroom.join", next=request.path))

    @app.before_request
    def join_first():
        """In classroom mode every lab page works in the visitor's own lab: join to get one."""
        if not classroom.enabled(app.config) or (request.blueprint not in LAB_BLUEPRINTS
                                                 and request.endpoint not in LAB_ENDPOINTS):
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

def _join_page(values: dict, errors: dict, status: int = 200, **extra: Any):
    """The join form, or (``me``) who this browser is; ``rejoin_code``: a new code, shown this once."""
    code = classroom.class_code(_config())
    return render_template("classroom/join.html", needs_code=bool(code), values=values, errors=errors,
                           me=extra.get("me"), my_lab=extra.get("my_lab"), rejoin_code=extra.get("rejoin_code"),
                           notice=extra.get("notice")), status


def _too_many_codes(wait: int, values: dict):
    """429 with Retry-After, on the join page: this address guessed too often."""
    guesses = code_guesses()
    message = (f"Too many wrong codes from your address: wait {wait} s before trying again (at most "
               f"{guesses.limit} in {guesses.window:g} s).")
    response = current_app.make_response(_join_page(values, {"code": message}, 429))
    response.headers["Retry-After"] = str(wait)
    return response


@bp.route("/join", methods=["GET", "POST"])
def join():
    if not in_class():
        return render_template("errors/error.html", code=404, message=(
            "This lab runs no class: the instructor turns classroom mode on with LAB_CLASS_CODE "
            "(or LAB_CLASSROOM=1).")), 404
    code = classroom.class_code(_config())
    values = request.form.to_dict() if request.method == "POST" else {}
    values.pop("rejoin", None)  # a secret: never written back into the page
    if request.method == "GET":
        return _join_page(values, {}, me=session.get(ATTENDEE_NAME), my_lab=own_lab())
    # The class code and a rejoin code are secrets: wrong ones are counted per address, failures
    # only (ratelimit.py), apart from the instructor's token.
    wait = code_guesses().retry_after(client_address())
    if wait:
        return _too_many_codes(wait, values)
    try:
        name = classroom.clean_name(values.get("name"))
        if code and not token_matches(str(values.get("code", "")).strip(), code):
            code_guesses().record_failure(client_address())
            raise classroom.ClassroomError("code", "that is not this class's code: ask the instructor")
        attendee, rejoin = _open_lab(code, name, request.form.get("rejoin"))
    except classroom.ClassroomError as error:
        status = {"code": 403, "rejoin": 403, "class": 409}.get(error.field, 400)
        if isinstance(error, classroom.NameTaken):
            status = 409
        return _join_page(values, {error.field: str(error)}, status)
    except ops.NoAgent:
        return _join_page(values, {"class": "No lab agent is running, so no lab can be opened: tell the instructor."},
                          503)
    session.pop(VIEWING, None)
    with db.engine.connect() as conn:
        generation = classroom.session_generation(conn, attendee.lab)
    session[ATTENDEE_LAB], session[ATTENDEE_NAME], session[ATTENDEE_GENERATION] = attendee.lab, attendee.name, generation
    if rejoin:
        # Shown once, in this answer: a secret is kept in no cookie and no URL.
        return _join_page({}, {}, me=attendee.name, my_lab=attendee.lab, rejoin_code=rejoin)
    return redirect(url_for("dashboard.index"), code=303)


def _open_lab(code: str, name: str, typed_rejoin: str | None) -> tuple[classroom.Attendee, str | None]:
    """The attendee's lab and, when it changed, the rejoin code to show: a new attendee's lab is
    created (through an agent); an existing attendee's is reopened in this browser when it is
    bound to it already or brings their rejoin code."""
    with db.engine.connect() as conn:
        found = classroom.find_attendee(conn, code, name)
        if found is not None:
            if own_lab() == found.lab:
                return found, None
            if not classroom.normal_rejoin_code(typed_rejoin):
                raise classroom.NameTaken(found.name)
            if not classroom.check_rejoin_code(conn, found, typed_rejoin):
                code_guesses().record_failure(client_address())
                raise classroom.ClassroomError("rejoin", f"that is not {found.name}'s rejoin code: check it on your "
                                                         "lab's page, or ask the instructor to hand your lab over "
                                                         "from the class board")
            return found, classroom.shown_rejoin_code(typed_rejoin)
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
        ensure = commands.LabSetup(partitions=_config()["LAB_PARTITIONS"])
        command_channel.run(db.engine, lab.name, verbs.LAB_ENSURE, commands.encode(verbs.LAB_ENSURE, ensure),
                            timeout=JOIN_TIMEOUT)
    except command_channel.CommandError as error:
        raise classroom.ClassroomError("class", f"your lab could not be created ({error}): try again") from None
    try:
        return classroom.add_attendee(db.engine, code, name, lab.name)
    except classroom.NameTaken:
        # Someone joined under this name while the lab was being made: theirs is the name; this lab goes.
        command_channel.enqueue(db.engine, lab.name, verbs.LAB_DROP,
                                commands.encode(verbs.LAB_DROP, commands.NoArguments()))
        raise


@bp.post("/join/leave")
def leave():
    """Leave the class: every browser session of this attendee is signed out, this one and any copy of
    its cookie (the lab stays; joining again with the name and the rejoin code reopens it)."""
    own = own_lab()
    if own:
        classroom.revoke_sessions(db.engine, own)
    end_attendee_session()
    return redirect(url_for("classroom.join"), code=303)


# --- viewing another lab read-only ------------------------------------------------------------

@bp.post("/labs/<name>/view")
def view(name: str):
    """Look at lab ``name`` read-only in this browser (dashboard, presenter); controls refuse."""
    lab = named_lab(name)
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


# --- the instructor's board (its cards: board.py) ---------------------------------------------

def _require_class() -> None:
    require_instructor()
    if not in_class():
        abort(make_response(render_template("errors/error.html", code=404, message=(
            "This lab runs no class: set LAB_CLASS_CODE (or LAB_CLASSROOM=1) to turn classroom mode on.")), 404))


def _board_page(handed_over: dict | None = None) -> str:
    return render_template("classroom/board.html", cards_html=cards_html(class_board()), exercises=exercises(),
                           notice=request.args.get("notice"), code=classroom.class_code(_config()),
                           handed_over=handed_over, push=bool(current_app.config.get("LIVE_PUSH")))


@bp.get("/class")
def board():
    _require_class()
    return _board_page()


@bp.get("/class/cards")
def board_cards():
    """The cards alone, under the parts that are down: what the board polls when push is unavailable."""
    _require_class()
    return cards_html(class_board())


@bp.get("/class/stream")
def board_stream():
    """The cards as server-sent events (event ``board``, the HTML of ``/class/cards``) whenever they
    change, looked at once a second at most."""
    _require_class()
    return push.stream_of([class_board()], "class")


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
            scenario_runs.insert(conn, scenario.name, person.lab, run.as_dict())
    return redirect(url_for("classroom.board", notice=f"{scenario.title}: started in {len(people)} lab(s)"),
                    code=303)


def _reset(labs: list[str]) -> None:
    """Ask the agents to reset these labs; they do it one after the other, the board shows it."""
    if not command_channel.live_agents(db.engine):
        abort(503, "no lab agent is running: nothing can be reset")
    reset = commands.encode(verbs.LAB_RESET, commands.LabSetup(partitions=_config()["LAB_PARTITIONS"]))
    for lab in labs:
        command_channel.enqueue(db.engine, lab, verbs.LAB_RESET, reset)


@bp.post("/class/labs/<name>/reset")
def reset_one(name: str):
    require_instructor()
    lab = named_lab(name)
    with db.engine.connect() as conn:
        if classroom.attendee_of_lab(conn, lab.name) is None:
            abort(404, f"no attendee works in lab {lab.name}")
    _reset([lab.name])
    return redirect(url_for("classroom.board", notice=f"lab {lab.name}: reset requested"), code=303)


@bp.post("/class/labs/<name>/hand-over")
def hand_over(name: str):
    """A new rejoin code for the attendee of lab ``name`` (the old one stops working), shown to the
    instructor once: the attendee types it in a new browser to reopen their lab."""
    require_instructor()
    lab = named_lab(name)
    issued = classroom.issue_rejoin_code(db.engine, lab.name)
    if issued is None:
        abort(404, f"no attendee works in lab {lab.name}")
    attendee, rejoin = issued
    # Shown once, in this answer: a secret goes in no cookie and no URL. Every browser the attendee
    # had is signed out (issue_rejoin_code moved their session generation on).
    return _board_page(handed_over={"name": attendee.name, "lab": attendee.lab, "rejoin": rejoin})


@bp.post("/class/reset")
def reset_all():
    require_instructor()
    with db.engine.connect() as conn:
        labs = [person.lab for person in classroom.attendees(conn, classroom.class_code(_config()))]
    _reset(labs)
    return redirect(url_for("classroom.board", notice=f"{len(labs)} lab(s): reset requested"), code=303)


# A cell a spreadsheet would read as a formula (OWASP's "CSV injection"): an attendee's name is theirs
# to choose, and the instructor opens this file.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_safe(value: Any) -> Any:
    """``value``, with a text that a spreadsheet would evaluate prefixed by ``'`` so it stays text."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


CSV_COLUMNS = ("name", "lab", "exercise", "run_status", "step", "steps", "verdict", "duplicates_applied",
               "effects_lost", "consumers", "idle_seconds")


@bp.get("/class/results.csv")
def results_csv():
    require_instructor()
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    for card in class_board().cards(read_changed=True):  # an export reads every changed lab now
        writer.writerow({key: spreadsheet_safe(value) for key, value in card.items()})
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
    lab = current_lab()
    run, scenario, progress = _present_run(lab)
    panels = {name: panel_context(name) for name in PRESENT_PANELS}
    return render_template("classroom/present.html", lab=lab, panels=panels, run=run, scenario=scenario,
                           progress=progress, read_only=bool(viewing()), markdown=markdown,
                           push=bool(current_app.config.get("LIVE_PUSH")))


@bp.get("/present/guide")
def present_guide():
    """The presenter's step line: what the page polls when push is unavailable."""
    return present_guide_html(current_lab())


def present_guide_html(lab: Lab) -> str:
    run, scenario, progress = _present_run(lab)
    return render_template("classroom/_present_guide.html", lab=lab, run=run, scenario=scenario, progress=progress,
                           markdown=markdown)


@bp.get("/present/stream")
def present_stream():
    """The presenter's stream: its lab's panels, as ``/stream`` sends them, and its step line
    (event ``present-guide``)."""
    lab = current_lab()
    step_line = push.Partials(f"present:{lab.name}", lab, {"present-guide": lambda: present_guide_html(lab)})
    return push.stream_of([push.lab_panels(lab), step_line], lab.name)
