"""Consumer throughput: the bare limits, then the lab's consumers end to end, in one run (``make bench``).

    .venv/bin/python bench/throughput.py [--events 5000] [--batch-events 25000] [--batch-size 500]
        [--strategies ...] [--modes per-message batch] [--rounds 3] [--profile]

One embedded PostgreSQL and one embedded Tansu broker, started fresh; every figure below is taken
on them, each case on a fresh lab (its own schema and topic, one partition), with N credits
already in the topic (``--events`` per per-message case, ``--batch-events`` per batch case),
clocked from the first record consumed to the last one applied and committed (the group's first
join, about 3 s on Tansu, is outside every clock).

Bare limits: the ``eventid-atomic`` statements (claim, credit, payment row, ledger row) outside the
lab's consumer, on a connection that, like the lab consumer's effects connection, does not announce
its lab on the live panels' change feed (store/lab_changes.py QUIET_SESSION: a commit that
notifies takes PostgreSQL's cluster-wide notify lock); the figures compare the lab's bookkeeping
with none:
  - PostgreSQL alone, one transaction per event; and batched (the batch statements, 500 a batch)
  - a bare loop: poll -> that transaction -> commit(message), synchronous and asynchronous
  - a bare batch loop: consume(n) -> the batch transaction -> one synchronous commit
Lab consumers: ``python -m webapp.consumer`` processes, as the lab agent starts them, for each
strategy in per-message mode (sync commits; eventid-atomic also async) and in batch mode. Each lab
figure is printed with its ratio to the bare loop of the same shape (per-message sync, per-message
async, batch): ``--rounds`` pairs (default 3), each pair run back to back, which of the two first
alternating from round to round; the medians, and the median of the pairs' ratios; the machine's
1-minute load average as the case began and ended. Under each case, the CPU time per record (user and
system, from /proc) of the loop's process and its PostgreSQL backend, and of the lab consumer's
process and its two backends (control and effects): the work each does per record, which the
machine's load moves far less than the wall clock (waiting to be scheduled costs no CPU).
``--consumer-root`` runs the lab's consumers from another checkout (``git archive HEAD | tar -x -C
DIR``: the same figures before a change).

``--profile`` instead drains N credits with one per-message eventid-atomic consumer under cProfile
and prints where its time goes.
"""
from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from itertools import count
from pathlib import Path
from statistics import median

from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from webapp import strategies
from webapp.agent.processes import stop_process
from webapp.agent.setup import ensure_lab
from webapp.dev.stack import Stack as Services
from webapp.domain import events
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.kafka.admin import admin_client, committed_offsets
from webapp.kafka.config import consumer_config, producer_config
from webapp.store.connection import CONTROL_SCHEMA, connect, sqlalchemy_url
from webapp.store.lab_changes import QUIET_SESSION
from webapp.strategies.base import CREDIT_BALANCE, INSERT_PAYMENT, RECORD_DELIVERY, params
from webapp.strategies.batching import CREDIT_BATCH, INSERT_PAYMENTS_BATCH, RECORD_DELIVERIES_BATCH, Item, columns
from webapp.strategies.eventid_atomic import BATCH_CLAIM, CLAIM

ROOT = Path(__file__).resolve().parent.parent  # this checkout
_labs = count(1)
CONSUMER_ROOT = ROOT  # where `python -m webapp.consumer` runs from (--consumer-root)


class Stack:
    """The run's PostgreSQL and broker (webapp/dev/stack.py, no agent: the bench starts its
    consumers itself), and a fresh lab with N credits in its topic per case."""

    def __init__(self, workdir: Path, events_per_case: int):
        self.workdir = workdir
        self.events = events_per_case  # the credits of the case being measured (batch cases set more)
        self.services = Services(workdir, agent=False)

    def __enter__(self) -> "Stack":
        self.services.start()
        self.url, self.bootstrap = self.services.database_url, self.services.bootstrap_servers
        return self

    def __exit__(self, *exc) -> None:
        self.services.stop()

    def fresh_lab(self) -> Lab:
        """A new lab (schema, topic with one partition, seed accounts) holding N credits."""
        lab = Lab(f"b{os.getpid() % 1000}_{next(_labs)}")
        ensure_lab(self.url, self.bootstrap, lab, partitions=1)
        producer = Producer({**producer_config(self.bootstrap, idempotent=True, client_id=lab.producer_client_id),
                             "linger.ms": 5})
        for n in range(self.events):
            event = events.credit(f"acc-{n % 5 + 1}", 100 + n % 900)
            while True:
                try:
                    producer.produce(lab.topic, value=event.encode(), key=event.key)
                    break
                except BufferError:
                    producer.poll(0.05)
        if producer.flush(60):
            raise RuntimeError("the bench's credits were not all acknowledged")
        return lab


def rate(count_: int, seconds: float) -> float:
    return count_ / seconds if seconds > 0 else float("inf")


@dataclass
class Run:
    """One drain: records per second (wall clock), and the CPU time it took per record, the
    client's process and its PostgreSQL backends together (None where /proc cannot tell)."""
    rate: float
    cpu_ms_per_record: float | None


def cpu_seconds(pids: list[int]) -> float | None:
    """The CPU time (user + system) the processes ``pids`` have used so far, from /proc (Linux)."""
    total = 0
    try:
        for pid in pids:
            # After the command's closing parenthesis, field 3 (state) on: utime and stime are 14 and 15.
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])
    except (OSError, IndexError, ValueError):
        return None
    return total / os.sysconf("SC_CLK_TCK")


def cpu_ms_per_record(before: float | None, after: float | None, records: int) -> float | None:
    if before is None or after is None or records <= 0:
        return None
    return (after - before) * 1000 / records


# --- bare limits --------------------------------------------------------------------------------

def bare_events(stack: Stack) -> list[events.PaymentEvent]:
    return [events.credit(f"acc-{n % 5 + 1}", 100 + n % 900) for n in range(stack.events)]


def ledger_params(event: events.PaymentEvent, offset: int) -> dict:
    return {"group_id": "bench", "consumer": "bare", "partition": 0, "offset": offset, "generation": 1,
            "event_id": event.event_id, "transaction_id": event.transaction_id, "strategy": "eventid-atomic",
            "outcome": "applied", "reason": None}


def bare_connection(stack: Stack, lab: Lab):
    """A connection in ``lab``'s schema that writes as the lab consumer's effects connection does:
    quietly on the change feed."""
    conn = connect(stack.url, schema=lab.schema, autocommit=True)
    conn.execute(QUIET_SESSION)
    return conn


def one_transaction(conn, event: events.PaymentEvent, offset: int) -> None:
    """eventid-atomic's per-message transaction, its statements as the strategy runs them."""
    with conn.transaction():
        if conn.execute(CLAIM, params(event)).rowcount == 1:
            conn.execute(CREDIT_BALANCE, params(event))
            conn.execute(INSERT_PAYMENT, params(event))
        conn.execute(RECORD_DELIVERY, ledger_params(event, offset))


def batch_transaction(conn, batch: list[tuple[events.PaymentEvent, int]]) -> None:
    """eventid-atomic's batch transaction, its batch statements."""
    items = [Item(event, 0, offset) for event, offset in batch]
    with conn.transaction():
        conn.execute(BATCH_CLAIM, {"keys": [i.event.event_id for i in items]}).fetchall()
        arrays = columns(items)
        conn.execute(CREDIT_BATCH, arrays)
        conn.execute(INSERT_PAYMENTS_BATCH, arrays)
        conn.execute(RECORD_DELIVERIES_BATCH, {
            "group_id": "bench", "consumer": "bare", "generation": 1, "strategy": "eventid-atomic",
            "partitions": [0] * len(items), "offsets": [i.offset for i in items], "outcomes": ["applied"] * len(items),
            "reasons": [None] * len(items), "event_ids": arrays["event_ids"],
            "transaction_ids": arrays["transaction_ids"]})


def postgres_alone(stack: Stack, batch_size: int | None) -> float:
    lab = Lab(f"b{os.getpid() % 1000}_{next(_labs)}")
    ensure_lab(stack.url, stack.bootstrap, lab, partitions=1)
    work = bare_events(stack)
    with bare_connection(stack, lab) as conn:
        started = time.perf_counter()
        if batch_size is None:
            for offset, event in enumerate(work):
                one_transaction(conn, event, offset)
        else:
            for start in range(0, len(work), batch_size):
                batch_transaction(conn, [(e, start + i) for i, e in enumerate(work[start:start + batch_size])])
        return rate(len(work), time.perf_counter() - started)


def bare_loop(stack: Stack, asynchronous: bool = False, batch_size: int | None = None) -> Run:
    """poll -> transaction -> commit per message (or consume(n) -> batch transaction -> commit)."""
    lab = stack.fresh_lab()
    acknowledged = {"offset": -1, "error": None}

    def on_commit(error, offsets) -> None:
        if error is None:
            acknowledged["offset"] = max([acknowledged["offset"], *(tp.offset for tp in offsets)])
        else:
            acknowledged["error"] = f"{error.name()}: {error.str()}"
    consumer = Consumer({**consumer_config(stack.bootstrap, f"{lab.name}.bare", client_id="bare"),
                         "on_commit": on_commit})
    consumer.subscribe([lab.topic])
    done, started = 0, None
    try:
        with bare_connection(stack, lab) as conn:
            # This process (the loop and its client's threads) and its PostgreSQL backend.
            pids = [os.getpid(), conn.info.backend_pid]
            while done < stack.events:
                if batch_size is None:
                    message = consumer.poll(0.2)
                    messages = [message] if message is not None else []
                else:
                    messages = consumer.consume(batch_size, timeout=0.1)
                messages = [m for m in messages if not m.error()]
                if not messages:
                    continue
                if started is None:
                    started, cpu_before = time.perf_counter(), cpu_seconds(pids)
                if batch_size is None:
                    message = messages[0]
                    one_transaction(conn, events.decode(message.value()), message.offset())
                    consumer.commit(message=message, asynchronous=asynchronous)
                else:
                    batch_transaction(conn, [(events.decode(m.value()), m.offset()) for m in messages])
                    last = messages[-1]
                    consumer.commit(offsets=[TopicPartition(last.topic(), last.partition(), last.offset() + 1)],
                                    asynchronous=False)
                done += len(messages)
            if asynchronous:
                def answered():  # the last asynchronous commits' answers (served by poll)
                    consumer.poll(0.01)
                    return acknowledged["offset"] >= stack.events
                wait_until(answered, timeout=60, interval=0,
                           message=lambda: "the bare loop's last asynchronous commit was not acknowledged "
                                           f"(last commit error: {acknowledged['error']})")
            return Run(rate(done, time.perf_counter() - started),
                       cpu_ms_per_record(cpu_before, cpu_seconds(pids), done))
    finally:
        consumer.close()


# --- the lab's consumers ---------------------------------------------------------------------------

def lab_consumer(stack: Stack, strategy: str, batch_size: int, commit_mode: str = "sync",
                 profile_to: Path | None = None) -> Run:
    """A consumer process of the lab drains the topic; records per second from its first delivery
    to the last record applied and committed."""
    lab = stack.fresh_lab()
    group_id = lab.group_id("payments")
    engine = create_engine(sqlalchemy_url(stack.url), poolclass=NullPool)
    try:
        with connect(stack.url, autocommit=True) as conn:
            conn.execute(f'UPDATE "{lab.schema}".consumer_groups SET strategy = %s, batch_size = %s, '
                         "batch_max_wait_ms = 100, commit_mode = %s WHERE group_id = %s",
                         [strategy, batch_size, commit_mode, group_id])
            consumer_id = conn.execute(
                f"INSERT INTO {CONTROL_SCHEMA}.consumers (lab, name, group_id, state) "
                "VALUES (%s, 'c1', %s, 'starting') RETURNING id", [lab.name, group_id]).fetchone()[0]
        env = {**os.environ, "DATABASE_URL": stack.url, "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap}
        command = [sys.executable, "-m", "webapp.consumer", "--lab", lab.name, "--consumer-id", str(consumer_id)]
        if profile_to is not None:
            command[1:1] = ["-m", "cProfile", "-o", str(profile_to)]
        log = open(stack.workdir / f"{lab.name}.log", "ab")
        process = subprocess.Popen(command, env=env, cwd=CONSUMER_ROOT, stdout=log, stderr=subprocess.STDOUT)
        admin = admin_client(stack.bootstrap)
        # One connection for the whole watch, opened before the clock starts: a new connection per
        # look (a backend forked 20 times a second) took CPU from the consumer being measured.
        watcher = connect(stack.url, schema=lab.schema, autocommit=True)
        # CPU from the first look that finds a delivery: the consumer's process and its backends
        # (control and effects, named by application_name), and the offset it had reached.
        cpu = {"before": None, "first_offset": None}
        try:
            def drained():
                if process.poll() is not None:
                    raise RuntimeError(f"the consumer exited: {(stack.workdir / f'{lab.name}.log').read_text()[-2000:]}")
                # delivered_at is the transaction's now(), in the server's clock and time zone:
                # the first delivery's age is taken there. Index lookups only (the first delivery,
                # the last offset delivered): a look costs the same at the end as at the start.
                last, first_age = watcher.execute(
                    'SELECT (SELECT "offset" FROM deliveries ORDER BY partition DESC, "offset" DESC LIMIT 1), '
                    "extract(epoch FROM localtimestamp - (SELECT delivered_at FROM deliveries ORDER BY id LIMIT 1))"
                    "::float").fetchone()
                asked = time.monotonic()
                if last is not None and cpu["first_offset"] is None:
                    cpu["pids"] = [process.pid, *(row[0] for row in watcher.execute(
                        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE %s",
                        [f"lab {lab.name} c1 %"]))]
                    cpu["before"], cpu["first_offset"] = cpu_seconds(cpu["pids"]), last
                if last is None or last < stack.events - 1:
                    return None
                committed = committed_offsets(admin, group_id, lab.topic)
                if committed.get(0) != stack.events:
                    return None
                cpu["after"] = cpu_seconds(cpu["pids"])
                return first_age + time.monotonic() - asked
            # Every 10 ms: a batch case drains 5,000 credits in about 0.4 s, and the end is seen at
            # most one interval late.
            seconds = wait_until(drained, timeout=600, interval=0.01,
                                 message=f"{strategy} never drained {stack.events} records")
            return Run(rate(stack.events, seconds), cpu_ms_per_record(
                cpu["before"], cpu["after"], stack.events - 1 - cpu["first_offset"]))
        finally:
            watcher.close()
            stop_process(process, timeout=30)
            log.close()
    finally:
        engine.dispose()


def print_cpu(bares: list[Run], labs: list[Run]) -> None:
    """A case's CPU per record, bare loop and lab: the work each does, whatever the machine's load
    does to the wall clock (a record that waits to be scheduled costs time, not CPU)."""
    pairs = [(bare.cpu_ms_per_record, lab.cpu_ms_per_record) for bare, lab in zip(bares, labs)]
    pairs = [(bare, lab) for bare, lab in pairs if bare is not None and lab is not None]
    if not pairs:
        print(f"{'':4}CPU per record: not measured (no /proc)", flush=True)
        return
    bare, lab = median(b for b, _ in pairs), median(lab for _, lab in pairs)
    each = " ".join(f"{b:.3f}/{lab_:.3f}" for b, lab_ in pairs)
    print(f"{'':4}CPU ms per record, client process and its PostgreSQL backends: bare {bare:.3f}, lab {lab:.3f} "
          f"(lab/bare {lab / bare:.2f}); each round bare/lab {each}", flush=True)


def print_profile(path: Path, limit: int = 28) -> None:
    stats = pstats.Stats(str(path))
    stats.sort_stats("tottime").print_stats(limit)
    stats.sort_stats("cumulative").print_stats(r"(loop|batch|settings|control|strategies|notify)\.py", limit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=5000, help="credits per case (default 5,000)")
    parser.add_argument("--batch-size", type=int, default=500, help="batch mode's size (default 500)")
    parser.add_argument("--batch-events", type=int, default=25000,
                        help="credits per batch-mode case (default 25,000: 5,000 drain in 0.4 s, too short to time)")
    parser.add_argument("--strategies", nargs="+", default=list(strategies.NAMES), choices=strategies.NAMES)
    parser.add_argument("--modes", nargs="+", default=["per-message", "batch"], choices=["per-message", "batch"])
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (bare loop, lab consumer) per case, alternating which runs first (default 3)")
    parser.add_argument("--consumer-root", type=Path, default=ROOT,
                        help="run the lab's consumers from this checkout (a before/after comparison)")
    parser.add_argument("--profile", action="store_true", help="profile one per-message eventid-atomic consumer")
    args = parser.parse_args()
    global CONSUMER_ROOT
    CONSUMER_ROOT = args.consumer_root
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp, Stack(Path(tmp), args.events) as stack:
        if args.profile:
            out = Path(tmp) / f"consumer-{uuid.uuid4().hex[:6]}.prof"
            figure = lab_consumer(stack, "eventid-atomic", 1, profile_to=out).rate
            wait_until(out.exists, timeout=30, message="the profile was not written")
            print(f"per-message eventid-atomic under cProfile: {figure:,.0f} ev/s")
            print_profile(out)
            return 0
        print(f"{args.events:,} credits per per-message case, {args.batch_events:,} per batch case, one partition; "
              "ev/s from the first record consumed to the last applied and committed; lab consumers from "
              f"{args.consumer_root}\n")
        print(f"{'PostgreSQL alone, one transaction per event':62} {postgres_alone(stack, None):>9,.0f} ev/s")
        print(f"{f'PostgreSQL alone, {args.batch_size} per transaction':62} "
              f"{postgres_alone(stack, args.batch_size):>9,.0f} ev/s")
        # Each lab figure next to a bare loop of the same shape, in rounds that alternate which of the
        # two runs first: this machine's speed drifts (disk flushes, checkpoints, its neighbours) by
        # more than the gap being measured, and a median of neighbouring pairs drifts less.
        print(f"\n{args.rounds} rounds a case; medians (ev/s), and the median of each round's ratio; the machine's "
              "1-minute load average as the case began and ended\n")
        print(f"{'case':44} {'bare loop':>10} {'lab':>9} {'ratio':>6}  {'each round':<24} load")
        cases = []  # (title, bare loop's shape, lab consumer's shape, credits)
        for name in args.strategies:
            if "per-message" in args.modes:
                cases.append((f"{name}, per-message, sync", {}, (name, 1, "sync"), args.events))
                if name == "eventid-atomic":
                    cases.append((f"{name}, per-message, async", {"asynchronous": True}, (name, 1, "async"),
                                  args.events))
            if "batch" in args.modes:
                cases.append((f"{name}, batch of {args.batch_size}", {"batch_size": args.batch_size},
                              (name, args.batch_size, "sync"), args.batch_events))
        for title, bare_shape, (name, batch_size, commit_mode), credits in cases:
            stack.events = credits
            bares, labs = [], []
            load_before = os.getloadavg()[0]
            for round_ in range(args.rounds):
                runs = [lambda: bares.append(bare_loop(stack, **bare_shape)),
                        lambda: labs.append(lab_consumer(stack, name, batch_size, commit_mode=commit_mode))]
                for run in runs if round_ % 2 == 0 else reversed(runs):
                    run()
            ratios = [lab.rate / bare.rate for bare, lab in zip(bares, labs)]
            each = " ".join(f"{r:.2f}" for r in ratios)
            print(f"{title:44} {median(b.rate for b in bares):>10,.0f} {median(lab.rate for lab in labs):>9,.0f} "
                  f"{median(ratios):>5.2f}x  {each:<24} {load_before:.1f} -> {os.getloadavg()[0]:.1f}")
            print_cpu(bares, labs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
