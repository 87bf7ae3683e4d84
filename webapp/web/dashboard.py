"""The dashboard's routes: the page, its live panels, the "show the SQL" view and the per-event drill-down.

The panels, their loaders and how one is rendered are web/panels.py's; the caches that let forty
viewers cost one load per change are web/panel_cache.py's. Polled (the fallback when nothing is
pushed, web/push.py): the page asks ``GET /live`` once a second for one fingerprint per panel (a
few index lookups), and only a panel whose fingerprint differs from the one it was rendered with
fetches itself again, ``GET /panels/<name>`` (static/js/live-refresh.js). The chart keeps its
canvas and takes JSON.
"""
from __future__ import annotations

import uuid
from typing import Any

from flask import Blueprint, abort, current_app, jsonify, render_template, request
from sqlalchemy.exc import OperationalError, SQLAlchemyError

from .. import ops, strategies
from ..domain.vocabulary import DEFAULT_OUTSIDE_LANE
from ..readmodel import accounts as accounts_readmodel
from ..readmodel.drilldown import event_drilldown
from .access import current_lab, lab_db, own_lab, viewing
from .db import db
from .panels import (
    DATABASE_DOWN_FINGERPRINT,
    PANELS,
    age_label,
    duration_label,
    fingerprints,
    load_chart,
    page_contexts,
    render_panel,
    status_without_database,
)
from .security import signed_in

bp = Blueprint("dashboard", __name__)


@bp.app_template_filter("cents")
def cents_filter(value: int | None, signed: bool = False) -> str:
    if value is None:
        return "–"
    return ("{:+,.2f}" if signed else "{:,.2f}").format(value / 100)


@bp.app_template_filter("age")
def age_filter(seconds: float | None) -> str:
    return age_label(seconds)


@bp.app_template_filter("duration")
def duration_filter(seconds: float | None) -> str:
    return duration_label(seconds)


def controls_locked() -> bool:
    """Whether the controls need the token: one is set and this browser has not signed in, unless
    it is an attendee's, in their own lab (their session drives it without the token)."""
    if own_lab() and not viewing():
        return False
    return bool(current_app.config.get("LAB_TOKEN")) and not signed_in()


@bp.get("/")
def index():
    try:
        with lab_db() as (lab, session):
            contexts = page_contexts(lab, session)
            accounts = accounts_readmodel.accounts(session, lab.schema)
            ttl = ops.call("get_ttl", ops.Context(db.engine, lab), {})
    except SQLAlchemyError as error:
        return render_template("errors/error.html", code=503, message=(
            "The lab's database does not answer or the lab is not set up yet. Start it with `make run`, "
            f"or run `flask --app app lab reset`. ({type(error).__name__})")), 503
    return render_template("dashboard/index.html", lab=current_lab(), panels=contexts, accounts=accounts,
                           ttl=ttl, strategies=strategies.STRATEGIES, locked=controls_locked(),
                           push=bool(current_app.config.get("LIVE_PUSH")))


@bp.get("/live")
def live():
    """Which panels changed: ``{"fingerprints": {panel: hash}}``, polled once a second."""
    try:
        with lab_db() as (lab, session):
            return jsonify(fingerprints=fingerprints(lab, session))
    except SQLAlchemyError as error:
        # Still 503 (nothing else can be known), but the status bar is told to ask for itself:
        # it answers without the database, saying that PostgreSQL is unreachable.
        return jsonify(error=f"the lab's database does not answer ({type(error).__name__})",
                       fingerprints={"status": DATABASE_DOWN_FINGERPRINT}), 503


@bp.get("/panels/<name>")
def panel_view(name: str):
    if name not in PANELS:
        abort(404)
    if name == "status":
        try:
            return render_panel(name, request.args)
        except OperationalError as error:  # no connection (a lab not set up is the error page's)
            return status_without_database(error)
    return render_panel(name, request.args)



@bp.get("/panels/chart.json")
def chart_data():
    with lab_db() as (lab, session):
        loaded = load_chart(lab, session, fingerprints(lab, session))
        return jsonify(fingerprint=loaded.fingerprint, stale_for=loaded.stale_for, took=loaded.took, **loaded.data)


# --- drill-down ----------------------------------------------------------------------------

def _render_drilldown(details: dict[str, Any], title: str):
    template = "dashboard/event.html"
    if request.headers.get("HX-Request"):
        return render_template(template, d=details, title=title)
    return render_template("dashboard/event_page.html", d=details, title=title, lab=current_lab(),
                           template=template)


@bp.get("/events/<event_id>")
def event_view(event_id: str):
    try:
        event_id = str(uuid.UUID(event_id))
    except ValueError:
        abort(404)
    with lab_db() as (lab, session):
        details = event_drilldown(session, lab, event_id=event_id)
    if not details["journal"] and not details["deliveries"]:
        abort(404)
    return _render_drilldown(details, f"Event {event_id}")


@bp.get("/records/<int:partition>/<int:offset>")
def record_view(partition: int, offset: int):
    with lab_db() as (lab, session):
        details = event_drilldown(session, lab, position=(partition, offset))
    return _render_drilldown(details, f"Record P{partition} @ {offset}")


@bp.get("/yours")
def yours():
    """Your consumer: where your own code connects, a starter to copy, the faults."""
    lab = current_lab()
    lane = request.args.get("lane") or DEFAULT_OUTSIDE_LANE
    try:
        info = ops.call("get_yours", ops.Context(db.engine, lab, current_app.config), {"lane": lane})
    except (ops.NotFound, ops.InvalidRequest):
        info = None
    starter = render_template("yours/starter.py.j2", info=info) if info else ""
    return render_template("yours/index.html", lab=lab, info=info, starter=starter, values={"lane": lane})


@bp.get("/classroom-banner")
def classroom_banner():
    """The dashboard's classroom line alone, which an attendee's dashboard fetches every few seconds:
    an exercise the instructor starts for everyone shows up there without a reload."""
    return render_template("classroom/_banner.html")
