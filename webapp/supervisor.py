"""The lab agent: owns the consumer processes on its host and holds the lab's Kafka clients.

``python -m webapp.supervisor``. Web processes never touch Kafka: they write commands to
PostgreSQL (commands.py) and read what the agent and the consumers report there. The agent
- carries out commands: publish, start/stop/kill/freeze/thaw/restart consumers, reset a
  group's offsets, reset a lab;
- reaps its consumer processes and records how each one ended;
- every second: reports itself and the broker's health, and snapshots every group's
  committed offsets into ``group_offsets``; runs scheduled TTL cleanups.
Several agents (one per container) can serve one database: commands about a consumer go to
its owner, the others to whichever agent claims them first.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Iterator

import psycopg
from confluent_kafka import KafkaException
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from . import kafka, producer, strategies, timeline, ttl
from . import commands
from .commands import CHANNEL
from .config import load_config
from .db import CONTROL_SCHEMA, connect, sqlalchemy_url
from .embedded import stop_process
from .labs import Lab, create_database_state, drop_database_state, ensure_control_schema
from .waits import WaitTimeout, wait_until

log = logging.getLogger("idempotency_lab.agent")

TICK = 1.0
STOP_TIMEOUT = 15.0
C = CONTROL_SCHEMA


class CommandRejected(ValueError):
    """A command with bad arguments; the message names the field."""


class Supervisor:
    def __init__(self, database_url: str, bootstrap_servers: str, producer_bootstrap_servers: str | None = None,
                 data_dir: str = ".lab"):
        self.database_url = database_url
        self.bootstrap_servers = bootstrap_servers
        self.id = f"{socket.gethostname()}:{os.getpid()}"
        self.conn = connect(database_url, autocommit=True)
        # SQLAlchemy for the schema DDL (models) and the command channel, shared with the web.
        self.engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
        with self.engine.begin() as conn:
            ensure_control_schema(conn)
        self.admin = kafka.admin_client(bootstrap_servers)
        self.publisher = producer.Publisher(producer_bootstrap_servers or bootstrap_servers)
        self.children: dict[int, subprocess.Popen] = {}  # consumer id -> process
        self.log_dir = Path(data_dir) / "logs"
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.stopping = False
        self._last_tick = 0.0
        self._ttl_runs: dict[str, float] = {}
        self.handlers: dict[str, Callable[[Lab, dict], dict]] = {
            "publish": self.publish,
            "consumer.start": self.start_consumer,
            "consumer.stop": self.stop_consumer,
            "consumer.kill": self.kill_consumer,
            "consumer.freeze": self.freeze_consumer,
            "consumer.thaw": self.thaw_consumer,
            "consumer.restart": self.restart_consumer,
            "group.reset": self.reset_group,
            "lab.reset": self.reset_lab,
            "lab.ensure": self.ensure_lab,
        }

    # --- helpers ---------------------------------------------------------------------------

    @contextmanager
    def in_lab(self, lab: Lab) -> Iterator[None]:
        """A transaction on the agent's connection working in the lab's schema."""
        with self.conn.transaction():
            self.conn.execute("SELECT set_config('search_path', %s, true)", [lab.schema])
            yield

    def say(self, lab: Lab, kind: str, summary: str, **detail: Any) -> None:
        with self.in_lab(lab):
            timeline.record(self.conn.execute, kind, summary, **detail)

    def _consumer_row(self, lab: Lab, args: dict) -> tuple:
        consumer_id = args.get("consumer_id")
        if not isinstance(consumer_id, int):
            raise CommandRejected("consumer_id must be a whole number")
        row = self.conn.execute(f"SELECT id, name, group_id, agent_id, state FROM {C}.consumers "
                                "WHERE id = %s AND lab = %s", [consumer_id, lab.name]).fetchone()
        if row is None:
            raise LookupError(f"no consumer {consumer_id} in lab {lab.name}")
        if row[3] != self.id:
            raise CommandRejected(f"consumer {consumer_id} belongs to agent {row[3]}, not {self.id}")
        return row

    def _set_state(self, consumer_id: int, state: str, exit_code: int | None = None) -> None:
        self.conn.execute(f"UPDATE {C}.consumers SET state = %s, exit_code = %s, "
                          "assigned = CASE WHEN %s IN ('killed', 'stopped', 'crashed', 'failed') "
                          "THEN '[]'::jsonb ELSE assigned END WHERE id = %s",
                          [state, exit_code, state, consumer_id])

    # --- commands --------------------------------------------------------------------------

    def ensure_lab(self, lab: Lab, args: dict) -> dict:
        """Create the lab's schema, seed accounts, topics and default group if missing."""
        partitions = int(args.get("partitions") or 3)
        with self.conn.transaction():
            exists = self.conn.execute("SELECT 1 FROM information_schema.schemata WHERE schema_name = %s",
                                       [lab.schema]).fetchone()
        created = kafka.ensure_topics(self.admin, {lab.topic: partitions, lab.dlq_topic: 1})
        if exists is None:
            with self.engine.begin() as conn:
                create_database_state(conn, lab, partitions)
        return {"created_topics": created, "created_schema": exists is None}

    def publish(self, lab: Lab, args: dict) -> dict:
        with self.in_lab(lab):
            try:
                return producer.publish(self.conn, self.publisher, lab, args)
            except producer.PublishError as error:
                raise CommandRejected(str(error)) from None

    def _ensure_group(self, lab: Lab, group: str, strategy: str | None) -> str:
        """The group's id, created with ``strategy`` if new. An existing group keeps its strategy:
        switching it is its own, visible action (every member changes behaviour)."""
        group_id = lab.group_id(group)
        with self.in_lab(lab):
            row = self.conn.execute("SELECT strategy FROM consumer_groups WHERE group_id = %s", [group_id]).fetchone()
            if row is None:
                self.conn.execute("INSERT INTO consumer_groups (group_id, strategy, effects_schema) "
                                  "VALUES (%s, %s, %s)", [group_id, strategy or "none", lab.schema])
            elif strategy is not None and strategy != row[0]:
                raise CommandRejected(f"strategy: group {group_id} uses {row[0]}; switch the group's strategy "
                                      f"first, or start the consumer in another group")
        return group_id

    def start_consumer(self, lab: Lab, args: dict) -> dict:
        group = args.get("group") or "payments"
        strategy = args.get("strategy")
        if strategy is not None:
            try:
                strategies.get(strategy)
            except strategies.UnknownStrategy as error:
                raise CommandRejected(str(error)) from None
        group_id = self._ensure_group(lab, group, strategy)
        name = args.get("name")
        with self.conn.transaction():
            if not name:
                count = self.conn.execute(f"SELECT count(*) FROM {C}.consumers WHERE lab = %s",
                                          [lab.name]).fetchone()[0]
                name = f"c{count + 1}"
            consumer_id = self.conn.execute(
                f"INSERT INTO {C}.consumers (lab, name, group_id, agent_id, state) "
                "VALUES (%s, %s, %s, %s, 'starting') RETURNING id", [lab.name, name, group_id, self.id]).fetchone()[0]
        self._spawn(lab, consumer_id)
        self.say(lab, "started", f"started consumer {name} in group {group_id}", consumer=name, group=group_id)
        return {"consumer_id": consumer_id, "name": name, "group_id": group_id,
                "pid": self.children[consumer_id].pid}

    def _spawn(self, lab: Lab, consumer_id: int) -> None:
        env = {**os.environ, "DATABASE_URL": self.database_url, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers}
        logfile = open(self.log_dir / f"{lab.name}-consumer-{consumer_id}.log", "ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "webapp.consumer", "--lab", lab.name, "--consumer-id", str(consumer_id)],
            env=env, stdout=logfile, stderr=subprocess.STDOUT, start_new_session=True,
            cwd=Path(__file__).resolve().parent.parent)
        logfile.close()
        self.children[consumer_id] = process
        self.conn.execute(f"UPDATE {C}.consumers SET pid = %s, state = 'starting', exit_code = NULL, "
                          "heartbeat_at = NULL WHERE id = %s", [process.pid, consumer_id])

    def _process(self, consumer_id: int) -> subprocess.Popen:
        process = self.children.get(consumer_id)
        if process is None or process.poll() is not None:
            raise CommandRejected(f"consumer {consumer_id} is not running")
        return process

    def kill_consumer(self, lab: Lab, args: dict) -> dict:
        _, name, group_id, _, _ = self._consumer_row(lab, args)
        process = self._process(args["consumer_id"])
        process.kill()  # SIGKILL: no commit, no group leave, even when frozen
        process.wait(timeout=10)
        self._reap()
        return {"consumer_id": args["consumer_id"], "state": "killed"}

    def freeze_consumer(self, lab: Lab, args: dict) -> dict:
        _, name, group_id, _, _ = self._consumer_row(lab, args)
        self._process(args["consumer_id"]).send_signal(signal.SIGSTOP)
        self._set_state(args["consumer_id"], "frozen")
        self.say(lab, "frozen", f"{name} frozen (SIGSTOP): no heartbeats, no progress", consumer=name)
        return {"consumer_id": args["consumer_id"], "state": "frozen"}

    def thaw_consumer(self, lab: Lab, args: dict) -> dict:
        _, name, group_id, _, _ = self._consumer_row(lab, args)
        self._process(args["consumer_id"]).send_signal(signal.SIGCONT)
        self._set_state(args["consumer_id"], "running")
        self.say(lab, "thawed", f"{name} thawed (SIGCONT): it carries on where it stopped", consumer=name)
        return {"consumer_id": args["consumer_id"], "state": "running"}

    def _stop_process(self, consumer_id: int) -> None:
        process = self.children.get(consumer_id)
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)  # a frozen process must run to hear SIGTERM
        stop_process(process, signal.SIGTERM, STOP_TIMEOUT)

    def stop_consumer(self, lab: Lab, args: dict) -> dict:
        self._consumer_row(lab, args)
        self._stop_process(args["consumer_id"])
        self._reap()
        return {"consumer_id": args["consumer_id"], "state": "stopped"}

    def restart_consumer(self, lab: Lab, args: dict) -> dict:
        _, name, group_id, _, _ = self._consumer_row(lab, args)
        self._stop_process(args["consumer_id"])
        self._reap()
        self._spawn(lab, args["consumer_id"])
        self.say(lab, "started", f"restarted consumer {name}", consumer=name, group=group_id)
        return {"consumer_id": args["consumer_id"], "pid": self.children[args["consumer_id"]].pid}

    def _group_consumers(self, lab: Lab, group_id: str) -> list[tuple[int, str, str]]:
        return self.conn.execute(
            f"SELECT id, agent_id, state FROM {C}.consumers WHERE lab = %s AND group_id = %s "
            "AND state NOT IN ('killed', 'stopped', 'crashed', 'failed')", [lab.name, group_id]).fetchall()

    def _on_own_or_remote(self, lab: Lab, consumer_id: int, agent_id: str, verb: str) -> None:
        """Carry out a consumer command here, or through its owning agent and wait."""
        if agent_id == self.id:
            self.handlers[verb](lab, {"consumer_id": consumer_id})
            return
        command_id = commands.enqueue(self.engine, lab.name, verb, {"consumer_id": consumer_id}, agent_id)
        commands.wait_for(self.engine, command_id, timeout=STOP_TIMEOUT + 10)

    def reset_group(self, lab: Lab, args: dict) -> dict:
        """Stop the group's consumers, move its committed offsets, restart them."""
        group_id = lab.group_id(str(args.get("group") or ""))
        try:
            reset = kafka.OffsetReset(
                mode=args.get("mode", "earliest"),
                offsets={int(p): int(o) for p, o in (args.get("offsets") or {}).items()} or None,
                back=args.get("back"),
                timestamp=_parse_time(args.get("timestamp")))
        except (TypeError, ValueError) as error:
            raise CommandRejected(str(error)) from None
        exists = self.conn.execute(f'SELECT 1 FROM "{lab.schema}".consumer_groups WHERE group_id = %s',
                                   [group_id]).fetchone()
        if exists is None:
            raise LookupError(f"no group {group_id} in lab {lab.name}")
        members = self._group_consumers(lab, group_id)
        for consumer_id, agent_id, _ in members:
            self._on_own_or_remote(lab, consumer_id, agent_id, "consumer.stop")
        self.say(lab, "offsets-reset", f"stopped {len(members)} consumer(s) of {group_id}: Kafka moves a "
                 "group's offsets only while the group is empty", group=group_id)
        try:
            targets = kafka.target_offsets(self.admin, group_id, lab.topic, reset)
        except ValueError as error:
            raise CommandRejected(str(error)) from None
        # A killed member stays in the group until its session times out: retry until empty.
        last_error: list[str] = []

        def altered() -> bool:
            try:
                kafka.alter_offsets(self.admin, group_id, lab.topic, targets)
                return True
            except KafkaException as error:
                last_error[:] = [str(error)]
                return False
        try:
            wait_until(altered, timeout=20, interval=0.5,
                       message=lambda: f"group {group_id} did not become empty: {last_error}")
        except WaitTimeout as error:
            raise CommandRejected(str(error)) from None
        self.say(lab, "offsets-reset", f"{group_id} reset ({reset.mode}) to "
                 + ", ".join(f"p{p}@{o}" for p, o in sorted(targets.items())), group=group_id,
                 offsets={str(p): o for p, o in targets.items()})
        self.snapshot_offsets(lab)
        for consumer_id, agent_id, _ in members:
            self._on_own_or_remote(lab, consumer_id, agent_id, "consumer.restart")
        return {"group_id": group_id, "offsets": {str(p): o for p, o in targets.items()},
                "restarted": [m[0] for m in members]}

    def reset_lab(self, lab: Lab, args: dict) -> dict:
        """Stop the lab's consumers, delete its topics and schemas, start it fresh."""
        rows = self.conn.execute(f"SELECT id, agent_id FROM {C}.consumers WHERE lab = %s "
                                 "AND state NOT IN ('killed', 'stopped', 'crashed', 'failed')", [lab.name]).fetchall()
        for consumer_id, agent_id in rows:
            self._on_own_or_remote(lab, consumer_id, agent_id, "consumer.stop")
        kafka.delete_topics(self.admin, [lab.topic, lab.dlq_topic])
        with self.engine.begin() as conn:
            drop_database_state(conn, lab)
        for consumer_id, _ in rows:
            self.children.pop(consumer_id, None)
        partitions = int(args.get("partitions") or 3)
        # Deleting a topic completes asynchronously on some brokers: retry creation until it sticks.
        wait_until(lambda: self._recreate_topics(lab, partitions), timeout=20, interval=0.2,
                   message=f"could not recreate {lab.topic}")
        result = self.ensure_lab(lab, {"partitions": partitions})
        self.say(lab, "lab", f"lab {lab.name} reset: {partitions} partitions, 5 accounts, no consumers")
        return {"lab": lab.name, "partitions": partitions, **result}

    def _recreate_topics(self, lab: Lab, partitions: int) -> bool:
        try:
            kafka.ensure_topics(self.admin, {lab.topic: partitions, lab.dlq_topic: 1})
            return kafka.partition_count(self.admin, lab.topic) == partitions
        except KafkaException:
            return False

    # --- the loop --------------------------------------------------------------------------

    def claim(self) -> tuple[int, str, str, dict] | None:
        return self.conn.execute(
            f"UPDATE {C}.commands SET status = 'running' WHERE id = ("
            f"  SELECT id FROM {C}.commands WHERE status = 'pending' AND (agent_id IS NULL OR agent_id = %s)"
            "   ORDER BY id FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING id, lab, verb, args", [self.id]).fetchone()

    def carry_out(self, command: tuple[int, str, str, dict]) -> None:
        command_id, lab_name, verb, args = command
        try:
            handler = self.handlers.get(verb)
            if handler is None:
                raise CommandRejected(f"unknown command {verb!r}")
            result = handler(Lab(lab_name), args)
            self.conn.execute(f"UPDATE {C}.commands SET status = 'done', result = %s, finished_at = now() "
                              "WHERE id = %s", [json.dumps(result, default=str), command_id])
        except (CommandRejected, LookupError, ValueError, KafkaException, WaitTimeout, psycopg.Error) as error:
            kind = "not found" if isinstance(error, LookupError) else "rejected"
            log.warning("command %s %s %s: %s", command_id, verb, kind, error)
            if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                self.conn.rollback()
            self.conn.execute(f"UPDATE {C}.commands SET status = 'failed', error = %s, result = %s, "
                              "finished_at = now() WHERE id = %s",
                              [str(error), json.dumps({"kind": kind}), command_id])

    def _reap(self) -> None:
        for consumer_id, process in list(self.children.items()):
            code = process.poll()
            if code is None:
                continue
            del self.children[consumer_id]
            row = self.conn.execute(f"SELECT lab, name, state FROM {C}.consumers WHERE id = %s",
                                    [consumer_id]).fetchone()
            if row is None:
                continue
            lab_name, name, reported = row
            if code == -signal.SIGKILL:
                state = "crashed" if reported == "crashed" else "killed"
            elif code in (0, -signal.SIGTERM):
                state = "stopped"
            else:
                state = "failed"
            self._set_state(consumer_id, state, code)
            if state == "killed":
                self.say(Lab(lab_name), "killed", f"{name} killed (SIGKILL): no commit, no graceful leave; "
                         "its partitions move after the session timeout", consumer=name)
            elif state == "failed":
                self.say(Lab(lab_name), "error", f"{name} exited with code {code}; see its log", consumer=name)

    def tick(self) -> None:
        """Once a second: report, reap, snapshot offsets, scheduled TTL."""
        now = time.monotonic()
        if now - self._last_tick < TICK:
            return
        self._last_tick = now
        self._reap()
        error = kafka.broker_error(self.admin, timeout=1.5)
        self.conn.execute(
            f"INSERT INTO {C}.agents (id, host, pid, kafka_ok, kafka_error) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (id) DO UPDATE SET heartbeat_at = now(), kafka_ok = EXCLUDED.kafka_ok, "
            "kafka_error = EXCLUDED.kafka_error", [self.id, socket.gethostname(), os.getpid(), error is None, error])
        if error is not None:
            return
        for lab in self.known_labs():
            try:
                self.scheduled_ttl(lab)
                if self.offsets_may_have_moved(lab):
                    self.snapshot_offsets(lab)
            except KafkaException as problem:
                # The broker stopped answering mid-round: stop here, the next tick's check reports it.
                log.warning("lab %s: %s", lab.name, problem)
                break
            except psycopg.Error as problem:
                log.warning("lab %s: %s", lab.name, problem)
                if self.conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    self.conn.rollback()

    def offsets_may_have_moved(self, lab: Lab) -> bool:
        """Committed offsets move only by consumers' commits (and by resets, which snapshot
        themselves): snapshot a lab whose consumers reported lately, or a group never snapshotted."""
        return self.conn.execute(
            f"SELECT EXISTS (SELECT 1 FROM {C}.consumers WHERE lab = %s AND heartbeat_at > now() - interval '30 seconds')"
            f' OR EXISTS (SELECT 1 FROM "{lab.schema}".consumer_groups g WHERE NOT EXISTS ('
            f'   SELECT 1 FROM "{lab.schema}".group_offsets o WHERE o.group_id = g.group_id))',
            [lab.name]).fetchone()[0]

    def known_labs(self) -> list[Lab]:
        schemas = self.conn.execute(
            "SELECT table_schema FROM information_schema.tables WHERE table_name = 'consumer_groups' "
            "AND table_schema LIKE 'lab\\_%%' AND table_schema NOT LIKE '%%\\_\\_%%'").fetchall()
        return [Lab(schema[4:]) for (schema,) in schemas]

    def snapshot_offsets(self, lab: Lab) -> None:
        groups = [g for (g,) in self.conn.execute(f'SELECT group_id FROM "{lab.schema}".consumer_groups')]
        for group_id in groups:
            offsets = kafka.committed_offsets(self.admin, group_id, lab.topic)
            with self.conn.transaction():
                for partition, committed in offsets.items():
                    self.conn.execute(
                        f'INSERT INTO "{lab.schema}".group_offsets (group_id, partition, committed) '
                        "VALUES (%s, %s, %s) ON CONFLICT (group_id, partition) DO UPDATE SET "
                        "committed = EXCLUDED.committed, read_at = now()", [group_id, partition, committed])

    def scheduled_ttl(self, lab: Lab) -> None:
        rows = dict(self.conn.execute(f'SELECT key, value FROM "{lab.schema}".settings '
                                      "WHERE key IN ('ttl_seconds', 'ttl_schedule_seconds')").fetchall())
        every = rows.get("ttl_schedule_seconds")
        if not every:
            return
        last = self._ttl_runs.get(lab.name, 0.0)
        if time.monotonic() - last < float(every):
            return
        self._ttl_runs[lab.name] = time.monotonic()
        seconds = float(rows.get("ttl_seconds", 7 * 24 * 3600))
        with self.in_lab(lab):
            deleted = ttl.cleanup(self.conn.execute, seconds)
            if any(deleted.values()):
                timeline.record(self.conn.execute, "ttl", f"scheduled TTL cleanup ({seconds:g}s) deleted "
                                + ", ".join(f"{n} from {t}" for t, n in deleted.items()), **deleted)

    def run(self) -> int:
        self.conn.execute(f"LISTEN {CHANNEL}")
        log.info("lab agent %s ready", self.id)
        try:
            while not self.stopping:
                self.tick()
                while not self.stopping and (command := self.claim()) is not None:
                    self.carry_out(command)
                for _ in self.conn.notifies(timeout=0.25, stop_after=1):
                    pass
        finally:
            self.shutdown()
        return 0

    def shutdown(self) -> None:
        for consumer_id in list(self.children):
            self._stop_process(consumer_id)
        self._reap()
        self.publisher.close()
        self.admin = None  # the AdminClient has no close(): dropping it ends its threads
        self.conn.execute(f"DELETE FROM {C}.agents WHERE id = %s", [self.id])
        self.conn.close()
        self.engine.dispose()


def _parse_time(value: Any):
    if value in (None, ""):
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        raise ValueError(f"timestamp must be ISO-8601, got {value!r}") from None


def main() -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{os.getpid()}] %(levelname)s %(message)s")
    config = load_config()
    if not config["DATABASE_URL"] or not config["KAFKA_BOOTSTRAP_SERVERS"]:
        print("DATABASE_URL and KAFKA_BOOTSTRAP_SERVERS must be set (or a lab running in LAB_DATA_DIR)",
              file=sys.stderr)
        return 2
    supervisor = Supervisor(config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"],
                            config["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"], config["LAB_DATA_DIR"])

    def on_term(signum, frame):
        if supervisor.stopping:
            os._exit(143)
        supervisor.stopping = True
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
