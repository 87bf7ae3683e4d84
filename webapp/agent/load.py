"""The load generator: N payment events over M accounts, at a target rate or as fast as possible,
with seeded ratios of resends (the same event again) and source duplicates (the same transaction
under a new event id). Runs on a thread of the lab agent with a producer and a database
connection of its own, so the agent keeps serving commands while it runs.

Progress (sent, rate, state) goes to the lab's ``load_runs`` row twice a second; the lab asks a
run to stop by setting ``cancel_requested`` (``ops.cancel_load``), which the thread reads at the
same moments. The records are not journaled one by one in ``published_events``: at 10,000,000
events the witness would be as large as the log and every journal-reading panel would pay for
it; the log mirror (``log_records``) is the truth, and the run row counts what was sent.
"""
from __future__ import annotations

import json
import random
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import psycopg
from confluent_kafka import Producer

from ..domain import commands
from ..domain.lab import Lab
from ..kafka.config import producer_config
from ..store import heavy_jobs, schema, timeline
from ..store.schema import quoted
from .heavy import HeavyRun, HeavyRuns

REPORT_EVERY = 0.5          # seconds between progress rows (and cancel checks)
BATCH = 1000                # records produced between rate and cancel checks
RECENT = 10_000             # events a resend or a source duplicate is drawn from
MAX_AMOUNT_CENTS = 10_000
# Batched for throughput: the log mirror reads every record whatever its batch, and the log end
# comes from the mirror, never from the broker's high watermark (docs/concepts/broker.md).
LOAD_PRODUCER = {"linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 200_000,
                 "message.timeout.ms": 60_000}


@dataclass(frozen=True)
class LoadSpec:
    events: int
    accounts: int
    rate_per_second: int          # 0: as fast as possible
    resend_ratio: float
    source_duplicate_ratio: float
    seed: int

    @classmethod
    def of(cls, command: commands.LoadStart) -> "LoadSpec":
        return cls(events=command.events, accounts=command.accounts, rate_per_second=command.rate_per_second,
                   resend_ratio=command.resend_ratio, source_duplicate_ratio=command.source_duplicate_ratio,
                   seed=command.seed)


def account_ids(accounts: int) -> list[str]:
    """The accounts a load spreads over: the seed accounts' names, extended (acc-1 … acc-M)."""
    return [f"acc-{n}" for n in range(1, accounts + 1)]


class EventSource:
    """The seeded stream of encoded events: the same seed gives the same kinds, accounts, amounts
    and ids. A resend repeats a recent event's bytes; a source duplicate re-encodes a recent event
    with a new event id."""

    def __init__(self, spec: LoadSpec):
        self.spec = spec
        self.random = random.Random(spec.seed)
        self.accounts = account_ids(spec.accounts)
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT)
        self.resends = self.source_duplicates = 0

    def _uuid(self) -> str:
        return str(uuid.UUID(int=self.random.getrandbits(128), version=4))

    def next(self, occurred_at: str) -> tuple[bytes, bytes]:
        """(key, value) of the next record."""
        draw = self.random.random()
        if self.recent and draw < self.spec.resend_ratio:
            event = self.random.choice(self.recent)
            self.resends += 1
        elif self.recent and draw < self.spec.resend_ratio + self.spec.source_duplicate_ratio:
            event = {**self.random.choice(self.recent), "event_id": self._uuid()}
            self.source_duplicates += 1
            self.recent.append(event)
        else:
            event = {"event_id": self._uuid(), "transaction_id": "L" + uuid.UUID(int=self.random.getrandbits(128)).hex[:31].upper(),
                     "type": "credit", "account_id": self.random.choice(self.accounts),
                     "amount_cents": self.random.randint(1, MAX_AMOUNT_CENTS), "occurred_at": occurred_at}
            self.recent.append(event)
        return event["account_id"].encode(), json.dumps(event, sort_keys=True).encode()


PROGRESS_SQL = """
UPDATE load_runs SET state = %(state)s::varchar, sent = %(sent)s, resends = %(resends)s,
       source_duplicates = %(source_duplicates)s, failed = %(failed)s, rate = %(rate)s, updated_at = now(),
       finished_at = CASE WHEN %(state)s::varchar IN ('done', 'cancelled', 'failed') THEN now() END,
       error = %(error)s
WHERE id = %(id)s
RETURNING cancel_requested
"""


class LoadRun(HeavyRun):
    """One run: produce, report, stop when done, cancelled or the agent stops."""

    job = "load"
    timeline_kind = "published"

    def __init__(self, database_url: str, bootstrap_servers: str, lab: Lab, run_id: int, spec: LoadSpec):
        super().__init__(database_url, lab, run_id)
        self.bootstrap_servers, self.spec = bootstrap_servers, spec
        self.sent = self.failed = self.resends = self.source_duplicates = 0

    def _on_delivery(self, error, message) -> None:
        if error is not None:
            self.failed += 1

    def work(self, conn: psycopg.Connection) -> tuple[str, str | None]:
        return self._produce(conn)

    def ended(self, state: str, seconds: float) -> tuple[str, dict]:
        return f"{self.sent:,} of {self.spec.events:,} record(s) sent", {}

    def _produce(self, conn: psycopg.Connection) -> tuple[str, str | None]:
        producer = Producer({**producer_config(self.bootstrap_servers, True, client_id=self.lab.producer_client_id),
                             **LOAD_PRODUCER})
        source = EventSource(self.spec)
        started = last_report = time.monotonic()
        sent_at_report = 0
        state = "running"
        # A paced run produces in slices of a twentieth of a second, so pacing and cancels stay prompt.
        batch = max(1, min(BATCH, self.spec.rate_per_second // 20)) if self.spec.rate_per_second else BATCH
        while self.sent < self.spec.events:
            occurred_at = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            for _ in range(min(batch, self.spec.events - self.sent)):
                key, value = source.next(occurred_at)
                while True:
                    try:
                        producer.produce(self.lab.topic, value=value, key=key, on_delivery=self._on_delivery)
                        break
                    except BufferError:
                        producer.poll(0.05)  # the local queue is full: serve delivery reports first
                self.sent += 1
            producer.poll(0)
            if self.spec.rate_per_second:
                # Pace to the target: wait until this many records are due (a cancel ends the wait).
                due = started + self.sent / self.spec.rate_per_second
                self.stop_requested.wait(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            if now - last_report >= REPORT_EVERY or self.stop_requested.is_set():
                rate = (self.sent - sent_at_report) / (now - last_report) if now > last_report else 0.0
                last_report, sent_at_report = now, self.sent
                self.resends, self.source_duplicates = source.resends, source.source_duplicates
                if self.report(conn, state, rate) or self.stop_requested.is_set():
                    state = "cancelled"
                    break
        self.resends, self.source_duplicates = source.resends, source.source_duplicates
        remaining = producer.flush(60)
        if remaining:
            self.failed += remaining
            return "failed", f"{remaining} record(s) not acknowledged by Kafka within 60 s"
        return ("done" if state == "running" else state), None

    def report(self, conn: psycopg.Connection, state: str, rate: float, error: str | None = None) -> bool:
        row = conn.execute(PROGRESS_SQL, {
            "id": self.run_id, "state": state, "sent": self.sent, "resends": self.resends,
            "source_duplicates": self.source_duplicates, "failed": self.failed,
            "rate": round(rate, 1), "error": error}).fetchone()
        return bool(row and row[0])


class LoadRuns(HeavyRuns[LoadRun]):
    """The agent's running loads, by lab: started by the ``load.start`` command."""

    def start(self, conn: psycopg.Connection, database_url: str, bootstrap_servers: str, lab: Lab,
              spec: LoadSpec) -> int:
        """Create the accounts the load needs (in the lab and every lane), the run's row, and start it."""
        with conn.transaction():
            schema.enter_psycopg(conn, lab.schema)
            heavy_jobs.lock(conn.execute, lab.schema)
            job = heavy_jobs.running(conn.execute) or (("load", 0, 0) if self.running(lab) else None)
            if job is not None:  # one heavy job per lab: a load, or a dedup warm-up (webapp/agent/warmup.py)
                raise ValueError(f"busy: {heavy_jobs.describe(job)}")
            lanes = schema.lab_and_lane_schemas(conn.execute, lab.schema)
            for lane_schema in lanes:
                conn.execute(f'INSERT INTO {quoted(lane_schema)}.accounts (id, owner, balance, status) '
                             "SELECT 'acc-' || n, 'load ' || n, 0, 'ACTIVE' FROM generate_series(1, %s) n "
                             "ON CONFLICT (id) DO NOTHING", [spec.accounts])
            run_id = conn.execute(
                "INSERT INTO load_runs (events, accounts, rate_per_second, resend_ratio, source_duplicate_ratio, seed, "
                "state) VALUES (%s, %s, %s, %s, %s, %s, 'running') RETURNING id",
                [spec.events, spec.accounts, spec.rate_per_second, spec.resend_ratio, spec.source_duplicate_ratio,
                 spec.seed]).fetchone()[0]
            pace = f"{spec.rate_per_second:,}/s" if spec.rate_per_second else "as fast as possible"
            timeline.record(conn.execute, "published", f"load run {run_id}: {spec.events:,} event(s) over "
                            f"{spec.accounts:,} account(s), {pace}, resends {spec.resend_ratio:.0%}, source "
                            f"duplicates {spec.source_duplicate_ratio:.0%}, seed {spec.seed}", run=run_id)
        return self.launch(LoadRun(database_url, bootstrap_servers, lab, run_id, spec))


RUNS = LoadRuns()


def start_load(agent, lab: Lab, command: commands.LoadStart) -> dict:
    """The ``load.start`` command: start a run on this agent; its id, at once (it runs on)."""
    spec = LoadSpec.of(command)
    run_id = RUNS.start(agent.conn, agent.pool.database_url, agent.producer_bootstrap_servers, lab, spec)
    return {"run_id": run_id, "state": "running", "events": spec.events, "accounts": spec.accounts}
