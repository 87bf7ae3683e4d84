"""Guided mode's clicks, run where a wait may take a minute: in a lab agent, never in a web request.

The page claims the run (``busy``) and enqueues the command ``scenario.step`` with the run's id;
the agent's handler (:func:`agent_handler`) starts :func:`run_guided_step` on a thread of its own
— the step calls operations that are themselves commands, which the agent must stay free to
claim — and answers at once. The step saves its progress in ``lab_control.scenario_runs`` and
releases the run; the page polls that row until it is free.
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Mapping

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain import commands
from ..settings import load_config
from ..store import command_channel, explorations, scenario_runs
from . import built_in, journal
from .loader import Scenario, ScenarioError, load, loads
from .runner import OPERATION_ERRORS, Runner, RunState, broker_kind
from .takeaways import takeaways  # noqa: F401 - the guided page's, re-exported

log = logging.getLogger("idempotency_lab.scenarios")


# A guided run of an exploration's scenario names it so in ``scenario_runs.scenario``: the file is
# the exploration's result, read from its row at every click, never a file on the server's disk.
EXPLORED_NAME = re.compile(r"exploration-(\d+)")


def explored_name(exploration_id: int) -> str:
    """The name a guided run of exploration ``exploration_id``'s scenario goes by."""
    return f"exploration-{exploration_id}"


def exploration_of(name: str) -> int | None:
    """The exploration a guided run's scenario name comes from; None for a built-in exercise."""
    match = EXPLORED_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def explored_scenario(engine: Engine, exploration_id: int) -> tuple[Scenario | None, str | None, str | None]:
    """(the scenario an exploration handed back, the lab it explored, why there is none): the
    scenario is None when the exploration does not exist, found no anomaly, or its file does not load."""
    with engine.connect() as conn:
        row = explorations.get(conn, exploration_id)
    if row is None:
        return None, None, f"there is no exploration {exploration_id}"
    scenario_yaml = (row.get("result") or {}).get("scenario_yaml")
    if not scenario_yaml:
        return None, row["lab"], f"exploration {exploration_id} handed back no scenario (it is {row['state']})"
    try:
        scenario = loads(scenario_yaml, source=f"exploration {exploration_id}", name=explored_name(exploration_id))
    except ScenarioError as error:
        return None, row["lab"], f"exploration {exploration_id}'s scenario file does not load: {error}"
    return scenario, row["lab"], None


def scenario_named(engine: Engine, name: str) -> Scenario | None:
    """The scenario a guided run goes by ``name``: a built-in exercise, or an exploration's result."""
    exploration_id = exploration_of(name)
    if exploration_id is not None:
        return explored_scenario(engine, exploration_id)[0]
    path = next((p for p in built_in() if p.stem == name), None)
    return load(path) if path else None


def claim(engine: Engine, run_id: int) -> bool:
    """Mark the run busy, unless a step of it is already running."""
    with engine.begin() as conn:
        return scenario_runs.claim(conn, run_id)


def release(engine: Engine, run_id: int, run: RunState | None = None) -> None:
    """Save the run's progress (when given) and free it for the next click."""
    with engine.begin() as conn:
        if run is not None:
            scenario_runs.save(conn, run_id, run.as_dict(), run.status)
        scenario_runs.release(conn, run_id)


# How often the running step's "waiting for ..." line is written on the run's row at most.
NOTE_EVERY = 1.0


class WaitingNote:
    """Guided mode's ``waiting``: what the running step waits for (a command queued at the agent or
    being carried out, a wait step's condition), written on the run's row for the page, at most
    every NOTE_EVERY seconds."""

    def __init__(self, engine: Engine, run_id: int):
        self.engine, self.run_id = engine, run_id
        self.last: str | None = None
        self.written_at = 0.0

    def __call__(self, waiting: str) -> None:
        now = time.monotonic()
        if waiting == self.last or now - self.written_at < NOTE_EVERY:
            return
        try:
            with self.engine.begin() as conn:
                scenario_runs.note_waiting(conn, self.run_id, waiting)
        except SQLAlchemyError as error:  # the line is a courtesy: the step goes on without it
            log.info("guided run %s: could not note what it waits for: %s", self.run_id, str(error).splitlines()[0])
            return
        self.last, self.written_at = waiting, now


def run_guided_step(engine: Engine, run_id: int, config: Mapping[str, Any] | None = None,
                    probe: bool = True) -> dict[str, Any]:
    """One click of a claimed guided run: prepare a fresh lab, or the next step, or the expectations.

    Saves the progress (with the click's error, if any) and releases the run, whatever happens."""
    run = None
    try:
        with engine.connect() as conn:
            row = scenario_runs.get(conn, run_id)
        scenario = scenario_named(engine, row["scenario"]) if row else None
        if scenario is None:
            return {"run_id": run_id, "error": "no such run or scenario"}
        run = RunState.from_dict(row["progress"])
        run.error = None
        run.waiting = None
        # The agent's settings (its environment and .env), classroom ceilings included: a guided
        # step is bound by what the lab's own requests are.
        config = dict(config if config is not None else load_config())
        journal.install()
        broker, _ = broker_kind(config, probe=probe)
        try:
            Runner(engine, scenario, run, broker=broker, config=config,
                   waiting=WaitingNote(engine, run_id)).advance()
        except command_channel.NoAgent as problem:
            run.error = str(problem)
        except OPERATION_ERRORS as problem:
            run.error = f"{type(problem).__name__}: {problem}"
        return {"run_id": run_id, "status": run.status, "position": run.position, "error": run.error}
    except Exception:  # noqa: BLE001 - a thread of the agent: log it, show it on the page, keep the agent
        log.exception("guided run %s: the step failed", run_id)
        if run is not None:
            run.error = "the step failed unexpectedly; see the log of the process that ran it"
        return {"run_id": run_id, "error": "the step failed unexpectedly"}
    finally:
        release(engine, run_id, run)


def next_exercise(name: str) -> Scenario | None:
    """The exercise after ``name`` in the files' order; None after the last one."""
    paths = built_in()
    at = next((i for i, p in enumerate(paths) if p.stem == name), None)
    return load(paths[at + 1]) if at is not None and at + 1 < len(paths) else None


def failure_help(run: RunState) -> dict[str, str] | None:
    """For a run that did not pass: what happened and what to click, in a learner's words
    (``what``, ``todo``); None for a run that passed, is still going, or was not run (its reason says why)."""
    if run.status not in ("failed", "error"):
        return None
    step = next((s for s in run.steps if s.get("status") in ("failed", "error")), None)
    again = "Click **Run it again** below: it starts over on a fresh lab."
    if step is not None and step["status"] == "failed":
        seconds = f" in {step['seconds']:.0f} s" if step.get("seconds") else ""
        return {"what": f"Step {step['index']} waited for the lab to reach a state, and it did not get there{seconds}. "
                        f"It waited for: {step['description']}.",
                "todo": f"{again} A step like this can miss when the machine is busy or a consumer group took "
                        "longer than usual to rebalance. If it stops at the same step again, open *All steps* "
                        "for what the lab showed instead, look at the timeline on the right, and tell your "
                        "instructor."}
    if step is not None:
        return {"what": f"Step {step['index']} could not do what it asks of the lab ({step['description']}): "
                        f"the lab refused it. {step.get('observed') or ''}".rstrip(),
                "todo": f"{again} If the same step is refused again, tell your instructor: the message above "
                        "says what the lab refused."}
    missed = [c for c in run.checks if not c.get("ok")]
    if missed:
        listed = "; ".join(f"{c['label']}: expected {c['wanted']}, the lab holds {c['observed']}" for c in missed[:3])
        return {"what": f"Every step ran, but {len(missed)} of the {len(run.checks)} expectations did not hold: {listed}.",
                "todo": f"Compare the panels on the right with the story of the exercise, then {again[0].lower()}{again[1:]}"}
    return {"what": run.reason or run.error or "The run stopped before its verdict.", "todo": again}


def agent_handler(agent: Any, lab: Any, command: commands.ScenarioStep) -> dict:
    """The lab agent's handler for ``scenario.step``: start the click on a thread and answer."""
    run_id = command.run_id
    threading.Thread(target=run_guided_step, args=(agent.engine, run_id), name=f"scenario-run-{run_id}",
                     daemon=True).start()
    return {"run_id": run_id, "started": True}
