"""``flask --app app explore run``: search fault schedules against a strategy from a terminal.

Prints a line per run (phase, runs done, the schedule's steps, whether an anomaly was seen), then
the result: the why of the first bad event and the shrunk schedule's scenario file (to ``--out``
when given), or what was tried when nothing was found. Exits 0 once the exploration ends (found or
not), 2 when the target or the budget cannot be explored, 3 when the lab cannot be reached.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from flask import current_app
from flask.cli import AppGroup

from .. import ops, strategies
from ..domain.lab import Lab
from ..explorer import schedule as schedules
from ..explorer.search import Budget, InvalidTarget, Progress, Target, explore
from ..store import command_channel
from ..store.classroom import lab_count_limit_reached

explore_cli = AppGroup("explore", help="Search fault schedules against a strategy and shrink the first that fails.")


def _print_progress(progress: Progress) -> None:
    steps = f"{progress.schedule_length} steps" if progress.schedule_length else "-"
    click.echo(f"  {progress.phase:<11} run {progress.runs_done:>3}  {steps:<9}"
               + ("  anomaly" if progress.anomaly_found else ""))


@explore_cli.command("run")
@click.option("--strategy", type=click.Choice(strategies.NAMES), required=True, help="the strategy to explore")
@click.option("--runs", type=click.IntRange(min=1), default=None, help="the search's budget in runs")
@click.option("--minutes", type=click.FloatRange(min=0, min_open=True), default=None,
              help="the budget in minutes (searching and shrinking)")
@click.option("--seed", type=int, default=1, show_default=True, help="the seed the schedules are generated from")
@click.option("--reproduce", type=click.IntRange(min=0), default=3, show_default=True,
              help="how often the scenario found is replayed")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), default=None,
              help="write the scenario file found here (default: print it)")
@click.option("--faults", default=None, metavar="KIND,KIND",
              help=f"the fault kinds the schedules may use, comma-separated (default: every kind: "
                   f"{', '.join(schedules.FAULT_KINDS)})")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON (no progress lines)")
def run_exploration(strategy, runs, minutes, seed, reproduce, faults, out, as_json):
    """Explore STRATEGY: seeded fault schedules, each run in a fresh lab (dropped after), judged by the
    verdict; the first that fails is shrunk and replayed."""
    if runs is None and minutes is None:
        raise click.UsageError("give a budget: --runs, --minutes, or both")
    if current_app.config.get("NO_DATABASE"):
        raise click.ClickException(current_app.config["NO_DATABASE"])
    from ..web.db import db
    with db.engine.connect() as conn:
        refused = lab_count_limit_reached(conn, current_app.config)
    if refused:  # each run makes one lab of its own, dropped after it
        raise click.ClickException(refused)
    ctx = ops.Context(db.engine, Lab(current_app.config["LAB_NAME"]), current_app.config)
    if not as_json:
        click.echo(f"exploring {strategy}: seed {seed}, " + ", ".join(
            part for part in (f"{runs} run(s)" if runs else "", f"{minutes:g} minute(s)" if minutes else "") if part))
    try:
        kinds = tuple(kind.strip() for kind in faults.split(",") if kind.strip()) if faults is not None else None
        result = explore(ctx, Target(strategy=strategy), Budget(runs=runs, minutes=minutes, faults=kinds), seed,
                         reproduce=reproduce, on_progress=(lambda p: None) if as_json else _print_progress)
    except InvalidTarget as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(2)
    except command_channel.NoAgent as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(3)
    if out and result.scenario_yaml:
        Path(out).write_text(result.scenario_yaml, encoding="utf-8")
    if as_json:
        click.echo(json.dumps(result.to_dict(), indent=2))
        return
    click.echo("")
    if not result.found:
        click.echo(f"nothing found in {result.seconds:.0f} s: {result.tried}")
        return
    click.echo(f"found in {result.runs} run(s), {result.seconds:.0f} s: {result.schedule_length} steps "
               f"(shrunk from {result.original_length}); the file replayed to the same verdict "
               f"{result.reproduced}/{result.reproduce_attempts}")
    click.echo(f"why: {result.why}")
    if out:
        click.echo(f"wrote {out}")
    else:
        click.echo("")
        click.echo(result.scenario_yaml, nl=False)
