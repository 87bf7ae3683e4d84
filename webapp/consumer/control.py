"""The consumer's side of the control channel: its row in ``lab_control.consumers``.

The lab writes what it wants (armed fault, step mode, step advances); the consumer writes
what it is (state, assignment, positions, counts) on a connection of its own, outside the
effect's transaction, so a report is visible even while a transaction is open or the
process is about to die.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import psycopg

from ..store.connection import CONTROL_SCHEMA

TABLE = f"{CONTROL_SCHEMA}.consumers"


@dataclass
class Desired:
    """What the lab asks of this consumer now."""
    armed_point: str | None = None
    armed_action: str | None = None
    armed_always: bool = False
    step_mode: bool = False
    step_advance: int = 0
    exists: bool = True


@dataclass
class Counts:
    applied: int = 0
    absorbed: int = 0
    dead_lettered: int = 0
    commit_failures: int = 0


@dataclass
class Report:
    state: str = "starting"
    assigned: list[int] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)
    applied_positions: dict[str, int] = field(default_factory=dict)
    generation: int = 0
    step_at: str | None = None
    last_error: str | None = None
    counts: Counts = field(default_factory=Counts)


class ControlRow:
    def __init__(self, conn: psycopg.Connection, consumer_id: int):
        self.conn = conn
        self.consumer_id = consumer_id

    def read(self) -> Desired:
        row = self.conn.execute(
            f"SELECT armed_point, armed_action, armed_always, step_mode, step_advance FROM {TABLE} WHERE id = %s",
            [self.consumer_id]).fetchone()
        if row is None:
            return Desired(exists=False)
        return Desired(*row)

    def counts(self) -> Counts:
        row = self.conn.execute(f"SELECT applied, absorbed, dead_lettered, commit_failures FROM {TABLE} WHERE id = %s",
                                [self.consumer_id]).fetchone()
        return Counts(*row) if row else Counts()

    def generation(self) -> int:
        """The last generation this consumer reported, in any of its processes."""
        row = self.conn.execute(f"SELECT generation FROM {TABLE} WHERE id = %s", [self.consumer_id]).fetchone()
        return int(row[0] or 0) if row else 0

    def write(self, report: Report) -> None:
        c = report.counts
        # assigned_at and progressed_at are the clocks of the group's health (domain/group_health.py):
        # they move only when the assignment or a position does (the right-hand side reads the old row).
        assigned, positions = json.dumps(report.assigned), json.dumps(report.positions)
        self.conn.execute(
            f"UPDATE {TABLE} SET state = %s, "
            "assigned_at = CASE WHEN assigned IS DISTINCT FROM %s::jsonb THEN now() ELSE assigned_at END, "
            "progressed_at = CASE WHEN positions IS DISTINCT FROM %s::jsonb THEN now() ELSE progressed_at END, "
            "assigned = %s, positions = %s, applied_positions = %s, "
            "generation = %s, step_at = %s, last_error = %s, applied = %s, absorbed = %s, dead_lettered = %s, "
            "commit_failures = %s, heartbeat_at = now() WHERE id = %s",
            [report.state, assigned, positions, assigned, positions,
             json.dumps(report.applied_positions), report.generation, report.step_at, report.last_error,
             c.applied, c.absorbed, c.dead_lettered, c.commit_failures, self.consumer_id])

    def disarm(self) -> None:
        self.conn.execute(f"UPDATE {TABLE} SET armed_point = NULL, armed_action = NULL WHERE id = %s",
                          [self.consumer_id])

    def wait_for_advance(self, seen: int, still_wanted, wait=time.sleep, interval: float = 0.1) -> int:
        """Wait until the lab advances the step counter past ``seen`` (or leaves step mode).

        ``wait(seconds)`` passes the time between two looks: the consumer's keep_alive, which polls
        with its partitions paused, so a step held for minutes keeps it in its group."""
        while True:
            desired = self.read()
            if not desired.exists or not desired.step_mode or desired.step_advance > seen:
                return desired.step_advance
            if not still_wanted():
                return seen
            wait(interval)
