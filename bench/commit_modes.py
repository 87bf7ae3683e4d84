"""What an asynchronous offset commit costs after a crash, on the embedded broker.

    .venv/bin/python bench/commit_modes.py [--trials 10] [--burst 100]

One embedded Tansu broker, started fresh, one topic of one partition filled with records. Each
trial is a child process with a consumer of its own group (``enable.auto.commit`` off, as the
lab's consumers): it reads ``--burst`` records, commits each one's offset right after reading it
(``commit(message, asynchronous=...)``), and SIGKILLs itself the instant the last ``commit()``
returns: no close, no leave, nothing flushed. A fresh consumer then reads the group's committed
offset from the broker; the records past it are what a restarted consumer gets again.

Printed per commit mode: in how many trials the last commit was lost, and the records that come
back (mean and worst). A synchronous ``commit()`` returns once the broker answered, so it must
lose nothing; an asynchronous one returns once the request is queued in librdkafka, so a kill can
beat it to the socket.
"""
from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from webapp.dev.stack import Stack
from webapp.domain.waits import wait_until
from webapp.kafka.config import GROUP_TIMEOUTS

TOPIC = "commit-modes"


def fill(bootstrap: str, records: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(TOPIC, 1, 1)])[TOPIC].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    for n in range(records):
        producer.produce(TOPIC, value=str(n).encode())
    if producer.flush(30) != 0:
        raise RuntimeError("the broker did not acknowledge every record")


def read_commit_then_die(bootstrap: str, group: str, burst: int, asynchronous: bool, work_ms: float) -> None:
    """In the child: read ``burst`` records, committing each after ``work_ms`` of stand-in work (the
    lab's per-message transaction takes about 1 ms), then SIGKILL at the last commit's return."""
    # The lab's group timeouts: the first join waits about half the session timeout (docs/concepts/broker.md).
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", **GROUP_TIMEOUTS})
    consumer.subscribe([TOPIC])
    done = 0
    while done < burst:
        message = consumer.poll(1.0)
        if message is None or message.error():
            continue
        if work_ms:
            time.sleep(work_ms / 1000)  # stands in for the message's database transaction
        consumer.commit(message=message, asynchronous=asynchronous)
        done += 1
    os.kill(os.getpid(), signal.SIGKILL)


def trial(bootstrap: str, group: str, burst: int, asynchronous: bool, work_ms: float) -> int:
    """Records that come back after the kill: those read minus the committed offset."""
    pid = os.fork()
    if pid == 0:
        try:
            read_commit_then_die(bootstrap, group, burst, asynchronous, work_ms)
        finally:
            os._exit(1)  # only reached if the kill failed
    _, status = os.waitpid(pid, 0)
    if not os.WIFSIGNALED(status) or os.WTERMSIG(status) != signal.SIGKILL:
        raise RuntimeError(f"trial {group}: the child did not die of SIGKILL (status {status})")
    return burst - settled_committed_offset(bootstrap, group)


def settled_committed_offset(bootstrap: str, group: str) -> int:
    """The committed offset once two reads half a second apart agree: a commit that left just
    before the kill may still be landing (one landing later would not help a consumer restarted at
    once either, so this counts in async's favour)."""
    reads: list[int] = []
    # A consumer of the group that never subscribes: it only asks the coordinator (no join, no rebalance).
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def stable() -> bool:
        reads.append(max(reader.committed([TopicPartition(TOPIC, 0)], timeout=10)[0].offset, 0))
        return len(reads) > 1 and reads[-1] == reads[-2]
    try:
        wait_until(stable, timeout=30, interval=0.5,
                   message=lambda: f"group {group}: committed offsets kept moving: {reads}")
    finally:
        reader.close()
    return reads[-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=5, help="kills per case (default 5)")
    parser.add_argument("--burst", type=int, default=100, help="records read and committed before the kill")
    parser.add_argument("--work-ms", default="0,1", help="stand-in work per record before its commit, ms "
                        "(comma-separated cases; default 0,1)")
    args = parser.parse_args()
    works = [float(w) for w in args.work_ms.split(",")]
    with tempfile.TemporaryDirectory(prefix="commit-modes-") as tmp:
        # The broker alone (webapp/dev/stack.py).
        with Stack(Path(tmp), postgres=False, agent=False) as broker:
            fill(broker.bootstrap_servers, args.burst)
            print(f"{args.trials} trials per case: read {args.burst} records committing each, SIGKILL as the "
                  f"last commit() returns; records back = read - committed offset\n")
            print(f"{'commit mode':12} {'work ms':>8} {'last commit lost':>17} {'records back, mean':>19} "
                  f"{'worst':>6} {'trial s':>8}")
            for work_ms in works:
                for mode in ("sync", "async"):
                    started = time.monotonic()
                    back = [trial(broker.bootstrap_servers, f"{mode}-{work_ms:g}-{n}", args.burst, mode == "async",
                                  work_ms) for n in range(args.trials)]
                    seconds = (time.monotonic() - started) / args.trials
                    lost = sum(1 for b in back if b > 0)
                    print(f"{mode:12} {work_ms:8g} {f'{lost} of {args.trials}':>17} {statistics.mean(back):19.2f} "
                          f"{max(back):6} {seconds:8.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
