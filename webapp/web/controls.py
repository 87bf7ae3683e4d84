"""The dashboard's controls: HTML forms that run operations of the registry, as the JSON API does.

Every form posts here with its CSRF token (htmx sends it as X-CSRFToken, see layout.html) and
gets back its own form, which htmx swaps in place:
- done: the form again, with a notice saying what happened (the panels show the effect);
- bad input (ops.InvalidRequest): status 422, the error next to the named field, and nothing
  changed, because operations validate before they act;
- unknown consumer or group: 404 with the reason; no running lab agent: 503 with a banner.
Consumer buttons answer with a notice only (``controls/notice.html``). An operation with no
dedicated form here gets one through ``POST /controls/op/<name>`` and its template
``controls/ops/<name>.html``.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from flask import Blueprint, abort, g, render_template, request
from jinja2 import TemplateNotFound
from werkzeug.exceptions import HTTPException

from .. import ops, strategies
from ..domain import events
from ..domain.vocabulary import EXPLORER_FAULT_KINDS, Limits
from ..ops.publishing import template_event
from ..readmodel import accounts as accounts_readmodel
from .access import current_lab, home_lab, lab_db
from .api import ops_context
from .explorations import your_lanes
from .panels import duration_label, render_panel

bp = Blueprint("controls", __name__, url_prefix="/controls")

NO_AGENT = ("No lab agent is running, so nothing was done. Start the lab with `make run` "
            "(it starts the agent), then try again.")

# The fields each form shows: an error about any other field is shown at the top of the form.
FORM_FIELDS = {
    "publish": ("mode", "type", "account_id", "amount", "status", "balance_cents", "score", "count", "event_id",
                "poison_kind", "idempotent", "max_in_flight", "acks", "retries"),
    "consumer_add": ("group", "strategy", "name"),
    "strategy": ("group", "strategy"),
    "offsets": ("group", "mode", "offsets", "back", "timestamp"),
    "lane": ("lane", "strategy"),
    "ttl": ("ttl_seconds", "ttl_schedule_seconds"),
    "reset": ("confirm", "partitions"),
}

Renderer = Callable[..., tuple[str, int]]


@bp.app_context_processor
def control_choices() -> dict[str, Any]:
    """The menus every control form offers, wherever the form is rendered."""
    try:
        topic = current_lab().topic
    except HTTPException:  # the page of a refused request (a change while viewing read-only): no lab
        topic = home_lab().topic
    return {"poison_kinds": [(kind, kind.replace("-", " ")) for kind in events.POISON_PILLS],
            "strategy_names": strategies.NAMES, "lab_topic": topic, "limits": Limits,
            "explorer_fault_kinds": EXPLORER_FAULT_KINDS,
            # Called by the explorer's form only: a query of the lab's groups, not on every page.
            "your_lanes": lambda: your_lanes(current_lab())}


def run_op(name: str, body: dict[str, Any]) -> dict:
    """Run operation ``name`` on the current lab with ``body``."""
    result = ops.call(name, ops_context(), body)
    g.not_yet_seen_by = result.get("not_yet_seen_by")
    return result


def said_with_unseen(message: str) -> str:
    """The notice, and who has not read the change yet (an operation that settles consumers)."""
    unseen = g.get("not_yet_seen_by")
    if unseen:
        message += (f" Not yet read by {', '.join(unseen)} (busy with a record): "
                    "it applies from their next record.")
    return message


def run_form(form: str, render: Renderer, action: Callable[[dict[str, Any]], str],
             fields: tuple[str, ...] | None = None):
    """Run ``action(values)``; answer with the form rendered for the outcome. An error about a
    field the form does not show (``fields``, by default FORM_FIELDS[form]) goes to its top."""
    values = request.form.to_dict()
    try:
        notice = said_with_unseen(action(values))
    except ops.InvalidRequest as error:
        field = error.field if error.field in (fields if fields is not None else FORM_FIELDS[form]) else "form"
        # The agent's reasons start with the field's name; next to the field it goes without saying.
        message = error.message.removeprefix(f"{error.field}: ")
        return render(form=form, values=values, errors={field: message}, status=422)
    except ops.NotFound as error:
        return render(form=form, values=values, errors={"form": str(error)}, status=404)
    except ops.AgentTimedOut as error:
        return render(form=form, values=values, banner=f"{error}.", status=503)
    except ops.NoAgent:
        return render(form=form, values=values, banner=NO_AGENT, status=503)
    return render(form=form, values=values, notice=notice)


def template_renderer(template: str, **fixed: Any) -> Renderer:
    def render(status: int = 200, **context: Any) -> tuple[str, int]:
        return render_template(template, **fixed, **context), status
    return render


def group_controls_renderer(status: int = 200, **context: Any) -> tuple[str, int]:
    return render_panel("group_controls", status=status, **context)


def lab_accounts():
    with lab_db() as (lab, session):
        return accounts_readmodel.accounts(session, lab.schema)


# --- publish -------------------------------------------------------------------------------

@bp.post("/publish")
def publish():
    def action(values: dict[str, Any]) -> str:
        body = {**values, "idempotent": values.get("idempotent", "off")}
        result = run_op("publish", body)
        records = result["records"]
        where = ", ".join(f"P{r['partition']} @ {r['offset']}" for r in records[:3] if r["partition"] is not None)
        more = f" and {len(records) - 3} more" if len(records) > 3 else ""
        return f"Published {len(records)} {result['mode']} record(s){': ' + where if where else ''}{more}."
    return run_form("publish", template_renderer("controls/publish.html", accounts=lab_accounts()), action)


# --- consumers -----------------------------------------------------------------------------

@bp.post("/consumers")
def start_consumer():
    def action(values: dict[str, Any]) -> str:
        result = run_op("start_consumer", values)
        return f"Started consumer {result['name']} in {result['group_id']} (pid {result['pid']})."
    return run_form("consumer_add", template_renderer("controls/consumer_add.html"), action)


def notice(message: str, ok: bool = True, status: int = 200):
    return render_template("controls/notice.html", message=message, ok=ok), status


def run_consumer_action(action: Callable[[], str]):
    """A consumer button: answer with a notice for the page's notice area."""
    try:
        return notice(said_with_unseen(action()))
    except ops.InvalidRequest as error:
        # "must be one of ..." needs its subject; other reasons name it already.
        message = f"{error.field} {error.message}" if error.message.startswith("must") else error.message
        return notice(message, ok=False, status=422)
    except ops.NotFound as error:
        return notice(str(error), ok=False, status=404)
    except (ops.NoFaultProxy, ops.AgentTimedOut) as error:
        return notice(f"{error}.", ok=False, status=503)
    except ops.NoAgent:
        return notice(NO_AGENT, ok=False, status=503)


VERB_DONE = {"kill": "killed (SIGKILL)", "freeze": "frozen (SIGSTOP)", "thaw": "thawed (SIGCONT)",
             "stop": "stopped", "restart": "restarted"}


@bp.post("/consumers/<int:consumer_id>/<any(kill, freeze, thaw, stop, restart):verb>")
def consumer_action(consumer_id: int, verb: str):
    def action() -> str:
        result = run_op(f"{verb}_consumer", {"consumer_id": consumer_id})
        return f"Consumer {result.get('name') or consumer_id} {VERB_DONE[verb]}."
    return run_consumer_action(action)


def fault_body(value: str) -> dict[str, Any]:
    """The fault menu's ``crash|once|after-commit`` as operations.arm's fields; empty disarms."""
    if not value:
        return {}
    action, _, rest = value.partition("|")
    how, _, point = rest.partition("|")
    return {"point": point, "action": action, "always": how == "always"}


@bp.post("/consumers/<int:consumer_id>/arm")
def arm(consumer_id: int):
    def action() -> str:
        result = run_op("arm", {**fault_body(request.form.get("fault", "")), "consumer_id": consumer_id})
        armed, name = result["armed"], result["name"]
        if not armed["point"]:
            return f"Consumer {name}: fault disarmed."
        return (f"Consumer {name}: {armed['action']} armed at {armed['point']} "
                f"({'every time' if armed['always'] else 'once'}).")
    return run_consumer_action(action)


@bp.post("/consumers/<int:consumer_id>/commits-blocked")
def block_commits(consumer_id: int):
    def action() -> str:
        result = run_op("block_commits", {**request.form.to_dict(), "consumer_id": consumer_id})
        name = consumer_name(consumer_id)
        left = result["commits_blocked_of"].get(name)
        if left is None:
            return f"Consumer {name}: its offset commits reach the broker again."
        return (f"Consumer {name}: its offset commits no longer reach the broker (for {left:.0f} s at most); "
                "its fetches still do.")
    return run_consumer_action(action)


def consumer_name(consumer_id: int) -> str:
    return run_op("get_consumer", {"consumer_id": consumer_id})["name"]


@bp.post("/consumers/<int:consumer_id>/step-mode")
def step_mode(consumer_id: int):
    def action() -> str:
        result = run_op("set_step_mode", {**request.form.to_dict(), "consumer_id": consumer_id})
        on = result["step_mode"]
        return f"Consumer {result['name']}: step mode {'on: it stops at every crash point' if on else 'off'}."
    return run_consumer_action(action)


@bp.post("/consumers/<int:consumer_id>/step")
def step(consumer_id: int):
    def action() -> str:
        result = run_op("step", {"consumer_id": consumer_id})
        return f"Consumer {result['name']} moves on from {result['was_at'] or 'where it waits'}."
    return run_consumer_action(action)


# --- groups, offsets, lanes ----------------------------------------------------------------

@bp.post("/groups/strategy")
def set_strategy():
    def action(values: dict[str, Any]) -> str:
        result = run_op("set_strategy", values)
        return f"{result['group_id']} now uses {result['strategy']}, from its next message."
    return run_form("strategy", group_controls_renderer, action)


def offsets_body(values: dict[str, Any]) -> dict[str, Any]:
    """Accept ``0:3, 1:5`` for the offsets field as well as the operation's JSON object."""
    raw = values.get("offsets", "").strip()
    if raw and not raw.startswith("{"):
        try:
            pairs = [piece.split(":") for piece in raw.split(",") if piece.strip()]
            values = {**values, "offsets": json.dumps({p.strip(): int(o) for p, o in pairs})}
        except ValueError:
            pass  # left as typed: the operation names the field and the expected shape
    return values


@bp.post("/groups/<group>/recover")
def recover_group(group: str):
    """The group card's and the status bar's button: a notice says what the recovery did."""
    def action() -> str:
        result = run_op("recover_group", {"group": group})
        return f"{result['group_id']}: " + "; ".join(result["steps"]) + "."
    return run_consumer_action(action)


@bp.post("/groups/reset-offsets")
def reset_offsets():
    def action(values: dict[str, Any]) -> str:
        result = run_op("reset_offsets", offsets_body(values))
        moved = ", ".join(f"P{p} → {o}" for p, o in sorted(result["offsets"].items()))
        return (f"{result['group_id']}: stopped {len(result['restarted'])} consumer(s), reset to {moved}, "
                "restarted them.")
    return run_form("offsets", group_controls_renderer, action)


@bp.post("/lanes")
def create_lane():
    """A strategy lane: its own group and copy of the accounts, and one consumer on it."""
    def action(values: dict[str, Any]) -> str:
        lane = values.get("lane", "")
        try:
            group = run_op("create_group", {"group": lane, "lane": lane, "strategy": values.get("strategy")})
        except ops.InvalidRequest as error:
            # The lane's name is its group's name too: an error about either is about this field.
            raise ops.InvalidRequest("lane" if error.field == "group" else error.field, error.message) from None
        started = run_op("start_consumer", {"group": lane})
        return (f"Lane {lane}: group {group['group_id']} with {group['strategy']} on its own accounts, "
                f"consumer {started['name']} started.")
    return run_form("lane", group_controls_renderer, action)


# --- TTL and lab ---------------------------------------------------------------------------

def ttl_renderer(status: int = 200, **context: Any) -> tuple[str, int]:
    return render_template("controls/ttl.html", ttl=run_op("get_ttl", {}), **context), status


@bp.post("/ttl")
def set_ttl():
    def action(values: dict[str, Any]) -> str:
        result = run_op("set_ttl", values)
        every = result["ttl_schedule_seconds"]
        return (f"TTL {duration_label(result['ttl_seconds'])}, "
                + (f"cleanup every {duration_label(every)}." if every else "cleanup on demand."))
    return run_form("ttl", ttl_renderer, action)


@bp.post("/ttl/cleanup")
def ttl_cleanup():
    def action(values: dict[str, Any]) -> str:
        result = run_op("ttl_cleanup", {})
        total = sum(n for counts in result["deleted"].values() for n in counts.values())
        return f"Cleanup deleted {total} key(s) older than {duration_label(result['ttl_seconds'])}."
    return run_form("ttl", ttl_renderer, action)


@bp.post("/lab/reset")
def reset_lab():
    lab = current_lab()

    def action(values: dict[str, Any]) -> str:
        # The typed lab name is the confirmation: wiping a lab is not undone.
        if values.get("confirm", "").strip() != lab.name:
            raise ops.InvalidRequest("confirm", f"type the lab's name, {lab.name}, to confirm")
        result = run_op("reset_lab", values)
        return f"Lab {lab.name} reset: {result['partitions']} partitions, 5 accounts, no consumers."
    return run_form("reset", template_renderer("controls/reset.html", lab=lab), action)


# --- any other operation: its form template names its fields --------------------------------

@bp.get("/raw-template")
def raw_template():
    """The raw-record form filled with a valid credit event to edit (a fresh event and transaction id)."""
    return render_template("controls/ops/produce_raw.html", values=template_event())


@bp.post("/op/<name>")
def run_operation(name: str):
    """Run a state-changing operation from its own form, ``controls/ops/<name>.html``: a new
    operation needs its registry entry and that template, nothing here."""
    op = ops.OPERATIONS.get(name)
    if op is None or not op.changes_state:
        abort(404)
    template = f"controls/ops/{name}.html"
    try:
        render_template(template, op=op, errors={}, values={})
    except TemplateNotFound:
        abort(404)

    def action(values: dict[str, Any]) -> str:
        result = run_op(name, values)
        said = ", ".join(f"{key} {value}" for key, value in result.items() if not isinstance(value, (dict, list)))
        return f"{op.summary.split(' (')[0]}: done" + (f" ({said})" if said else "") + "."
    return run_form(name, template_renderer(template, op=op), action, fields=tuple(op.model.model_fields))
