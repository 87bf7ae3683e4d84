"""The guided runs of the exercises (``lab_control.scenario_runs``): one row per run, its progress
as JSON (the runner's RunState), and a ``busy`` claim while one click of it runs on an agent.

Every statement on the table is here; the web, the board, the guided steps and housekeeping call
these. Imports the store only.
"""
from __future__ import annotations

import json
from typing import Any, Mapping

from sqlalchemy import Connection, text

from .connection import CONTROL_SCHEMA

C = CONTROL_SCHEMA
# A claim older than this is a step whose agent died mid-click: the run may be claimed again.
STALE_CLAIM = "3 minutes"


def insert(conn: Connection, scenario: str, lab: str, progress: Mapping[str, Any]) -> int:
    """A new run, ready for its first click; its id."""
    return conn.execute(text(f"INSERT INTO {C}.scenario_runs (scenario, lab, status, progress) "
                             "VALUES (:n, :lab, 'ready', CAST(:p AS jsonb)) RETURNING id"),
                        {"n": scenario, "lab": lab, "p": json.dumps(progress, default=str)}).scalar_one()


def get(conn: Connection, run_id: int) -> dict[str, Any] | None:
    """The run's row (scenario, lab, status, progress, busy, times), or None."""
    row = conn.execute(text(f"SELECT * FROM {C}.scenario_runs WHERE id = :id"), {"id": run_id}).mappings().first()
    return dict(row) if row is not None else None


def recent(conn: Connection, limit: int = 12, labs: list[str] | None = None) -> list[Mapping[str, Any]]:
    """The newest runs, newest first: of every lab, or of ``labs`` only."""
    where = "WHERE lab = ANY(:labs)" if labs is not None else ""
    return conn.execute(text(f"SELECT id, scenario, lab, status, created_at FROM {C}.scenario_runs {where} "
                             "ORDER BY id DESC LIMIT :limit"), {"limit": limit, "labs": labs}).mappings().all()


def claim(conn: Connection, run_id: int) -> bool:
    """Mark the run busy, unless a step of it is already running (a claim past STALE_CLAIM is free)."""
    return conn.execute(text(f"UPDATE {C}.scenario_runs SET busy = true, updated_at = now() WHERE id = :id "
                             f"AND (NOT busy OR updated_at < now() - interval '{STALE_CLAIM}') RETURNING id"),
                        {"id": run_id}).first() is not None


def save(conn: Connection, run_id: int, progress: Mapping[str, Any], status: str) -> None:
    conn.execute(text(f"UPDATE {C}.scenario_runs SET progress = CAST(:p AS jsonb), status = :s, "
                      "updated_at = now() WHERE id = :id"),
                 {"p": json.dumps(progress, default=str), "s": status, "id": run_id})


def note_waiting(conn: Connection, run_id: int, waiting: str) -> None:
    """What the run's running step waits for (its progress's ``waiting``), while the run is busy;
    it also keeps the run's claim fresh."""
    conn.execute(text(f"UPDATE {C}.scenario_runs SET progress = jsonb_set(progress, '{{waiting}}', "
                      "to_jsonb(CAST(:w AS text))), updated_at = now() WHERE id = :id AND busy"),
                 {"w": waiting, "id": run_id})


def release(conn: Connection, run_id: int) -> None:
    conn.execute(text(f"UPDATE {C}.scenario_runs SET busy = false WHERE id = :id"), {"id": run_id})


def busy_in(conn: Connection, lab: str) -> int:
    """How many of the lab's runs have a step running now (a claim not yet stale)."""
    return conn.execute(text(f"SELECT count(*) FROM {C}.scenario_runs WHERE lab = :lab AND busy "
                             f"AND updated_at > now() - interval '{STALE_CLAIM}'"), {"lab": lab}).scalar()
