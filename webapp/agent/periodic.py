"""The agent's periodic work.

On a thread of its own, with its own database connection, so it keeps going while the main loop
carries out a long command (a group reset waits up to 20 s for the group to empty):
- the heartbeat: the agent's row and the leases of the commands it runs every half second, the
  reaper's round (queue.py) every 1.5 s;
- a look at the broker every second (its own thread: an unanswered metadata request may block for
  its timeout, and must not delay the heartbeat);
- the running summaries' folder (its own thread and connection: a first build at millions of
  records takes minutes), every 0.1 s while labs have changes queued, every 0.5 s at rest; its
  upkeep (the queues' thorough vacuum, the statistics of tables that outgrew them) on a thread and
  a connection of their own, every ten seconds.

On the main loop, between commands, about once a second: each lab's committed offsets into
``group_offsets`` (when they may have moved, and every few seconds anyway: the broker moves them too)
and the scheduled TTL cleanups.
"""
from __future__ import annotations

import logging
import threading
import time

import psycopg
from confluent_kafka import KafkaException
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain.lab import Lab
from ..domain.vocabulary import (
    DEFAULT_TTL_SECONDS,
    LANE_IDLE_IN_TRANSACTION_SECONDS,
    LANE_STATEMENT_SECONDS,
)
from ..kafka.admin import admin_client, broker_error, committed_offsets_of
from ..store import agents, commands, consumer_groups, labdata, outside, schema, timeline
from ..store.connection import connect, sqlalchemy_url
from ..store.schema import quoted
from ..strategies import ttl
from ..summary import fold
from .queue import LEASE_SECONDS, Reaper

log = logging.getLogger("idempotency_lab.agent")

BEAT_EVERY = 0.5
REAP_EVERY_BEATS = 3  # the reaper's round every 1.5 s
PROBE_EVERY = 1.0
TICK = 1.0
# Every lab's committed offsets are read again at least this often, consumers or not: the broker
# moves them too (Apache Kafka deletes an empty group's after offsets.retention.minutes).
IDLE_SNAPSHOT_SECONDS = 5


class Heartbeat:
    """The agent's pulse: its own threads, its own connection, its own admin client."""

    def __init__(self, database_url: str, bootstrap_servers: str, agent_id: str, host: str, pid: int):
        self.agent_id, self.host, self.pid = agent_id, host, pid
        self.engine: Engine = create_engine(sqlalchemy_url(database_url), pool_size=1, max_overflow=1,
                                            pool_pre_ping=True, connect_args={"connect_timeout": 3})
        self.admin = admin_client(bootstrap_servers)
        self.reaper = Reaper(agent_id, host, pid)
        self.kafka_error: str | None = "not checked yet"
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._beats = 0

    def start(self) -> None:
        """Reconcile the rows of a dead agent that had our host and pid, report ourselves, then beat."""
        self.probe()
        for agent_id in self.reaper.reconcile_predecessors(self.engine):
            log.warning("agent %s had this host and pid: it died; its commands and consumers are reconciled",
                        agent_id)
        self.beat()
        for target, name in ((self._beat_loop, "heartbeat"), (self._probe_loop, "broker probe")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def probe(self) -> None:
        self.kafka_error = broker_error(self.admin, timeout=1.5)

    def beat(self) -> None:
        """The agent's row and its leases at every beat; the reaper's round (six queries over every
        agent's commands and consumers) every REAP_EVERY_BEATS beats: what it finds is at least
        AGENT_FRESH_SECONDS old, so a second more does not change what a person sees."""
        reaping = self._beats % REAP_EVERY_BEATS == 0
        self._beats += 1
        with self.engine.begin() as conn:
            agents.beat(conn, self.agent_id, self.host, self.pid, self.kafka_error)
            commands.renew_leases(conn, self.agent_id, LEASE_SECONDS)
            if reaping:
                self.reaper.reap(conn)
        if reaping:
            self.reaper.tell(self.engine)
            self.end_overrunning_lane_sessions()

    def end_overrunning_lane_sessions(self) -> None:
        """A learner's code that lifted its role's timeouts still gets no more of the shared
        PostgreSQL: its overrunning sessions are ended, and its lab's timeline says why."""
        with self.engine.begin() as conn:
            ended = outside.end_overrunning_sessions(conn, LANE_STATEMENT_SECONDS, LANE_IDLE_IN_TRANSACTION_SECONDS)
            for session in ended:
                schema.enter(conn, Lab(session.lab).schema)
                labdata.say(conn, "fault", f"the lab ended a session of your consumer (role {session.role}, pid "
                            f"{session.pid}): it {session.why}, past its role's bounds", role=session.role)

    def _beat_loop(self) -> None:
        while not self._stop.wait(BEAT_EVERY):
            try:
                self.beat()
            except SQLAlchemyError as error:  # PostgreSQL restarting: beat again next time
                log.warning("heartbeat: %s", str(error).splitlines()[0])
            except Exception:  # never let the pulse stop: say why, beat again next time
                log.exception("heartbeat")

    def _probe_loop(self) -> None:
        while not self._stop.wait(PROBE_EVERY):
            before = self.kafka_error
            self.probe()
            if (before is None) != (self.kafka_error is None):
                # The broker went away or came back: said now, not at the next beat (the status
                # bar shows the broker down within 5 s of its death; this saves up to BEAT_EVERY).
                try:
                    with self.engine.begin() as conn:  # the agent's row alone: the reaper is the beat's
                        agents.beat(conn, self.agent_id, self.host, self.pid, self.kafka_error)
                except SQLAlchemyError as error:
                    log.warning("heartbeat: %s", str(error).splitlines()[0])

    def stop(self) -> None:
        """Stop beating and remove our row (after the commands addressed to us are failed)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=5)
        try:
            with self.engine.begin() as conn:
                for command in commands.of_agents(conn, [self.agent_id]):
                    commands.fail(conn, command.id, f"agent {self.agent_id} stopped before carrying it out",
                                  "agent stopped", only_if=command.status)
                agents.remove(conn, self.agent_id)
        finally:
            self.engine.dispose()
            self.admin = None  # the AdminClient has no close(): dropping it ends its threads


class SummaryFolder:
    """The running summaries' folder (fold.fold_lab): every lab's queued changes, on a
    thread and a connection of its own, so a long build (a lab migrated with millions of records)
    never delays a command. A read is exact without it: it keeps the reads' share of work small."""

    # A read recomputes every key still queued, so under a load the queue's length is what each
    # panel pays: while folds find changes, the next one comes sooner. At rest, one look (a single
    # statement over every lab) every half second.
    BUSY_EVERY = 0.1
    IDLE_EVERY = 0.5
    # The folded queues' dead rows, vacuumed at most once a second per lab, quickly and without
    # ever waiting (fold.vacuum_queues). At most every ten seconds, the upkeep: the
    # queues vacuumed thoroughly (the queue's index, and its table's emptied end given back) and
    # the tables that outgrew their statistics analyzed (fold.analyze_grown_tables), on
    # a thread and a connection of its own: that vacuum waits up to five seconds for the queue's
    # lock while panels read it, and the folder stood still in that wait while the queue grew
    # (40,000 changes under a load).
    VACUUM_EVERY = 1.0
    THOROUGH_VACUUM_EVERY = 10.0

    def __init__(self, database_url: str):
        self.database_url = database_url
        self.conn: psycopg.Connection | None = None
        self.folds = 0
        self._to_vacuum: dict[str, set[str]] = {}  # per lab, the schemas folded since its last vacuum
        self._vacuumed_at: dict[str, float] = {}
        self._to_vacuum_thoroughly: set[str] = set()  # the schemas vacuumed since the last thorough one
        self._thoroughly_vacuumed_at = time.monotonic()  # the first, ten seconds in
        self._thorough_vacuum: threading.Thread | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="summary folder", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def fold_all(self) -> int:
        """Fold every lab with something queued; the number of labs folded."""
        if self.conn is None or self.conn.closed:
            self.conn = connect(self.database_url, autocommit=True, application_name="lab agent summary folder")
        try:
            waiting = fold.labs_to_fold(self.conn)
        except fold.FOLD_GAVE_WAY:  # a schema dropped while we looked: look again next time
            return 0
        folded = 0
        for lab_schema in waiting:
            try:
                done = fold.fold_lab(self.conn, lab_schema)
            except fold.FOLD_GAVE_WAY as error:  # a reset, a lock: folded again next time
                log.info("summary folder: %s gave way: %s", lab_schema, str(error).splitlines()[0])
                continue
            if done is None:  # another process is folding it
                continue
            folded += 1
            self._to_vacuum.setdefault(lab_schema, set()).update(
                schema for schema, what in done.items() if what != "current")
        self.folds += folded
        self._vacuum_due()
        return folded

    def _vacuum_due(self) -> None:
        now = time.monotonic()
        for lab_schema, schemas in list(self._to_vacuum.items()):
            if now - self._vacuumed_at.get(lab_schema, 0.0) < self.VACUUM_EVERY:
                continue
            try:
                fold.vacuum_queues(self.conn, sorted(schemas), thorough=False)
            except fold.FOLD_GAVE_WAY:  # the lab was dropped meanwhile: nothing to vacuum
                pass
            del self._to_vacuum[lab_schema]
            self._vacuumed_at[lab_schema] = now
            self._to_vacuum_thoroughly.update(schemas)
        self._vacuum_thoroughly_due(now)

    def _vacuum_thoroughly_due(self, now: float) -> None:
        if not self._to_vacuum_thoroughly or now - self._thoroughly_vacuumed_at < self.THOROUGH_VACUUM_EVERY:
            return
        if self._thorough_vacuum is not None and self._thorough_vacuum.is_alive():
            return  # the last one still waits for a queue's lock: these schemas wait their turn
        schemas = sorted(self._to_vacuum_thoroughly)
        self._to_vacuum_thoroughly.clear()
        self._thoroughly_vacuumed_at = now
        self._thorough_vacuum = threading.Thread(target=self._vacuum_thoroughly, args=(schemas,),
                                                 name="summary upkeep", daemon=True)
        self._thorough_vacuum.start()

    def _vacuum_thoroughly(self, schemas: list[str]) -> None:
        try:
            with connect(self.database_url, autocommit=True, application_name="lab agent queue vacuum") as conn:
                for lab_schema in schemas:  # one at a time: a schema dropped meanwhile spoils no other's
                    try:
                        fold.vacuum_queues(conn, [lab_schema], thorough=True)
                        fold.analyze_grown_tables(conn, [lab_schema])
                    except fold.FOLD_GAVE_WAY:
                        pass
        except psycopg.Error as error:  # PostgreSQL restarting: done next time
            log.warning("summary queues' upkeep: %s", str(error).splitlines()[0])

    def _loop(self) -> None:
        wait = self.IDLE_EVERY
        while not self._stop.wait(wait):
            wait = self.IDLE_EVERY
            try:
                if self.fold_all():
                    wait = self.BUSY_EVERY
            except psycopg.OperationalError as error:  # PostgreSQL restarting: fold again when it is back
                log.warning("summary folder: %s", str(error).splitlines()[0])
                self._close()
            except Exception:  # never let the folder stop: say why, fold again next time
                log.exception("summary folder")
                self._close()

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        if self._thorough_vacuum is not None:
            self._thorough_vacuum.join(timeout=30)
        self._close()


class Housekeeping:
    """Offset snapshots and scheduled TTL, on the agent's main connection, between commands."""

    def __init__(self, conn: psycopg.Connection):
        self.conn = conn
        self._last_tick = 0.0
        self._ttl_runs: dict[str, float] = {}
        self._offsets_read: dict[str, float] = {}  # lab -> when its offsets were last read (monotonic)

    def due(self) -> bool:
        now = time.monotonic()
        if now - self._last_tick < TICK:
            return False
        self._last_tick = now
        return True

    def run(self, admin, broker_ok: bool) -> None:
        if not broker_ok:
            return
        moved = []
        for lab in self.known_labs():
            try:
                self.scheduled_ttl(lab)
                if self.offsets_may_have_moved(lab) \
                        or time.monotonic() - self._offsets_read.get(lab.name, 0.0) >= IDLE_SNAPSHOT_SECONDS:
                    moved.append(lab)
            except psycopg.Error as problem:
                log.warning("lab %s: %s", lab.name, problem)
                self._rollback()
        try:
            snapshot_offsets_of(self.conn, admin, moved)
            now = time.monotonic()
            self._offsets_read.update((lab.name, now) for lab in moved)
        except KafkaException as problem:  # the broker stopped answering: the probe reports it
            log.warning("committed offsets: %s", problem)
        except psycopg.Error as problem:
            log.warning("committed offsets: %s", problem)
            self._rollback()

    def _rollback(self) -> None:
        if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            self.conn.rollback()

    def known_labs(self) -> list[Lab]:
        """Every lab of the database (a lane's schema names its lab: each lab once)."""
        return list(dict.fromkeys(Lab.of_schema(name) for name in schema.every_lab_schema(self.conn.execute)))

    def offsets_may_have_moved(self, lab: Lab) -> bool:
        """Committed offsets move by consumers' commits (and by resets, which snapshot themselves),
        and, with no consumer at all, by the broker: Apache Kafka deletes an empty group's offsets
        after offsets.retention.minutes. Snapshot a lab whose consumers reported lately, a group
        never snapshotted (and, run() adds, any lab's groups at least every IDLE_SNAPSHOT_SECONDS)."""
        return consumer_groups.offsets_may_have_moved(self.conn.execute, lab.name, lab.schema)

    def scheduled_ttl(self, lab: Lab) -> None:
        rows = dict(self.conn.execute(f'SELECT key, value FROM {quoted(lab.schema)}.settings '
                                      "WHERE key IN ('ttl_seconds', 'ttl_schedule_seconds')").fetchall())
        every = rows.get("ttl_schedule_seconds")
        if not every:
            return
        if time.monotonic() - self._ttl_runs.get(lab.name, 0.0) < float(every):
            return
        self._ttl_runs[lab.name] = time.monotonic()
        seconds = float(rows.get("ttl_seconds", DEFAULT_TTL_SECONDS))
        # Every lane of the lab keeps its own dedup tables: the schedule cleans them all, like the
        # on-demand cleanup (ops.ttl_cleanup).
        lanes = schema.lab_and_lane_schemas(self.conn.execute, lab.schema)
        with self.conn.transaction():
            deleted = {}
            for lane_schema in lanes:
                schema.enter_psycopg(self.conn, lane_schema)
                deleted[lane_schema] = ttl.cleanup(self.conn.execute, seconds)
            schema.enter_psycopg(self.conn, lab.schema)
            total = sum(n for counts in deleted.values() for n in counts.values())
            if total:
                timeline.record(self.conn.execute, "ttl", f"scheduled TTL cleanup (older than {seconds:g}s) deleted "
                                f"{total} key(s)", deleted=deleted)


def snapshot_offsets(conn: psycopg.Connection, admin, lab: Lab) -> None:
    """Every group's committed offsets, as Kafka has them now, into the lab's ``group_offsets``;
    KafkaException if the broker could not answer for one of them (a command fails with it)."""
    snapshot_offsets_of(conn, admin, [lab], strict=True)


def snapshot_offsets_of(conn: psycopg.Connection, admin, labs: list[Lab], strict: bool = False) -> None:
    """:func:`snapshot_offsets` of many labs, every group's request in flight together (a class of
    thirty labs, each asked in turn, took minutes a round, and a guided run's wait for the committed
    offsets gave up first). A group whose answer failed keeps its last snapshot, and is said."""
    # A group a recovery moved commits under its new Kafka id; the lab keeps its own id for it.
    groups = {lab: consumer_groups.kafka_group_ids(conn.execute, lab.schema) for lab in labs}
    answers = committed_offsets_of(admin, [(kafka_group_id, lab.topic) for lab, rows in groups.items()
                                           for _, kafka_group_id in rows])
    for lab, rows in groups.items():
        # Only what moved is written: an unchanged snapshot, written every second for every active
        # lab, announced the lab on the change feed (a notifying commit: PostgreSQL's cluster-wide
        # notify lock, every listener woken) and queued a summary mark, thirty times a second in a
        # class of thirty, with nothing changed.
        kept = {(group_id, partition): committed for group_id, partition, committed in conn.execute(
            f'SELECT group_id, partition, committed FROM {quoted(lab.schema)}.group_offsets').fetchall()}
        moved = []
        for group_id, kafka_group_id in rows:
            offsets = answers[(kafka_group_id, lab.topic)]
            if isinstance(offsets, KafkaException):
                if strict:
                    raise offsets
                log.warning("lab %s, group %s: %s", lab.name, group_id, offsets)
                continue
            moved += [(group_id, partition, committed) for partition, committed in offsets.items()
                      if (group_id, partition) not in kept or kept[(group_id, partition)] != committed]
        if not moved:
            continue
        with conn.transaction():
            for group_id, partition, committed in moved:
                conn.execute(
                    f'INSERT INTO {quoted(lab.schema)}.group_offsets (group_id, partition, committed) '
                    "VALUES (%s, %s, %s) ON CONFLICT (group_id, partition) DO UPDATE SET "
                    "committed = EXCLUDED.committed, read_at = now()", [group_id, partition, committed])
