"""The group wedge on the embedded broker, reproduced with no lab code.

    .venv/bin/python bench/broker_wedge.py [--tries 3] [--gap 0.4]

Three plain confluent-kafka consumers of one group (session 6 s, heartbeat 1 s, librdkafka's
default eager assignors) straight on a fresh embedded Tansu broker, no fault proxy, no database.
Once all three are assigned, each try makes one of these membership changes and reports how long
until the members left hold every partition again (45 s at most):

- ``leader-leaves``: the member the broker elected leader closes (a LeaveGroup);
- ``follower-replaced``: a follower is SIGKILLed (its member lingers until the session timeout)
  and a new consumer joins in its place, which starts a rebalance;
- ``leader-leaves-during-rebalance``: the same, then ``--gap`` seconds later, while that
  rebalance is in progress, the leader closes: the sequence the soak's `debug=cgrp` logs show
  before every wedge (docs/concepts/broker.md).

Each member is this script run with ``--member``: it prints its assignment and whether it is the
elected leader (from librdkafka's own `cgrp` log lines) as JSON lines.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, NewTopic

from webapp.dev.embedded import EmbeddedBroker

PARTITIONS = [0, 1, 2]
SETTLE_TIMEOUT = 45.0
CHANGES = ("leader-leaves", "follower-replaced", "leader-leaves-during-rebalance")


# --- one member (a process of its own) ------------------------------------------------------------

def member(name: str, bootstrap: str, group: str, topic: str) -> None:
    """Consume in ``group`` until SIGTERM, then close (a LeaveGroup); print each change of state."""
    state = {"leader": False}

    class LeaderWatch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            line = record.getMessage()
            if "I am elected leader" in line:
                state["leader"] = True
            elif "JoinGroup response: GenerationId" in line and "(me)" not in line:
                state["leader"] = False

    log = logging.getLogger(name)
    log.addHandler(LeaderWatch())
    log.setLevel(logging.DEBUG)
    log.propagate = False
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "client.id": name,
                         "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                         "auto.offset.reset": "earliest", "debug": "cgrp"}, logger=log)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    consumer.subscribe([topic])
    last = None
    try:
        while not stopping.is_set():
            consumer.poll(0.2)
            now = (sorted(p.partition for p in consumer.assignment()), state["leader"])
            if now != last:
                print(json.dumps({"name": name, "assigned": now[0], "leader": now[1]}), flush=True)
                last = now
    finally:
        consumer.close()


# --- the driver -----------------------------------------------------------------------------------

class Group:
    """The member processes of one group and what each last said."""

    def __init__(self, bootstrap: str, group: str, topic: str):
        self.bootstrap, self.group, self.topic = bootstrap, group, topic
        self.processes: dict[str, subprocess.Popen] = {}
        self.latest: dict[str, dict] = {}
        self.lock = threading.Lock()

    def start(self, name: str) -> None:
        process = subprocess.Popen([sys.executable, __file__, "--member", name, self.bootstrap, self.group, self.topic],
                                   stdout=subprocess.PIPE, text=True)
        self.processes[name] = process
        threading.Thread(target=self._read, args=(name, process), daemon=True).start()

    def _read(self, name: str, process: subprocess.Popen) -> None:
        for line in process.stdout:
            with self.lock:
                self.latest[name] = json.loads(line)

    def live(self) -> list[str]:
        return [name for name, process in self.processes.items() if process.poll() is None]

    def leader(self) -> str | None:
        with self.lock:
            return next((name for name in self.live() if self.latest.get(name, {}).get("leader")), None)

    def covered(self) -> list[int]:
        with self.lock:
            return sorted(p for name in self.live() for p in self.latest.get(name, {}).get("assigned", []))

    def wait(self, condition, timeout: float) -> float | None:
        """Seconds until ``condition()`` held, or None at the timeout."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if condition():
                return time.monotonic() - started
            time.sleep(0.05)
        return None

    def stop_all(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
            process.wait()


def attempt(bootstrap: str, topic: str, group_id: str, change: str, gap: float) -> str:
    group = Group(bootstrap, group_id, topic)
    try:
        for index in range(3):
            group.start(f"m{index}")
        if group.wait(lambda: group.covered() == PARTITIONS and group.leader(), 60) is None:
            return f"{change}: the three members never settled (no wedge measured)"
        leader = group.leader()
        if change in ("follower-replaced", "leader-leaves-during-rebalance"):
            victim = next(name for name in group.live() if name != leader)
            group.processes[victim].kill()  # SIGKILL: no LeaveGroup, the member lingers until the session timeout
            group.start(victim + "-replacement")
            time.sleep(gap)  # the measured gap between the two changes, not a wait for a condition
        if change in ("leader-leaves", "leader-leaves-during-rebalance"):
            group.processes[leader].terminate()  # the member closes: LeaveGroup
            group.processes[leader].wait(10)
        seconds = group.wait(lambda: group.covered() == PARTITIONS, SETTLE_TIMEOUT)
        if seconds is None:
            with group.lock:
                held = {name: group.latest.get(name, {}).get("assigned") for name in group.live()}
            return f"{change}: WEDGED, after {SETTLE_TIMEOUT:.0f} s the members hold {held}"
        return f"{change}: every partition held again after {seconds:.1f} s"
    finally:
        group.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tries", type=int, default=3, help="tries of each change (default 3)")
    parser.add_argument("--gap", type=float, default=0.4,
                        help="seconds between the follower's replacement and the leader leaving (default 0.4)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        broker = EmbeddedBroker(Path(scratch) / "tansu.log").start()
        try:
            admin = AdminClient({"bootstrap.servers": broker.bootstrap_servers})
            admin.create_topics([NewTopic("wedge", len(PARTITIONS), 1)])["wedge"].result(15)
            number = 0
            for change in CHANGES:
                for _ in range(args.tries):
                    number += 1
                    print(attempt(broker.bootstrap_servers, "wedge", f"group-{number}", change, args.gap), flush=True)
        finally:
            broker.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--member":
        member(*sys.argv[2:6])
    else:
        main()
