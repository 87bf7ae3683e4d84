"""The agent's main loop: reap children, housekeeping, wake the command workers; repeat.

Commands are claimed and carried out by the agent's command workers (workers.py,
LAB_AGENT_COMMAND_WORKERS threads), so a slow command of one lab neither holds another lab's nor
this loop's tick. ``python -m webapp.agent`` (or ``flask --app app lab agent``). Its id is unique
per process start (``host:pid:<6 hex>``). First SIGTERM (or Ctrl-C): finish the commands being
carried out, stop the consumers, leave. Second: exit at once.
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import sys
import threading
from typing import Any, Mapping

import psycopg
from confluent_kafka import KafkaException
from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain import commands, verbs
from ..domain.lab import Lab
from ..kafka import producer
from ..kafka.admin import admin_client
from ..settings import auto_recover_groups, load_config
from ..store import command_channel, group_health, schema, timeline
from ..store import commands as command_rows
from ..store import consumers as consumer_rows
from ..store.commands import CHANNEL
from ..store.connection import connect, sqlalchemy_url, with_reconnect_backoff
from ..store.labs import ensure_control_schema
from . import chaos_runner, queue
from .dedup_sampler import DedupSampler
from .handlers import HANDLERS, Handler
from .load import RUNS as LOAD_RUNS
from .notify_service import URL_VARIABLE as NOTIFY_URL
from .notify_service import notification_service
from .periodic import Heartbeat, Housekeeping, SummaryFolder
from .processes import Pool, Sidecar
from .relays import RelayKeeper
from .warmup import RUNS as WARMUP_RUNS
from .workers import CommandWorkers

log = logging.getLogger("idempotency_lab.agent")

DEFAULT_COMMAND_WORKERS = 8


def new_agent_id(host: str, pid: int) -> str:
    return f"{host}:{pid}:{secrets.token_hex(3)}"


class Agent:
    def __init__(self, database_url: str, bootstrap_servers: str, producer_bootstrap_servers: str | None = None,
                 data_dir: str = ".lab", log_to_stdout: bool = False, auto_recover: bool = False,
                 command_workers: int = DEFAULT_COMMAND_WORKERS):
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.id = new_agent_id(self.host, self.pid)
        self.stopping = False
        # Each command worker may hold a pooled connection for its claim and result, besides the
        # main loop's, the guided runs' and the handlers' short reads.
        self.engine = create_engine(sqlalchemy_url(database_url), pool_size=2 + command_workers, max_overflow=4,
                                    pool_pre_ping=True, connect_args={"connect_timeout": 3})
        with self.engine.begin() as conn:
            ensure_control_schema(conn)
        # psycopg for LISTEN, the producer's journal and the lab-schema work; SQLAlchemy for the control plane.
        self.database_url = database_url
        self.conn = connect(database_url, autocommit=True)
        self.admin = admin_client(bootstrap_servers)
        # The lab's producer may reach the broker through the lost-ack fault proxy (`make run`).
        self.producer_bootstrap_servers = producer_bootstrap_servers or bootstrap_servers
        self.publisher = producer.Publisher(self.producer_bootstrap_servers)
        self.pool = Pool(database_url, bootstrap_servers, data_dir, log_to_stdout)
        self.heartbeat = Heartbeat(database_url, bootstrap_servers, self.id, self.host, self.pid)
        self.housekeeping = Housekeeping(self.conn)
        self.auto_recover = auto_recover  # LAB_AUTO_RECOVER_GROUPS: recover stalled groups without being asked
        # Dedup tables at scale: sizes and probe insert latency, on a thread of its own.
        self.dedup_sampler = DedupSampler(database_url, loading=LOAD_RUNS.labs)
        # The verdict's running summaries (webapp/summary/fold.py), folded on a thread of their own.
        self.summary_folder = SummaryFolder(database_url)
        # The log mirror (the lab's ground truth: every record of every lab topic), kept running.
        self.log_mirror = Sidecar("log reader", "webapp.logreader",
                                  {**os.environ, "DATABASE_URL": database_url, "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers},
                                  self.pool.log_dir, log_to_stdout, holdable=True)
        # The notification service (the external side effect): a sidecar too, unless LAB_NOTIFY_URL names one.
        self.notify_service, self.pool.env[NOTIFY_URL] = notification_service(database_url, self.pool.log_dir,
                                                                             log_to_stdout)
        # One outbox relay per lab that asked for one (webapp/outbox), through the lab's producer address.
        self.relays = RelayKeeper(self.engine, {**os.environ, "DATABASE_URL": database_url,
                                                "KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
                                                "KAFKA_PRODUCER_BOOTSTRAP_SERVERS": self.producer_bootstrap_servers},
                                  self.pool.log_dir, log_to_stdout, self.id)
        # The commands, carried out on threads of their own: the tick below never waits for them.
        self.workers = CommandWorkers(self, command_workers)
        # The tick and the workers' kill and stop handlers reap: each exit is recorded once.
        self._reaping = threading.Lock()
        self._recoveries: dict[tuple[str, str], int] = {}  # (lab, group) -> its automatic recovery's command

    # --- what handlers use ----------------------------------------------------------------------

    def say(self, lab: Lab, kind: str, summary: str, **detail: Any) -> None:
        """A line on the lab's timeline, on a pooled connection: the reaping that says it runs on the
        main loop's thread or a worker's, and the main loop's own connection is its alone."""
        with self.engine.begin() as conn:
            schema.enter(conn, lab.schema)
            timeline.record(conn.exec_driver_sql, kind, summary, **detail)

    def spawn(self, lab: Lab, consumer_id: int, name: str) -> int:
        process = self.pool.spawn(lab.name, consumer_id, name)
        with self.engine.begin() as conn:
            consumer_rows.spawned(conn, consumer_id, process.pid)
        return process.pid

    def reap_children(self) -> None:
        """Record how each exited consumer process ended."""
        with self._reaping:
            self._reap_children()

    def _reap_children(self) -> None:
        for consumer_id, code in self.pool.reap():
            with self.engine.begin() as conn:
                row = consumer_rows.get(conn, consumer_id)
                if row is not None:
                    if code == -signal.SIGKILL:
                        state = "crashed" if row.state == "crashed" else "killed"
                    elif code in (0, -signal.SIGTERM):
                        state = "stopped"
                    else:
                        state = "failed"
                    consumer_rows.set_state(conn, consumer_id, state, code)
                    consumer_rows.count_from_the_ledger(conn, consumer_id)
            # Only once written: a kill carried out while PostgreSQL restarts is recorded on a later
            # tick, instead of a dead process shown running (and holding its partitions) for good.
            self.pool.forget(consumer_id)
            if row is None:
                continue
            lab = Lab(row.lab)
            if state == "killed":
                self.say(lab, "killed", f"{row.name} killed (SIGKILL): no commit, no graceful leave; "
                         "its partitions move after the session timeout", consumer=row.name)
            elif state == "failed":
                self.say(lab, "error", f"{row.name} exited with code {code}; "
                         f"{self.pool.log_hint(row.lab, consumer_id)}", consumer=row.name)

    # --- the loop -------------------------------------------------------------------------------

    def tick(self) -> None:
        if not self.housekeeping.due():
            return
        self.log_mirror.ensure()
        if self.notify_service is not None:
            self.notify_service.ensure()
        self.relays.tick()
        self.reap_children()
        self.housekeeping.run(self.admin, broker_ok=self.heartbeat.kafka_error is None)
        self.watch_groups()

    def watch_groups(self) -> None:
        """Each lab's groups: a stall and a recovery written once to the timeline (store/group_health.py);
        with automatic recovery on, a group stalled past its threshold recovered (at most once per
        threshold, so a broker that refuses the group again is not hammered). The recovery is a
        command of this agent's, carried out by a worker in the lab's turn: it restarts members and
        waits for their assignment, which the tick must not wait for."""
        recovering = self.workers.labs_carrying_out(verbs.GROUP_RECOVER)
        for lab in self.housekeeping.known_labs():
            if lab.name in recovering:
                # Its members are being restarted, the group perhaps moved: it is recovering, not
                # stalled again. Its next state is written once the recovery has ended.
                continue
            try:
                stalled = group_health.write_transitions(self.conn.execute, lab)
                for health, row in stalled if self.auto_recover else ():
                    started = row["recovery_started_at"]
                    if started is not None and (row["now"] - started).total_seconds() < health.stall_after:
                        continue
                    self.recover_automatically(lab, health.group_id)
            except (psycopg.Error, SQLAlchemyError, KafkaException, LookupError, ValueError) as problem:
                # A lab dropped meanwhile, PostgreSQL or the broker away: looked at again next tick.
                log.warning("lab %s: group health: %s", lab.name, str(problem).splitlines()[0] if str(problem) else problem)
                if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    self.conn.rollback()

    def recover_automatically(self, lab: Lab, group_id: str) -> None:
        """Enqueue the group's recovery for this agent, unless one is still queued or running."""
        key = (lab.name, group_id)
        earlier = self._recoveries.get(key)
        if earlier is not None:
            with self.engine.connect() as conn:
                if command_rows.outcome(conn, earlier)[0] in (command_rows.PENDING, command_rows.RUNNING):
                    return
        recovery = commands.GroupRecover(group=group_id, automatic=True)
        self._recoveries[key] = command_channel.enqueue(self.engine, lab.name, verbs.GROUP_RECOVER,
                                                        commands.encode(verbs.GROUP_RECOVER, recovery), self.id)

    def run(self) -> int:
        try:
            self.heartbeat.start()
            self.dedup_sampler.start()
            self.summary_folder.start()
            self.log_mirror.ensure()
            if self.notify_service is not None:
                self.notify_service.ensure(now=True)
            self.conn.execute(f"LISTEN {CHANNEL}")
            self.workers.start()
            log.info("lab agent %s ready (%d command workers)", self.id, self.workers.count)
            while not self.stopping:
                try:
                    # The workers carry out the commands: the reaping of exited consumers, the
                    # committed offsets and group health go on however long a command takes
                    # (bench/classroom.py at 30: a crash not shown while one thread served a reset).
                    self.tick()
                    for _ in self.conn.notifies(timeout=0.25, stop_after=1):
                        self.workers.wake()
                except (psycopg.OperationalError, SQLAlchemyError) as error:
                    # PostgreSQL restarting: the agent waits for it and carries on.
                    self.reconnect(error)
        finally:
            self.shutdown()
        return 0

    def reconnect(self, error: Exception) -> None:
        """PostgreSQL went away (a restart): wait until it answers again, then listen again. The
        heartbeat thread and the consumers reconnect on their own; a command whose result could not
        be written stays running under our lease until it is carried out again or withdrawn."""
        log.warning("database connection lost (%s); waiting for PostgreSQL", str(error).splitlines()[0])
        conn = with_reconnect_backoff(self._open_listening, going_on=lambda: not self.stopping)
        if conn is None:
            return  # stopping
        broken, self.conn = self.conn, conn
        self.housekeeping.conn = conn
        broken.close()
        self.fail_interrupted()
        self.workers.wake(every=True)  # what was announced while the connection was down was told to nobody
        log.info("database connection back")

    def _open_listening(self) -> psycopg.Connection:
        """A new connection listening on the commands' channel."""
        conn = connect(self.database_url, autocommit=True)
        try:
            conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.OperationalError:
            conn.close()
            raise
        return conn

    def fail_interrupted(self) -> None:
        """A command still ``running`` under our claim that no worker carries out any more lost its
        result with the connection. Fail it with the reason rather than leave it leased for ever; a
        command a worker still holds is the worker's to end."""
        try:
            held = self.workers.held()
            with self.engine.begin() as conn:
                for command in command_rows.of_agents(conn, [self.id]):
                    if command.status == command_rows.RUNNING and command.id not in held:
                        command_rows.fail(conn, command.id, queue.INTERRUPTED, "interrupted",
                                          only_if=command_rows.RUNNING)
        except SQLAlchemyError as error:
            log.warning("could not fail the interrupted commands: %s", str(error).splitlines()[0])

    def shutdown(self) -> None:
        """Stop the consumers (gracefully, SIGKILL after their deadline) and the log mirror, record
        how each ended, fail what was still addressed to us, remove our row."""
        try:
            busy = self.workers.stop()  # the commands being carried out end first
            if busy:
                log.warning("still carrying out commands at shutdown: %s", ", ".join(busy))
            LOAD_RUNS.stop_all()
            WARMUP_RUNS.stop_all()
            self.dedup_sampler.stop()
            self.summary_folder.stop()
            self.log_mirror.stop()
            self.relays.stop_all()
            chaos_runner.stop_all()
            self.pool.stop_all()
            self.reap_children()
            if self.notify_service is not None:
                self.notify_service.stop()  # after the consumers: one may be waiting for its answer
        finally:
            self.publisher.close()
            self.admin = None  # the AdminClient has no close(): dropping it ends its threads
            self.heartbeat.stop()
            self.conn.close()
            self.engine.dispose()


def main(extra_handlers: Mapping[str, Handler] | None = None) -> int:
    """Run an agent until SIGTERM. ``extra_handlers``: verbs the entry point adds to HANDLERS (guided
    mode's ``scenario.step``, wired by ``python -m webapp.agent``: the agent never imports scenarios)."""
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{os.getpid()}] %(levelname)s %(message)s")
    config = load_config()
    if not config["DATABASE_URL"] or not config["KAFKA_BOOTSTRAP_SERVERS"]:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set (or a lab running in LAB_DATA_DIR)",
              file=sys.stderr)
        return 2
    for verb, handler in (extra_handlers or {}).items():
        HANDLERS.setdefault(verb, handler)
    agent = Agent(config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"],
                  config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"], config["LAB_DATA_DIR"],
                  log_to_stdout=config["LAB_LOG_TO_STDOUT"], auto_recover=auto_recover_groups(config),
                  command_workers=config["LAB_AGENT_COMMAND_WORKERS"])

    def on_term(signum, frame):
        if agent.stopping:
            os._exit(143)
        agent.stopping = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return agent.run()
