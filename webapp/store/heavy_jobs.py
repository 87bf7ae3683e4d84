"""At most one heavy job per lab at a time: a load-generator run or a dedup warm-up. Both run on
a lab agent's thread and report to the lab's tables (``load_runs``, ``warmup_runs``); the one
running, if any, is read here by the operations (before they ask an agent) and by the agent
(before it starts one: two requests at once cannot both pass).

A run that has not reported for ``STALE_SECONDS`` lost its thread (its agent died): it does not
hold the lab.
"""
from __future__ import annotations

from typing import Any, Callable

ACTIVE_STATES = ("starting", "running")
STALE_SECONDS = 10
# The running job of the current schema's lab, if any; no parameters (psycopg and SQLAlchemy alike).
RUNNING_SQL = f"""
SELECT kind, id, size FROM (
    SELECT 'load' AS kind, id, events AS size, updated_at FROM load_runs
    WHERE state IN ('starting', 'running') AND updated_at > now() - interval '{STALE_SECONDS} seconds'
    UNION ALL
    SELECT 'warm-up', id, keys, updated_at FROM warmup_runs
    WHERE state IN ('starting', 'running') AND updated_at > now() - interval '{STALE_SECONDS} seconds'
) running ORDER BY updated_at DESC LIMIT 1
"""
HOW_TO_STOP = {
    "load": "cancel it (POST /api/v1/load/cancel, the Load generator's Cancel button) or wait for it to finish",
    "warm-up": "cancel it (POST /api/v1/dedup/warmup/cancel, the Cancel button beside the warm-up) or wait for "
               "it to finish",
}
UNITS = {"load": "events", "warm-up": "keys"}


def running(execute: Callable[[str], Any]) -> tuple[str, int, int] | None:
    """(kind, run id, its size) of the job running in the current schema's lab, or None.
    ``execute``: a driver-level execute of the connection (psycopg's or SQLAlchemy's)."""
    row = execute(RUNNING_SQL).fetchone()
    return (str(row[0]), int(row[1]), int(row[2])) if row else None


def describe(job: tuple[str, int, int]) -> str:
    """Why another heavy job must wait: what runs, and how to stop it."""
    kind, run_id, size = job
    return (f"{kind} run {run_id} ({size:,} {UNITS[kind]}) is running in this lab, and a lab runs one heavy job "
            f"(a load or a dedup warm-up) at a time: {HOW_TO_STOP[kind]}")


def lock(execute: Callable[..., Any], lab_schema: str) -> None:
    """Inside the transaction that starts a job: one start per lab at a time (until it commits), so
    two requests at once cannot both find the lab free. ``execute``: psycopg's (``%s`` parameters)."""
    execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [f"heavy job {lab_schema}"])


# Each kind's table of runs: the operations cancel and list runs through it.
TABLES = {"load": "load_runs", "warm-up": "warmup_runs"}


def cancel_sql(kind: str) -> str:
    """Ask every active run of ``kind`` to stop (its thread sees the flag at its next report); the ids."""
    return (f"UPDATE {TABLES[kind]} SET cancel_requested = true "
            f"WHERE state IN {ACTIVE_STATES!r} RETURNING id")
