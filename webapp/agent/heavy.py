"""A lab's heavy job on a thread of the lab agent (a load, a dedup warm-up): what every one does
around its own work, and the agent's registry of the running ones.

A run connects in its lab's schema, works (reporting progress on its row, which also tells it
whether the lab asked it to stop), then says how it ended on its row and on the timeline. A bug
or a lost database ends the run "failed" with its reason; the agent lives on.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Generic, TypeVar

import psycopg

from ..domain.lab import Lab
from ..store import timeline
from ..store.connection import connect

log = logging.getLogger("idempotency_lab.agent.heavy")


class HeavyRun(threading.Thread):
    """One run of a heavy job. A subclass names its ``job`` and its ``timeline_kind`` and writes
    :meth:`work`, :meth:`report` and :meth:`ended`."""

    job = "heavy job"
    timeline_kind = "published"

    def __init__(self, database_url: str, lab: Lab, run_id: int):
        super().__init__(name=f"{self.job} {lab.name}#{run_id}", daemon=True)
        self.database_url, self.lab, self.run_id = database_url, lab, run_id
        self.stop_requested = threading.Event()

    def run(self) -> None:
        conn = connect(self.database_url, schema=self.lab.schema, autocommit=True,
                       application_name=f"lab {self.lab.name} {self.job}")
        started = time.monotonic()
        try:
            state, error = self.work(conn)
        except Exception as problem:  # a bug or a lost database: the run says so, the agent lives on
            log.exception("%s run %s", self.job, self.run_id)
            state, error = "failed", f"{type(problem).__name__}: {problem}"
        try:
            self.report(conn, state, 0.0, error)
            summary, detail = self.ended(state, time.monotonic() - started)
            timeline.record(conn.execute, self.timeline_kind, f"{self.job} run {self.run_id} {state}: {summary}",
                            run=self.run_id, state=state, error=error, **detail)
        except psycopg.Error:
            log.warning("%s run %s: could not report its end (%s)", self.job, self.run_id, state)
        finally:
            conn.close()

    def work(self, conn: psycopg.Connection) -> tuple[str, str | None]:
        """Do the job: its end state (done, cancelled, failed) and the reason of a failure."""
        raise NotImplementedError

    def report(self, conn: psycopg.Connection, state: str, rate: float, error: str | None = None) -> bool:
        """Write progress on the run's row; True when the lab asked this run to stop."""
        raise NotImplementedError

    def ended(self, state: str, seconds: float) -> tuple[str, dict]:
        """What the timeline says of the run's end, after its state, and the entry's details."""
        raise NotImplementedError


R = TypeVar("R", bound=HeavyRun)


class HeavyRuns(Generic[R]):
    """The agent's running runs of one job, by lab: started by a command, stopped when the lab is
    reset or the agent stops."""

    def __init__(self) -> None:
        self.runs: dict[str, R] = {}

    def running(self, lab: Lab) -> R | None:
        run = self.runs.get(lab.name)
        return run if run is not None and run.is_alive() else None

    def launch(self, run: R) -> int:
        """Start ``run`` (its row is written); its id."""
        self.runs[run.lab.name] = run
        run.start()
        return run.run_id

    def labs(self) -> list[str]:
        """The labs a run is going on in, on this agent."""
        return [name for name, run in list(self.runs.items()) if run.is_alive()]

    def stop(self, lab: Lab, timeout: float = 30.0) -> None:
        run = self.runs.pop(lab.name, None)
        if run is not None:
            run.stop_requested.set()
            run.join(timeout)

    def stop_all(self) -> None:
        for name in list(self.runs):
            self.stop(Lab(name))
