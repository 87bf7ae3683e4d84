"""One exploration as a background job: its own process, started by a lab agent for a queued row.

``python -m webapp.explorer --exploration-id N`` marks the row running, calls the search
(search.explore) with ``on_progress`` writing the phase, the runs done and the current schedule's
length on the row, and ``should_stop`` reading the row's cancel flag, then writes how it ended:
found, nothing-found, cancelled (with what it had), or failed (with the reason). A heartbeat
thread refreshes the row every second, so a row whose process died with its agent goes stale and
no longer holds the lab (store/explorations.py). SIGTERM (the agent stopping it) asks the search
to stop, like a cancel.
"""
from __future__ import annotations

import logging
import signal
import threading
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import Lab
from ..ops.registry import Context
from ..store import explorations as rows
from .search import Budget, Progress, Target, explore

log = logging.getLogger("idempotency_lab.explorer")


class Reporter:
    """The row's side of a running exploration: progress written, the cancel flag read (every
    HEARTBEAT_SECONDS on a thread, and with each progress report)."""

    def __init__(self, engine: Engine, exploration_id: int):
        self.engine, self.exploration_id = engine, exploration_id
        self.stop = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._beat, name=f"exploration {exploration_id} heartbeat",
                                       daemon=True)

    def __enter__(self) -> "Reporter":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()
        self.thread.join(timeout=5)

    def _beat(self) -> None:
        while not self.done.wait(rows.HEARTBEAT_SECONDS):
            self._write()

    def _write(self, **progress: Any) -> None:
        try:
            with self.engine.begin() as conn:
                if rows.report(conn, self.exploration_id, **progress):
                    self.stop.set()
        except SQLAlchemyError as error:  # PostgreSQL restarting: the next beat tries again
            log.warning("exploration %s: could not report: %s", self.exploration_id, str(error).splitlines()[0])

    def on_progress(self, progress: Progress) -> None:
        self._write(phase=progress.phase, runs_done=progress.runs_done, schedule_length=progress.schedule_length)

    def should_stop(self) -> bool:
        return self.stop.is_set()


def end_state(exploration: Any) -> str:
    """The row's end state for what the search returned."""
    if exploration.found:
        return rows.FOUND
    return rows.CANCELLED if exploration.cancelled else rows.NOTHING_FOUND


def run(engine: Engine, config: dict[str, Any], exploration_id: int) -> str:
    """Run queued exploration ``exploration_id`` to its end; its end state. A row no longer queued is
    left as it stands (one cancelled before it started is ended "cancelled")."""
    with engine.begin() as conn:
        row = rows.begin_running(conn, exploration_id)
    if row is None:
        with engine.connect() as conn:
            current = rows.get(conn, exploration_id)
        if current is not None and current["state"] == rows.QUEUED:  # cancelled before it started
            with engine.begin() as conn:
                rows.finish(conn, exploration_id, rows.CANCELLED, error="cancelled before it started")
            return rows.CANCELLED
        return current["state"] if current else "missing"
    ctx = Context(engine=engine, lab=Lab(row["lab"]), config=config)
    target = Target(strategy=row["strategy"], lane=row["lane"])
    budget = Budget(runs=row["budget_runs"], minutes=row["budget_minutes"],
                    faults=tuple(row["faults"]) if row.get("faults") else None)
    with Reporter(engine, exploration_id) as reporter:
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: reporter.stop.set())
        try:
            exploration = explore(ctx, target, budget, row["seed"], on_progress=reporter.on_progress,
                                 should_stop=reporter.should_stop)
        except Exception as error:  # a bug or a lost service: the row says why, the process ends
            log.exception("exploration %s", exploration_id)
            with engine.begin() as conn:
                rows.finish(conn, exploration_id, rows.FAILED, error=f"{type(error).__name__}: {error}")
            return rows.FAILED
        finally:
            signal.signal(signal.SIGTERM, previous)
    state = end_state(exploration)
    with engine.begin() as conn:
        rows.finish(conn, exploration_id, state, result=exploration.to_dict(),
                    error="cancelled" if state == rows.CANCELLED else None)
    return state
