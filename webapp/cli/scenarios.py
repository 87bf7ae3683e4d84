"""``flask --app app scenario list|run|export|replay``: scenarios from a terminal.

``run`` prints each step with what was observed, then the verdict table, and exits 0 only
when every expectation held (1: an expectation or a step failed; 2: not run, with the reason;
3: the file is malformed or the lab cannot be reached). ``list`` needs no running lab: it reads
the files only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from flask import current_app
from flask.cli import AppGroup

from ..domain.lab import Lab
from ..scenarios import built_in, find, journal
from ..scenarios.loader import ScenarioError, load
from ..scenarios.runner import Runner, RunState, broker_kind, fresh_lab_name
from ..store import command_channel
from ..store.classroom import lab_count_limit_reached

scenario_cli = AppGroup("scenario", help="Run the lab's exercises and replay recorded sessions.")

EXIT = {"passed": 0, "failed": 1, "error": 1, "not-run": 2}
MARK = {"ok": "✓", "failed": "✕", "error": "✕", "not-run": "–"}


def _engine():
    """The app's database engine, or a one-line reason when no lab runs (``list`` does without)."""
    if current_app.config.get("NO_DATABASE"):
        raise click.ClickException(current_app.config["NO_DATABASE"])
    from ..web.db import db
    return db.engine


@scenario_cli.command("list", with_appcontext=False)
def list_scenarios():
    """The built-in exercises."""
    for path in built_in():
        try:
            scenario = load(path)
            extra = f"  (needs: {', '.join(scenario.requires)})" if scenario.requires else ""
            click.echo(f"{path.stem:<34} {scenario.title}{extra}")
        except ScenarioError as error:
            click.echo(f"{path.stem:<34} MALFORMED: {error}")


def _echo_text(kind: str, data: dict) -> None:
    if kind == "start":
        click.echo(f"[{data['index']:>2}] {data['description']} …")
    elif kind == "step":
        mark = MARK.get(data["status"], "?")
        label = "setup" if data["index"] == 0 else f"{data['index']:>2}"
        click.echo(f"  {mark} [{label}] {data['status']} in {data['seconds']:.1f} s: {data['observed']}")


def verdict_table(run: RunState) -> str:
    rows = [("expectation", "wanted", "observed", "")]
    rows += [(c["label"], str(c["wanted"]), "—" if c["observed"] is None else str(c["observed"]),
              "ok" if c["ok"] else "FAIL") for c in run.checks]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def graded(run: RunState) -> str:
    """The grading exercise's one line: what the learner's lane got, and why."""
    verdict = run.graded or {}
    line = (f"graded: {verdict.get('duplicates_applied', '?')} duplicates applied, "
            f"{verdict.get('effects_lost', '?')} lost, {verdict.get('source_duplicates', '?')} source duplicates "
            f"({verdict.get('source_duplicates_absorbed', '?')} absorbed)")
    why = [f"  why: {a.get('why')}" for a in verdict.get("anomalies", [])[:5] if a.get("why")]
    return "\n".join([line, *why])


def execute(scenario, *, lab_name: str | None, as_json: bool) -> RunState:
    engine = _engine()
    journal.install()  # the run's operations land in its lab's session log, as a person's would
    broker, how = broker_kind(current_app.config)
    if scenario.outside_lane and not lab_name:
        # The learner's consumer connects to their lab (the "Your consumer" page's): graded there.
        lab_name = current_app.config.get("LAB_NAME") or "default"
    if not lab_name:  # a fresh lab of its own: one more on this server
        with engine.connect() as conn:
            refused = lab_count_limit_reached(conn, current_app.config)
        if refused:
            raise click.ClickException(refused)
    lab = Lab(lab_name) if lab_name else Lab(fresh_lab_name(engine, scenario.name))
    run = RunState(scenario=scenario.name, lab=lab.name)
    if not as_json:
        click.echo(f"scenario {scenario.name}: {scenario.title}")
        click.echo(f"lab {lab.name} (topic {lab.topic}) · broker {broker} ({how})")
    runner = Runner(engine, scenario, run, broker=broker, echo=None if as_json else _echo_text,
                    config=current_app.config)
    runner.run_all()
    return run


@scenario_cli.command("run")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON")
@click.option("--lab", "lab_name", default=None, help="lab name to use (default: the scenario's name + a counter; "
              "for a grading exercise, LAB_NAME: the lab your consumer connects to)")
@click.option("--lane", default=None, help="a grading exercise: the lane of your consumer it grades")
def run_scenario(name, as_json, lab_name, lane):
    """Run a scenario (a built-in NAME or number, or a FILE) against a fresh lab; a grading exercise
    (your own consumer) runs in your lab, reset first: start your consumer when it says so."""
    try:
        scenario = load(find(name))
    except FileNotFoundError as error:
        raise click.UsageError(str(error)) from None
    except ScenarioError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(3)
    if lane is not None and lane != scenario.outside_lane:
        raise click.UsageError(f"--lane {lane}: " + (f"this exercise grades lane {scenario.outside_lane}: create your "
                               f"consumer's lane under that name" if scenario.outside_lane else
                               "this scenario grades no consumer of yours"))
    try:
        run = execute(scenario, lab_name=lab_name, as_json=as_json)
    except command_channel.NoAgent as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(3)
    if as_json:
        click.echo(json.dumps({"scenario": scenario.name, "title": scenario.title, **run.as_dict()},
                              indent=2, default=str))
    else:
        click.echo("")
        click.echo(verdict_table(run))
        click.echo("")
        if scenario.outside_lane:
            click.echo(graded(run))
        click.echo(f"{run.status.upper()} in {run.seconds:.1f} s" + (f": {run.reason}" if run.reason else ""))
    sys.exit(EXIT.get(run.status, 1))


@scenario_cli.command("export")
@click.option("--lab", "lab_name", default=None, help="the lab to export (default: LAB_NAME)")
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), default="-",
              help="file to write (default: standard output)")
def export(lab_name, output):
    """Export a lab's recorded session as a scenario file that replays it."""
    lab = Lab(lab_name or current_app.config["LAB_NAME"])
    try:
        document = journal.export_yaml(_engine(), lab)
    except journal.NothingRecorded as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)
    if output == "-":
        click.echo(document, nl=False)
    else:
        Path(output).write_text(document, encoding="utf-8")
        click.echo(f"wrote {output}", err=True)


@scenario_cli.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True)
@click.option("--lab", "lab_name", default=None)
@click.pass_context
def replay(ctx, file, as_json, lab_name):
    """Replay an exported session against a fresh lab (the same as `scenario run FILE`)."""
    ctx.invoke(run_scenario, name=file, as_json=as_json, lab_name=lab_name)
