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

import time

import psycopg

from ..domain import commands
from ..domain.lab import Lab
from ..store import heavy_jobs, schema, timeline
from ..strategies import dedup_layout
from .heavy import HeavyRun, HeavyRuns
from .load import RUNS as LOAD_RUNS

SLICE = 50_000          # keys per statement: a fraction of a second each, so progress and cancels are prompt

PROGRESS_SQL = """
UPDATE warmup_runs SET state = %(state)s::varchar, inserted = %(inserted)s, rate = %(rate)s, updated_at = now(),
       finished_at = CASE WHEN %(state)s::varchar IN ('done', 'cancelled', 'failed') THEN now() END,
       error = %(error)s
WHERE id = %(id)s
RETURNING cancel_requested
"""


class WarmupRun(HeavyRun):
    """One warm-up: insert slice by slice, report, stop when done, cancelled or the agent stops."""

    job = "warm-up"
    timeline_kind = "ttl"

    def __init__(self, database_url: str, lab: Lab, run_id: int, keys: int, days: int):
        super().__init__(database_url, lab, run_id)
        self.keys, self.days = keys, days
        self.inserted = 0

    def work(self, conn: psycopg.Connection) -> tuple[str, str | None]:
        return self._insert(conn), None

    def ended(self, state: str, seconds: float) -> tuple[str, dict]:
        return (f"{self.inserted:,} of {self.keys:,} synthetic key(s) inserted into processed_events in "
                f"{seconds:.2f} s (spread over {self.days} day(s); no events behind them)", {"keys": self.inserted})

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
            if self.inserted < self.keys and (self.report(conn, "running", rate) or self.stop_requested.is_set()):
                return "cancelled"
        conn.execute("ANALYZE processed_events")
        return "done"

    def report(self, conn: psycopg.Connection, state: str, rate: float, error: str | None = None) -> bool:
        row = conn.execute(PROGRESS_SQL, {"id": self.run_id, "state": state, "inserted": self.inserted,
                                          "rate": round(rate, 1), "error": error}).fetchone()
        return bool(row and row[0])


class WarmupRuns(HeavyRuns[WarmupRun]):
    """The agent's running warm-ups, by lab: started by the ``dedup.warmup`` command."""

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
        return self.launch(WarmupRun(database_url, lab, run_id, keys, days))


RUNS = WarmupRuns()


def start_warmup(agent, lab: Lab, command: commands.DedupWarmup) -> dict:
    """The ``dedup.warmup`` command: start a warm-up on this agent; its id, at once (it runs on)."""
    keys, days = command.keys, command.days
    run_id = RUNS.start(agent.conn, agent.pool.database_url, lab, keys, days)
    return {"run_id": run_id, "state": "running", "keys": keys, "days": days}
