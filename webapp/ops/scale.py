"""Throughput mode, part 2: the load generator, the dedup table's layout, and synthetic keys.

- ``start_load`` / ``cancel_load`` / ``get_load``: N events over M accounts, paced or as fast as
  possible, with seeded ratios of resends and source duplicates, produced by a lab agent
  (webapp/agent/load.py); progress in the lab's ``load_runs``.
- ``set_dedup_layout``: ``processed_events`` plain or range-partitioned by the event's own time
  (webapp/strategies/dedup_layout.py), converted in place with its keys, only while the lab's consumers are
  stopped.
- ``dedup_warmup`` / ``cancel_dedup_warmup`` / ``get_dedup_warmup``: fill ``processed_events`` with
  synthetic keys (set-based, no events) to measure a dedup table at a million keys without
  producing a million events; run by a lab agent (webapp/agent/warmup.py) like the load, progress
  in the lab's ``warmup_runs``.

A load and a warm-up are the lab's heavy jobs: one at a time per lab (webapp/store/heavy_jobs.py),
a second is refused (409, ``Busy``) saying what runs and how to stop it.
"""
from __future__ import annotations

import time
from typing import Literal

from pydantic import Field, model_validator
from sqlalchemy import text

from ..domain import commands, verbs
from ..domain.vocabulary import LIVE_STATES, Limits
from ..store import heavy_jobs, labdata, schema
from ..store.connection import CONTROL_SCHEMA
from ..store.labs import lab_schemas
from ..strategies import dedup_layout
from . import limits
from .agent_commands import run_command
from .fields import Number, Whole, within
from .registry import Args, Busy, Context, InvalidRequest, NoArgs, operation


class LoadArgs(Args):
    events: Whole = within(Limits.LOAD_EVENTS, "how many records to produce, resends and source duplicates "
                           "included", default=...)
    accounts: Whole = within(Limits.LOAD_ACCOUNTS, "spread over this many accounts, acc-1 … acc-M (created "
                             "when missing)", default=5)
    rate_per_second: Whole = within(Limits.LOAD_RATE, "target rate; 0: as fast as possible", default=0)
    resend_ratio: Number = within((0.0, 1.0), "share of records that resend a recent event (same event_id)",
                                  default=0.0)
    source_duplicate_ratio: Number = within((0.0, 1.0), "share of records that repeat a recent transaction "
                                            "under a new event_id", default=0.0)
    seed: Whole = within(Limits.LOAD_SEED, "the same seed gives the same stream of kinds, accounts and amounts",
                         default=1)

    @model_validator(mode="after")
    def _ratios_fit(self) -> "LoadArgs":
        if self.resend_ratio + self.source_duplicate_ratio > 1.0:
            raise InvalidRequest("source_duplicate_ratio", "resend_ratio + source_duplicate_ratio must be at most 1")
        return self

    def command(self, rate_per_second: int) -> commands.LoadStart:
        """The agent's ``load.start`` at the run's pace (the lab's ceiling may replace "as fast as possible")."""
        return self.as_command(commands.LoadStart, rate_per_second=rate_per_second)


class LayoutArgs(Args):
    layout: Literal[dedup_layout.LAYOUTS] = Field(
        description="plain: processed_events keyed by event_id; partitioned-by-day: range-partitioned by the "
                    "event's occurred_at, keyed by (event_id, occurred_at), TTL by dropping whole days")


class WarmupArgs(Args):
    keys: Whole = within(Limits.WARMUP_KEYS, "synthetic keys to insert into processed_events", default=...)
    days: Whole = within(Limits.WARMUP_DAYS, "spread their event and processing times over the last N days",
                         default=10)

    def command(self) -> commands.DedupWarmup:
        """The agent's ``dedup.warmup`` for these arguments."""
        return self.as_command(commands.DedupWarmup)


# The operations that start a heavy job (the API documents their 409).
HEAVY_JOBS = ("start_load", "dedup_warmup")


def _lab_is_free(ctx: Context) -> None:
    """Refuse a second heavy job while one runs in the lab (the agent checks again as it starts one)."""
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        job = heavy_jobs.running(conn.exec_driver_sql)
    if job is not None:
        raise Busy(heavy_jobs.describe(job))


@operation("start_load", path="/load", status=201, step="load", cli="load", tags=("load",),
           summary="Start the load generator: N events over M accounts, paced or as fast as possible, with "
                   "ratios of resends and source duplicates")
def start_load(ctx: Context, args: LoadArgs) -> dict:
    limits.check_ceiling(ctx, "events", "LAB_MAX_LOAD_EVENTS", args.events)
    limits.check_ceiling(ctx, "rate_per_second", "LAB_MAX_LOAD_RATE", args.rate_per_second)
    _lab_is_free(ctx)
    return run_command(ctx, verbs.LOAD_START, args.command(rate_per_second=_paced(ctx, args.rate_per_second)),
                       field="events")


def _paced(ctx: Context, rate_per_second: int) -> int:
    """The run's rate: "as fast as possible" (0) is the lab's LAB_MAX_LOAD_RATE when it sets one."""
    ceiling = ctx.config.get("LAB_MAX_LOAD_RATE")
    return int(ceiling) if rate_per_second == 0 and ceiling is not None else rate_per_second


@operation("cancel_load", path="/load/cancel", step="cancel_load", tags=("load",),
           summary="Ask the running load to stop (it stops within half a second)")
def cancel_load(ctx: Context, args: NoArgs) -> dict:
    return _cancel(ctx, "load", timeline_kind="published")


def _cancel(ctx: Context, job: str, timeline_kind: str) -> dict:
    """Ask the lab's running ``job`` (heavy_jobs: a load or a warm-up) to stop; the runs asked."""
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        runs = conn.execute(text(heavy_jobs.cancel_sql(job))).scalars().all()
        if runs:
            labdata.say(conn, timeline_kind, f"{job} run {', '.join(map(str, runs))}: cancel requested")
    return {"cancelled": list(runs)}


@operation("get_load", method="GET", path="/load", tags=("load",),
           summary="The load generator's newest runs: sent, resends, source duplicates, rate, state")
def get_load(ctx: Context, args: NoArgs) -> dict:
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        rows = conn.execute(text(
            "SELECT id, events, accounts, rate_per_second, resend_ratio, source_duplicate_ratio, seed, state, sent, "
            "resends, source_duplicates, failed, rate, cancel_requested, error FROM load_runs ORDER BY id DESC LIMIT 5"
        )).mappings().all()
    return {"runs": [dict(row) for row in rows]}


def _live_consumers(conn, ctx: Context) -> list[str]:
    return list(conn.execute(text(f'SELECT name FROM "{CONTROL_SCHEMA}".consumers WHERE lab = :lab '
                                  "AND state = ANY(:live) ORDER BY id"),
                             {"lab": ctx.lab.name, "live": [str(s) for s in LIVE_STATES]}).scalars())


@operation("set_dedup_layout", path="/dedup/layout", step="dedup_layout", cli="dedup-layout", tags=("dedup",),
           summary="Rebuild processed_events plain or partitioned by day of occurred_at, keys kept (the lab's "
                   "consumers must be stopped)")
def set_dedup_layout(ctx: Context, args: LayoutArgs) -> dict:
    with ctx.engine.begin() as conn:
        live = _live_consumers(conn, ctx)
        if live:
            raise InvalidRequest("layout", f"stop the lab's consumers first ({', '.join(live)}): the table is "
                                 "rebuilt while nothing writes to it")
        started = time.perf_counter()
        converted = {}
        for lab_schema in lab_schemas(conn, ctx.lab):
            schema.enter(conn, lab_schema)
            converted[lab_schema] = dedup_layout.convert(conn.exec_driver_sql, args.layout, ctx.lab.schema)
        schema.enter(conn, ctx.lab.schema)
        labdata.put_setting(conn, "dedup_table_layout", args.layout)
        seconds = time.perf_counter() - started
        keys = sum(c["keys"] for c in converted.values())
        without = sum(c["without_event_time"] for c in converted.values())
        labdata.say(conn, "ttl", f"processed_events rebuilt {args.layout} in {seconds:.2f} s: {keys:,} key(s) kept"
                    + (f", {without:,} with no record in the log kept their processing time as event time"
                       if without else ""), converted=converted)
    return {"layout": args.layout, "converted": converted, "seconds": round(seconds, 3)}


@operation("dedup_warmup", path="/dedup/warmup", status=201, step="dedup_warmup", cli="dedup-warmup",
           tags=("dedup",),
           summary="Start inserting N synthetic keys into processed_events (set-based, no events), spread over "
                   "the last days, on a lab agent: a dedup table at a million keys in seconds; its progress in "
                   "GET /dedup/warmup and the Load panel")
def dedup_warmup(ctx: Context, args: WarmupArgs) -> dict:
    limits.check_ceiling(ctx, "keys", "LAB_MAX_WARMUP_KEYS", args.keys)
    _lab_is_free(ctx)
    return run_command(ctx, verbs.DEDUP_WARMUP, args.command(), field="keys")


@operation("cancel_dedup_warmup", path="/dedup/warmup/cancel", step="cancel_dedup_warmup", tags=("dedup",),
           summary="Ask the running dedup warm-up to stop (after the slice it is inserting; the keys in stay)")
def cancel_dedup_warmup(ctx: Context, args: NoArgs) -> dict:
    return _cancel(ctx, "warm-up", timeline_kind="ttl")


@operation("get_dedup_warmup", method="GET", path="/dedup/warmup", tags=("dedup",),
           summary="The newest dedup warm-ups: keys asked, keys inserted, rate, state")
def get_dedup_warmup(ctx: Context, args: NoArgs) -> dict:
    with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
        rows = conn.execute(text(
            "SELECT id, keys, days, state, inserted, rate, cancel_requested, error FROM warmup_runs "
            "ORDER BY id DESC LIMIT 5")).mappings().all()
    return {"runs": [dict(row) for row in rows]}
