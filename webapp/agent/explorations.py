"""The agent's side of the explorer: one exploration process per lab, started and watched.

The ``exploration.start`` command starts ``python -m webapp.explorer --exploration-id N`` for a
queued exploration and answers at once: the search drives the lab through the same commands as
everyone else (this agent carries them out meanwhile), so it never runs on the agent's command
thread, nor in gunicorn. A watcher thread per process then

- keeps the row fresh while the process lives (store/explorations.py: a row no one refreshes for
  STALE_SECONDS lost its agent, and no longer holds the lab);
- enforces a cancel: the process reads the row's flag and stops by itself; if it has not within
  CANCEL_GRACE seconds it gets SIGTERM, then SIGKILL;
- says how the process ended when it died without saying so itself ("failed", with its exit code
  and where its log is; "cancelled" when a cancel was asked).

A lab reset or delete asks the lab's exploration to stop (:meth:`Explorations.stop`): its runs use
fresh labs of their own, but an exploration outlives neither its lab nor a fresh start of it. The process dies with the agent (PDEATHSIG); its row then stops
being refreshed and no longer holds the lab (store/explorations.py, STALE_SECONDS).
"""
from __future__ import annotations

import logging
import os
import queue
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain import commands
from ..domain.lab import Lab
from ..store import explorations as rows
from .processes import ROOT, die_with_parent, stop_process

log = logging.getLogger("idempotency_lab.agent.explorations")

# Seconds a cancelled exploration has to end the run in progress and stop by itself. A run waits for
# takeovers and the verdict, then drops its fresh lab; one stopped by force leaves that lab behind.
CANCEL_GRACE = 180.0
STOP_TIMEOUT = 5.0      # seconds between SIGTERM and SIGKILL
WATCH_INTERVAL = 0.5    # seconds between two looks at the process and its row


@dataclass
class Running:
    """One exploration's process on this agent, and its watcher."""
    exploration_id: int
    lab: Lab
    process: subprocess.Popen
    log_path: Path | None
    watcher: threading.Thread | None = None


class Explorations:
    """The exploration processes this agent started, by lab name."""

    def __init__(self) -> None:
        self.running: dict[str, Running] = {}
        self.lock = threading.Lock()

    def start(self, engine: Engine, agent_id: str, env: dict[str, str], log_dir: Path | None, lab: Lab,
              exploration_id: int) -> int:
        """Start the process of queued exploration ``exploration_id`` of ``lab``; its pid."""
        with engine.connect() as conn:
            row = rows.get(conn, exploration_id)
        if row is None or row["lab"] != lab.name:
            raise LookupError(f"no exploration {exploration_id} in lab {lab.name}")
        if row["state"] != rows.QUEUED:
            raise ValueError(f"exploration_id: exploration {exploration_id} is {row['state']}, not queued")
        with self.lock:
            current = self.running.get(lab.name)
            if current is not None and current.process.poll() is None:
                raise ValueError(f"busy: exploration {current.exploration_id} runs in lab {lab.name}: cancel it "
                                 "first (POST /api/v1/explorations/cancel, the Explorer panel's Cancel button)")
            log_path = log_dir / f"{lab.name}-exploration-{exploration_id}.log" if log_dir is not None else None
            started: queue.Queue[subprocess.Popen | BaseException] = queue.Queue(maxsize=1)
            # The watcher thread starts the process: Linux sends PDEATHSIG when the *thread* that forked a
            # child ends, so the process must be forked by a thread that lives as long as it does.
            watcher = threading.Thread(target=self._spawn_and_watch,
                                       args=(engine, env, lab, exploration_id, log_path, started), daemon=True,
                                       name=f"exploration {lab.name}#{exploration_id}")
            watcher.start()
            outcome = started.get(timeout=30)
            if isinstance(outcome, BaseException):
                raise outcome
            running = Running(exploration_id, lab, outcome, log_path, watcher=watcher)
            self.running[lab.name] = running
        with engine.begin() as conn:
            rows.started_by(conn, exploration_id, agent_id, outcome.pid)
        return outcome.pid

    def _spawn_and_watch(self, engine: Engine, env: dict[str, str], lab: Lab, exploration_id: int,
                         log_path: Path | None, started: queue.Queue) -> None:
        argv = [sys.executable, "-m", "webapp.explorer", "--exploration-id", str(exploration_id)]
        try:
            output = open(log_path, "ab") if log_path is not None else None  # noqa: SIM115 (closed below)
            try:
                process = subprocess.Popen(argv, env={**env, "PYTHONUNBUFFERED": "1"}, cwd=ROOT,
                                           stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT,
                                           preexec_fn=die_with_parent)
            finally:
                if output is not None:
                    output.close()  # the child has its own copy
        except OSError as error:
            started.put(error)
            return
        started.put(process)
        with self.lock:  # start() registers it under this lock
            running = self.running[lab.name]
        self._watch(engine, running)

    def _watch(self, engine: Engine, running: Running) -> None:
        """Until the process ends: enforce a cancel; then say how it ended if it did not."""
        cancel_seen_at: float | None = None
        waited = 0.0
        while True:
            try:
                running.process.wait(timeout=WATCH_INTERVAL)
                break
            except subprocess.TimeoutExpired:
                waited += WATCH_INTERVAL
            try:
                # The agent's beat keeps the row fresh while its process lives (a queued one may take
                # seconds to import on a busy machine): only a row whose agent is gone goes stale.
                with engine.begin() as conn:
                    asked = rows.report(conn, running.exploration_id)
            except SQLAlchemyError as error:  # PostgreSQL restarting: look again on the next turn
                log.warning("exploration %s: %s", running.exploration_id, str(error).splitlines()[0])
                continue
            if asked and cancel_seen_at is None:
                cancel_seen_at = waited
            if cancel_seen_at is not None and waited - cancel_seen_at >= CANCEL_GRACE:
                log.info("exploration %s did not stop within %s s of its cancel: SIGTERM", running.exploration_id,
                         CANCEL_GRACE)
                stop_process(running.process, timeout=STOP_TIMEOUT)
        self._ended(engine, running)

    def _ended(self, engine: Engine, running: Running) -> None:
        code = running.process.returncode
        where = f"; its output is in {running.log_path}" if running.log_path is not None else ""
        try:
            with engine.begin() as conn:
                if rows.cancel_requested(conn, running.exploration_id):
                    rows.finish(conn, running.exploration_id, rows.CANCELLED,
                                error=f"cancelled; its process was stopped (exit code {code})")
                else:
                    rows.finish(conn, running.exploration_id, rows.FAILED,
                                error=f"its process ended without a result ({_exit(code)}){where}")
        except SQLAlchemyError as error:
            log.warning("exploration %s ended (%s) but could not be recorded: %s", running.exploration_id,
                        _exit(code), str(error).splitlines()[0])
        with self.lock:
            if self.running.get(running.lab.name) is running:
                del self.running[running.lab.name]

    def stop(self, engine: Engine, lab: Lab, reason: str) -> None:
        """Ask the lab's exploration to stop (a reset or delete of the lab), with ``reason``; without
        waiting: its run in progress needs this agent to carry out its commands and drop its lab, and
        a command thread that waited for it would hold them up. The watcher enforces it."""
        with engine.begin() as conn:
            rows.request_cancel(conn, lab.name, reason)


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


RUNS = Explorations()


def start_exploration(agent, lab: Lab, command: commands.ExplorationStart) -> dict:
    """The ``exploration.start`` command: start the queued exploration's process here; its pid, at once."""
    exploration_id = command.exploration_id
    env = {**os.environ, "DATABASE_URL": agent.pool.database_url,
           "KAFKA_BOOTSTRAP_SERVERS": agent.pool.bootstrap_servers}
    log_dir = None if agent.pool.log_to_stdout else agent.pool.log_dir
    pid = RUNS.start(agent.engine, agent.id, env, log_dir, lab, exploration_id)
    agent.say(lab, "lab", f"exploration {exploration_id} started (pid {pid})", exploration=exploration_id)
    return {"exploration_id": exploration_id, "pid": pid}
