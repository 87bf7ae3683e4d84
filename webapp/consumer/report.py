"""The consumer's reporter: its control row on the heartbeat's cadence, its counts, its timeline.

The report (control.Report: state, assignment, positions, counts, last error) is kept in memory
and written to the consumer's control row on a heartbeat, every HEARTBEAT_EVERY at most. The
effect transactions announce nothing on the live panels' change feed (store/lab_changes.py: the
effects connection is a quiet session): a transaction that NOTIFYs takes PostgreSQL's
cluster-wide notify lock at commit and wakes every listener, once per record. The report
announces the lab instead: written at once after the first effect that follows a quiet spell of
HEARTBEAT_EVERY, then on the heartbeat's cadence while effects keep coming.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from ..store import schema, timeline
from ..strategies.base import ABSORBED, APPLIED

HEARTBEAT_EVERY = 0.5


class Reporter:
    """One consumer process's reports. ``process`` is the consumer (loop.ConsumerProcess): its
    report, control row and connection, Kafka consumer and names."""

    def __init__(self, process: Any):
        self.process = process
        self.last_heartbeat = 0.0
        # Whether an effect was committed since the last report, and when one was last reported.
        self.effects_unreported = False
        self.effects_reported_at = 0.0

    def count(self, outcome: str, records: int = 1) -> None:
        """Add ``records`` deliveries with ``outcome`` (applied, absorbed, dead-lettered) to the counts."""
        counts = self.process.report.counts
        if outcome == APPLIED:
            counts.applied += records
        elif outcome == ABSORBED:
            counts.absorbed += records
        else:
            counts.dead_lettered += records

    def report_effects(self) -> None:
        """After an effect's transaction and its offset commit: the report announces the lab's new
        data on the change feed (its counts and positions moved). At once when no effect was
        reported for HEARTBEAT_EVERY (a learner's one record shows without delay), else with the
        next heartbeat (a stream of records: at most two reports a second)."""
        self.effects_unreported = True
        self.heartbeat(force=time.monotonic() - self.effects_reported_at >= HEARTBEAT_EVERY)

    def heartbeat(self, force: bool = False) -> None:
        """Every HEARTBEAT_EVERY (or now, when ``force``): the positions, the process's look at
        its settings and its agent (ConsumerProcess.check_in), then the report to the control row."""
        now = time.monotonic()
        if not force and now - self.last_heartbeat < HEARTBEAT_EVERY:
            return
        self.last_heartbeat = now
        if self.effects_unreported:
            self.effects_unreported, self.effects_reported_at = False, now
        process = self.process
        try:
            assignment = process.consumer.assignment()
            positions = process.consumer.position(assignment) if assignment else []
            process.report.positions = {str(tp.partition): tp.offset for tp in positions if tp.offset >= 0}
        except KafkaException:
            pass  # between rebalances there may be no position to report
        process.check_in()
        self.write()

    def write(self) -> None:
        """The report to the consumer's control row, now."""
        self.process.control.write(self.process.report)

    def say(self, kind: str, summary: str, **detail: Any) -> None:
        """A timeline entry in the lab's schema, outside any effect transaction."""
        process = self.process
        conn = process.control_conn
        with conn.transaction():
            schema.enter_psycopg(conn, process.lab.schema)
            timeline.record(conn.execute, kind, summary, consumer=process.name, group=process.group_id, **detail)

    @contextmanager
    def from_callback(self):
        """Around a rebalance callback's writes to PostgreSQL (and a commit retry's). No exception
        may leave a rebalance callback (it would surface from poll() mid-rebalance), nor a commit
        retry (its record's effect is committed): a connection lost to a PostgreSQL restart is noted,
        the loop reconnects next, and the report, kept in memory, goes out with the next heartbeat."""
        try:
            yield
        except psycopg.OperationalError as error:
            self.process.control_broken = error
