"""The dashboard page and its live panels.

Each panel is one partial template, ``templates/dashboard/panels/<name>.html``: the page
includes it on first render, ``GET /panels/<name>`` serves it alone, and it replaces itself
when htmx refreshes it. A panel's data comes from one loader below: HTML is rendered in one
place.
"""
from __future__ import annotations

from typing import Any, Callable

from flask import Blueprint, abort, render_template
from sqlalchemy.exc import SQLAlchemyError

from .. import state, strategies
from . import current_lab, lab_db

bp = Blueprint("dashboard", __name__)

PanelLoader = Callable[[Any, Any], dict[str, Any]]
PANELS: dict[str, PanelLoader] = {}


def panel(name: str):
    def register(loader: PanelLoader) -> PanelLoader:
        PANELS[name] = loader
        return loader
    return register


@panel("accounts")
def accounts_panel(lab, session) -> dict[str, Any]:
    return {"accounts": state.accounts(session, lab)}


@panel("partitions")
def partitions_panel(lab, session) -> dict[str, Any]:
    groups = state.groups_list(session)
    return {"partitions": state.partitions(session, lab), "groups": groups}


@panel("consumers")
def consumers_panel(lab, session) -> dict[str, Any]:
    return {"consumers": state.consumers(session, lab), "groups": state.groups_list(session)}


@panel("verdict")
def verdict_panel(lab, session) -> dict[str, Any]:
    return {"verdict": state.verdict(session, lab)}


@panel("timeline")
def timeline_panel(lab, session) -> dict[str, Any]:
    return {"entries": state.timeline(session)}


def panel_context(name: str) -> dict[str, Any]:
    with lab_db() as (lab, session):
        return {"lab": lab, **PANELS[name](lab, session)}


@bp.get("/")
def index():
    try:
        contexts = {name: panel_context(name) for name in PANELS}
    except SQLAlchemyError as error:
        return render_template("errors/error.html", code=503, message=(
            "The lab's database does not answer or the lab is not set up yet. Start it with `make run`, "
            f"or run `flask --app app lab reset`. ({type(error).__name__})")), 503
    return render_template("dashboard/index.html", lab=current_lab(), panels=contexts, strategies=strategies.STRATEGIES)


@bp.get("/panels/<name>")
def panel_view(name: str):
    if name not in PANELS:
        abort(404)
    return render_template(f"dashboard/panels/{name}.html", ctx=panel_context(name))
