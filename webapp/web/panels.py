"""The dashboard's panels: one registry entry each, its loader, and how a panel is rendered.

Each panel is one partial template, ``templates/dashboard/panels/<name>.html`` unless its entry
names another: the page includes it on first render, ``GET /panels/<name>`` serves it alone, and
it replaces itself when it is refreshed. A panel's data comes from its loader, registered with
:func:`panel` beside it: adding a panel is one decorated function here and its template.

A panel's fingerprint is a short hash of the parts of the lab it depends on
(readmodel/fingerprints.py): the page is told to refresh only the panels whose fingerprint changed
(static/js/live-refresh.js), and a panel's data is loaded once per fingerprint (web/panel_cache.py).
Pushed (web/push.py): each web process renders a lab's changed panels once per change
(:func:`render_pushed`) and sends the same HTML to every viewer of the lab.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from flask import g, render_template
from sqlalchemy.exc import OperationalError

from .. import ops, strategies
from ..domain.group_health import SESSION_TIMEOUT_MS
from ..domain.vocabulary import EXACT_COUNT_BELOW
from ..readmodel import accounts as accounts_readmodel
from ..readmodel import consumers as consumers_readmodel
from ..readmodel import fingerprints as fingerprints_readmodel
from ..readmodel import group_health as group_health_readmodel
from ..readmodel import notifications as notifications_readmodel
from ..readmodel import service_health as service_health_readmodel
from ..readmodel import verdict as verdict_readmodel
from ..readmodel.chart import chart_series
from ..readmodel.dedup import dedup_tables
from ..readmodel.groups import groups_kafka_settings, groups_list
from ..readmodel.lanes import lanes
from ..readmodel.partitions import partitions
from ..readmodel.timeline import timeline
from ..store.consumers import LIVE_STATES
from ..strategies.base import SESSION_SETTINGS
from ..strategies.notification import strategy_with
from .access import current_lab, lab_db
from .db import db, lab_session
from .panel_cache import Loaded, apart, cached, cached_fingerprints

PanelLoader = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class Panel:
    name: str
    loader: PanelLoader
    # The fingerprint parts (readmodel/fingerprints.py) whose change means this panel changed.
    depends: tuple[str, ...]
    template: str
    # Whether a slow load may be answered from the last one: only a panel in the shared frame, which
    # says so on the page (dashboard/panels/_frame.html); the others are always loaded in the request.
    may_be_stale: bool = True


PANELS: dict[str, Panel] = {}


def panel(name: str, depends: tuple[str, ...], template: str | None = None, may_be_stale: bool = True):
    """Register the decorated loader as the panel ``name``: ``loader(lab, session, args)`` returns
    its template's data, ``depends`` names the fingerprint parts it reads, ``template`` defaults to
    ``dashboard/panels/<name>.html``."""
    def register(loader: PanelLoader) -> PanelLoader:
        PANELS[name] = Panel(name, loader, depends, template or f"dashboard/panels/{name}.html", may_be_stale)
        return loader
    return register


def age_label(seconds: float | None) -> str:
    """A coarse age: it changes (and so refreshes its panel) at most once a second, less when old."""
    if seconds is None:
        return "–"
    if seconds < 120:
        return f"{int(seconds)} s"
    if seconds < 7200:
        return f"{int(seconds // 60)} min"
    if seconds < 172800:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} d"


def duration_label(seconds: float | None) -> str:
    """A setting's length in the largest whole unit: 604800 -> 7 d."""
    if seconds is None:
        return "off"
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)} {unit}"
    return f"{seconds:g} s"



# --- panels --------------------------------------------------------------------------------

@panel("accounts", depends=("journal", "effects"))
def accounts_panel(lab, session, args) -> dict[str, Any]:
    return {"accounts": accounts_readmodel.accounts(session, lab.schema)}


@panel("partitions", depends=("journal", "effects", "offsets", "consumers", "groups"))
def partitions_panel(lab, session, args) -> dict[str, Any]:
    groups = groups_list(session)
    shown = groups[0]["group_id"] if groups else None
    # Positions of the shown group's consumers only: a lane's consumer reads the same log elsewhere.
    readers = {c["name"] for c in consumers_readmodel.consumers(session, lab) if c["group_id"] == shown}
    return {"partitions": partitions(session, lab), "groups": groups, "shown_group": shown, "readers": readers}


@panel("consumers", depends=("consumers", "groups", "offsets", "notifications", "group_health"))
def consumers_panel(lab, session, args) -> dict[str, Any]:
    consumers = consumers_readmodel.consumers(session, lab)
    notify = notifications_readmodel.settings_by_group(session)
    for consumer in consumers:
        strategy = strategies.STRATEGIES.get(consumer["strategy"] or "")
        if strategy and consumer["group_id"] in notify:
            strategy = strategy_with(strategy, notify[consumer["group_id"]])  # its points include the call's
        consumer["points"] = strategy.points if strategy else strategies.POINTS
        consumer["live"] = consumer["state"] in LIVE_STATES
    health = group_health_readmodel.group_health(session, lab)
    groups = [{**group, "health": health.get(group["group_id"])} for group in groups_list(session)]
    # The group cards' countdown while a rebalance waits on a member's session (consumers.html).
    return {"consumers": consumers, "groups": groups, "session_timeout_seconds": SESSION_TIMEOUT_MS / 1000}


@panel("verdict", depends=("journal", "effects", "offsets", "groups"))
def verdict_panel(lab, session, args) -> dict[str, Any]:
    return {"verdict": verdict_readmodel.verdict(session, lab.schema)}


@panel("timeline", depends=("timeline", "effects"))
def timeline_panel(lab, session, args) -> dict[str, Any]:
    return {"entries": timeline(session, limit=14)}


@panel("dedup", depends=("effects", "settings", "oldest_key_age"))
def dedup_panel(lab, session, args) -> dict[str, Any]:
    ttl = ops.call("get_ttl", ops.Context(db.engine, lab), {})
    return {"tables": dedup_tables(session, ttl["ttl_seconds"]), "ttl": ttl,
            "exact_count_below": EXACT_COUNT_BELOW}


@panel("lanes", depends=("groups", "journal", "effects"))
def lanes_panel(lab, session, args) -> dict[str, Any]:
    # The expected balances are the accounts panel's: reuse its data while its fingerprint stands,
    # never an older load (this panel would show it as its own, unmarked).
    accounts = _load(lab, session, "accounts", g.fingerprints["accounts"], {}, may_be_stale=False).data["accounts"]
    return {"lanes": lanes(session, lab), "accounts": accounts}


@panel("chart", depends=("journal", "effects"))
def chart_panel(lab, session, args) -> dict[str, Any]:
    # The panel is a canvas drawn by static/js/chart.js from GET /panels/chart.json.
    return {}


@panel("sql", depends=("groups", "consumers", "settings", "notifications"))
def sql_panel(lab, session, args) -> dict[str, Any]:
    groups = groups_list(session)
    chosen = args.get("strategy")
    if chosen not in strategies.STRATEGIES:
        chosen = groups[0]["strategy"] if groups else "none"
    # A group that notifies runs the plan with the call and the crash points around it.
    # A partitioned processed_events has its own claim: the plan shows the one that runs.
    from ..readmodel.scale import layout_of
    partitioned = layout_of(session) == "partitioned-by-day"
    strategy = strategy_with(strategies.get(chosen, partitioned=partitioned),
                             notifications_readmodel.settings_for_strategy(session, chosen))
    consumers = [c for c in consumers_readmodel.consumers(session, lab)
                 if c["strategy"] == chosen and c["state"] in LIVE_STATES + ("crashed",)]
    return {"strategy": strategy, "strategies": strategies.STRATEGIES, "blocks": plan_blocks(strategy.plan),
            # Batch mode's plan (dashboard/panels/_batch_plan.html): the statements apply_batch runs.
            "batch_blocks": plan_blocks(strategy.batch_plan),
            "groups": [g["group_id"] for g in groups if g["strategy"] == chosen],
            "kafka_settings": [g for g in groups_kafka_settings(session) if g["strategy"] == chosen],
            "armed": {p: [c for c in consumers if c["armed_point"] == p] for p in strategy.points},
            "here": {p: [c for c in consumers if c["step_at"] == p] for p in strategy.points},
            "session_sql": SESSION_SETTINGS,
            "session": ops.call("get_database_settings", ops.Context(db.engine, lab), {})}


@panel("status", depends=("services", "group_health"), may_be_stale=False)
def status_panel(lab, session, args) -> dict[str, Any]:
    """The top bar: each part the lab depends on that is down (PostgreSQL, the agent, the broker,
    the log reader, the notification service), with what it means and what to do; and every
    stalled group, with what is stuck and the control that recovers it."""
    parts = service_health_readmodel.service_health(session, lab)
    stalled = [{**group, "group": lab.local_group(group["group_id"])}
               for group in group_health_readmodel.stalled(session, lab)]
    return {"parts": parts, "down": service_health_readmodel.down(parts), "stalled": stalled}


# What the status bar is rendered for while PostgreSQL does not answer: no fingerprint can be
# computed then, so /live names this one, and the bar asks for itself once.
DATABASE_DOWN_FINGERPRINT = "database-unreachable"


def status_without_database(error: OperationalError):
    """The status bar when this process cannot reach PostgreSQL: answered (200), saying so."""
    parts = service_health_readmodel.database_unreachable(service_health_readmodel.driver_error(error))
    return render_template(PANELS["status"].template, ctx={
        "lab": current_lab(), "fingerprint": DATABASE_DOWN_FINGERPRINT, "stale_for": None, "took": 0.0, "query": {},
        "parts": parts, "down": service_health_readmodel.down(parts), "stalled": []})


@panel("chaos", depends=("timeline", "journal", "effects", "offsets", "groups", "agent"))
def chaos_panel(lab, session, args) -> dict[str, Any]:
    """Chaos mode: the sessions, the actions so far, and whether the verdict holds."""
    from ..readmodel.chaos_panel import panel_data
    sessions = ops.call("get_chaos", ops.Context(db.engine, lab), {})["sessions"]
    return panel_data(session, lab, sessions)


@panel("notifications", depends=("notifications",))
def notifications_panel(lab, session, args) -> dict[str, Any]:
    """The external side effect: per account, sent by the consumers and received by the service."""
    return {"groups": notifications_readmodel.group_settings(session),
            "accounts": notifications_readmodel.accounts(session),
            "duplicates": notifications_readmodel.duplicates(session)}


@panel("load", depends=("load",))
def load_panel(lab, session, args) -> dict[str, Any]:
    """The lab's heavy jobs: the load generator's newest runs (progress, rate, ratios, state) and
    the dedup warm-up's (keys inserted, rate, state)."""
    from ..readmodel.scale import load_runs, warmup_runs
    return {"runs": load_runs(session), "warmups": warmup_runs(session)}


@panel("dedup_scale", depends=("dedup_scale", "settings"))
def dedup_scale_panel(lab, session, args) -> dict[str, Any]:
    """Dedup tables at scale: rows, sizes, sampled key-insert latency, the last cleanup, the layout."""
    from ..readmodel.scale import day_partitions, dedup_scale, layout_of
    return {"tables": dedup_scale(session), "layout": layout_of(session), "partitions": day_partitions(session)}


@panel("outbox", depends=("outbox",))
def outbox_panel(lab, session, args) -> dict[str, Any]:
    """The transactional outbox: pending and sent rows, the newest, the relay, its republished events."""
    from ..readmodel.outbox import outbox
    return outbox(session)


@panel("explorer", depends=("explorations",))
def explorer_panel(lab, session, args) -> dict[str, Any]:
    """The explorer: the lab's newest exploration (progress, a Cancel button) and its result."""
    from .explorations import panel_data
    return panel_data(ops.call("get_explorations", ops.Context(db.engine, lab), {})["explorations"])


@panel("group_controls", depends=("groups",), template="controls/groups.html", may_be_stale=False)
def group_controls(lab, session, args) -> dict[str, Any]:
    """The forms that list the lab's groups: they refresh when a group is created."""
    return {"groups": groups_list(session), "strategies": strategies.NAMES}


def plan_blocks(plan) -> list[dict[str, Any]]:
    """A strategy's plan cut at BEGIN/COMMIT into blocks ``{"transaction": bool, "steps": [...]}``,
    so the page can draw each transaction as one box with the crash points where they fall."""
    blocks: list[dict[str, Any]] = []
    inside = False
    for step in plan:
        if step.kind == "begin":
            blocks.append({"transaction": True, "steps": []})
            inside = True
        elif step.kind == "commit":
            inside = False
        elif inside or (blocks and not blocks[-1]["transaction"]):
            blocks[-1]["steps"].append(step)
        else:
            blocks.append({"transaction": False, "steps": [step]})
    return blocks


# --- fingerprints and rendering ------------------------------------------------------------

def _computed_fingerprints(lab, session) -> dict[str, str]:
    parts = fingerprints_readmodel.fingerprint_parts(session, lab)
    parts["oldest_key_age"] = age_label(parts["oldest_key_age"])
    result = {}
    for item in PANELS.values():
        chosen = [str(parts["schema"])] + [str(parts[key]) for key in item.depends]
        result[item.name] = hashlib.blake2s("|".join(chosen).encode(), digest_size=8).hexdigest()
    return result


def fingerprints(lab, session) -> dict[str, str]:
    """One short hash per panel, from the parts it depends on (cached: web/panel_cache.py)."""
    result = cached_fingerprints(lab, lambda: _computed_fingerprints(lab, session))
    g.fingerprints = result
    return result


def _load(lab, session, name: str, fingerprint: str, args, may_be_stale: bool = True) -> Loaded:
    """The panel's data for ``fingerprint``; or, if ``may_be_stale`` and it is slow, its last load."""
    strategy = args.get("strategy", "")
    key = (lab.name, name, strategy if strategy in strategies.STRATEGIES else "")
    loader = PANELS[name].loader
    args = dict(args)
    background = None
    if may_be_stale and PANELS[name].may_be_stale:
        background = apart(lambda lab_, session_: loader(lab_, session_, args), lab, g.fingerprints)
    return cached(key, fingerprint, lambda: loader(lab, session, args), background)


def _context(lab, session, name: str, prints: dict[str, str], args, extra,
             may_be_stale: bool = True) -> dict[str, Any]:
    loaded = _load(lab, session, name, prints[name], args, may_be_stale)
    # A stale panel carries the fingerprint of what it shows: the next poll asks for it again.
    return {"lab": lab, "fingerprint": loaded.fingerprint, "stale_for": loaded.stale_for, "took": loaded.took,
            "query": dict(args), **loaded.data, **extra}


def page_contexts(lab, session) -> dict[str, dict[str, Any]]:
    """Every panel's context for the whole page's first render, by panel name."""
    prints = fingerprints(lab, session)
    return {name: _context(lab, session, name, prints, {}, {}) for name in PANELS}


def panel_context(name: str, args=None, **extra) -> dict[str, Any]:
    """Fingerprint first, then data: a change in between shows as a new fingerprint next poll."""
    with lab_db() as (lab, session):
        return _context(lab, session, name, fingerprints(lab, session), args or {}, extra)


def render_panel(name: str, args=None, status: int = 200, **extra):
    """The one place a panel (or a live form block) is rendered alone; ``extra`` carries form
    errors, values and notices from the controls."""
    return render_template(PANELS[name].template, ctx=panel_context(name, args, **extra)), status


def load_chart(lab, session, prints: dict[str, str], may_be_stale: bool = True) -> Loaded:
    """The chart's series (static/js/chart.js draws it), loaded once per fingerprint; if
    ``may_be_stale`` and it is slow, its last load."""
    background = apart(lambda lab_, session_: chart_series(session_, lab_), lab, prints) if may_be_stale else None
    return cached((lab.name, "chart.json", ""), prints["chart"], lambda: chart_series(session, lab), background)


def render_pushed(lab, shown: dict[str, str], order: list[str]) -> Iterator[tuple[str, str, str, float]]:
    """For the push (web/push.py): each panel whose fingerprint differs from ``shown[panel]``, in
    ``order``, loaded and rendered once with its partial template, as ``(panel, fingerprint, HTML,
    seconds it took)`` as soon as it is rendered; the chart's is its series as JSON, as
    ``/panels/chart.json`` answers it.
    Needs a request context whose ``g`` names the lab.

    Loaded now, never answered from an older load: the pusher is no request that must answer at
    once, and a slow panel's background reload would reach the viewers a whole reload later."""
    with lab_session(lab.schema) as session:
        prints = _computed_fingerprints(lab, session)
        g.fingerprints = prints
        for name in order:
            if prints[name] == shown.get(name):
                continue
            started = time.monotonic()
            if name == "chart":  # its series as /panels/chart.json answers it, from the same cache
                loaded = load_chart(lab, session, prints, may_be_stale=False)
                body = json.dumps({"fingerprint": prints[name], "stale_for": None, "took": 0.0, **loaded.data},
                                  default=str)
                yield name, prints[name], body, time.monotonic() - started
                continue
            ctx = _context(lab, session, name, prints, {}, {}, may_be_stale=False)
            html = render_template(PANELS[name].template, ctx=ctx)
            yield name, ctx["fingerprint"], html, time.monotonic() - started
