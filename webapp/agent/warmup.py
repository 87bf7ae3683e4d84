"""The dedup warm-up: N synthetic keys into a lab's ``processed_events`` (set-based, no events),
spread over the last days, on a thread of the lab agent, like the load generator: the request that
asks for it returns at once with the run, and a warm-up of millions of keys never holds a web
request (or a web worker) for a minute.

The keys go in slices of ``SLICE`` (one statement, one transaction each): after every slice the
run's ``warmup_runs`` row says how many are in, and the thread reads ``cancel_requested``
(``ops.cancel_dedup_warmup``). At the end, ANALYZE: the panels' row estimate and the planner see
them.
"""
from __future__ import annotations

import logging
import threading
import time

import psycopg

from ..domain.lab import Lab
from ..store import heavy_jobs, schema, timeline
from ..store.connection import connect
from ..strategies import dedup_layout
from .load import RUNS as LOAD_RUNS

log = logging.getLogger("idempotency_lab.agent.warmup")

SLICE = 50_000          # keys per statement: a fraction of a second each, so progress and cancels are prompt

PROGRESS_SQL = """
UPDATE warmup_runs SET state = %(state)s::varchar, inserted = %(inserted)s, rate = %(rate)s, updated_at = now(),
       finished_at = CASE WHEN %(state)s::varchar IN ('done', 'cancelled', 'failed') THEN now() END,
       error = %(error)s
WHERE id = %(id)s
RETURNING cancel_requested
"""


class WarmupRun(threading.Thread):
    """One warm-up: insert slice by slice, report, stop when done, cancelled or the agent stops."""

    def __init__(self, database_url: str, lab: Lab, run_id: int, keys: int, days: int):
        super().__init__(name=f"warm-up {lab.name}#{run_id}", daemon=True)
        self.database_url, self.lab, self.run_id, self.keys, self.days = database_url, lab, run_id, keys, days
        self.stop_requested = threading.Event()
        self.inserted = 0

    def run(self) -> None:
        conn = connect(self.database_url, schema=self.lab.schema, autocommit=True,
                       application_name=f"lab {self.lab.name} warm-up")
        started = time.monotonic()
        try:
            state, error = self._insert(conn), None
        except Exception as problem:  # a bug or a lost database: the run says so, the agent lives on
            log.exception("warm-up run %s", self.run_id)
            state, error = "failed", f"{type(problem).__name__}: {problem}"
        seconds = time.monotonic() - started
        try:
            self._report(conn, state, 0.0, error)
            timeline.record(conn.execute, "ttl", f"warm-up run {self.run_id} {state}: {self.inserted:,} of "
                            f"{self.keys:,} synthetic key(s) inserted into processed_events in {seconds:.2f} s "
                            f"(spread over {self.days} day(s); no events behind them)",
                            run=self.run_id, state=state, keys=self.inserted, error=error)
        except psycopg.Error:
            log.warning("warm-up run %s: could not report its end (%s)", self.run_id, state)
        finally:
            conn.close()

    def _insert(self, conn: psycopg.Connection) -> str:
        partitioned = dedup_layout.prepare_warm_up(conn.execute, self.days)
        last_report, inserted_at_report = time.monotonic(), 0
        while self.inserted < self.keys:
            first = self.inserted + 1
            last = min(self.keys, self.inserted + SLICE)
            self.inserted += dedup_layout.insert_warm_up_keys(conn.execute, partitioned, self.keys, self.days,
                                                              first, last)
            now = time.monotonic()
            rate = (self.inserted - inserted_at_report) / (now - last_report) if now > last_report else 0.0
            last_report, inserted_at_report = now, self.inserted
            if self.inserted < self.keys and (self._report(conn, "running", rate) or self.stop_requested.is_set()):
                return "cancelled"
        conn.execute("ANALYZE processed_events")
        return "done"

    def _report(self, conn: psycopg.Connection, state: str, rate: float, error: str | None = None) -> bool:
        """Write progress; True when the lab asked this run to stop."""
        row = conn.execute(PROGRESS_SQL, {"id": self.run_id, "state": state, "inserted": self.inserted,
                                          "rate": round(rate, 1), "error": error}).fetchone()
        return bool(row and row[0])


class WarmupRuns:
    """The agent's running warm-ups, by lab: started by the ``dedup.warmup`` command, stopped when
    the lab is reset or the agent stops."""

    def __init__(self) -> None:
        self.runs: dict[str, WarmupRun] = {}

    def running(self, lab: Lab) -> WarmupRun | None:
        run = self.runs.get(lab.name)
        return run if run is not None and run.is_alive() else None

    def start(self, conn: psycopg.Connection, database_url: str, lab: Lab, keys: int, days: int) -> int:
        """The run's row, once no heavy job runs in the lab; then its thread."""
        with conn.transaction():
            schema.enter_psycopg(conn, lab.schema)
            heavy_jobs.lock(conn.execute, lab.schema)
            job = heavy_jobs.running(conn.execute)
            if job is None and (LOAD_RUNS.running(lab) or self.running(lab)):
                job = ("load", 0, 0) if LOAD_RUNS.running(lab) else ("warm-up", 0, 0)
            if job is not None:
                raise ValueError(f"busy: {heavy_jobs.describe(job)}")
            run_id = conn.execute("INSERT INTO warmup_runs (keys, days, state) VALUES (%s, %s, 'running') RETURNING id",
                                  [keys, days]).fetchone()[0]
            timeline.record(conn.execute, "ttl", f"warm-up run {run_id}: {keys:,} synthetic key(s) over the last "
                            f"{days} day(s), on the agent", run=run_id)
        run = WarmupRun(database_url, lab, run_id, keys, days)
        self.runs[lab.name] = run
        run.start()
        return run_id

    def stop(self, lab: Lab, timeout: float = 30.0) -> None:
        run = self.runs.pop(lab.name, None)
        if run is not None:
            run.stop_requested.set()
            run.join(timeout)

    def stop_all(self) -> None:
        for name in list(self.runs):
            self.stop(Lab(name))


RUNS = WarmupRuns()


def start_warmup(agent, lab: Lab, args: dict) -> dict:
    """The ``dedup.warmup`` command: start a warm-up on this agent; its id, at once (it runs on)."""
    try:
        keys, days = int(args["keys"]), int(args["days"])
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"keys: a warm-up needs keys and days as numbers ({error})") from None
    run_id = RUNS.start(agent.conn, agent.pool.database_url, lab, keys, days)
    return {"run_id": run_id, "state": "running", "keys": keys, "days": days}
