"""Throughput through the disarmed fault proxy vs straight to the broker.

    .venv/bin/python bench/faultproxy.py [--events 10000 100000] [--runs 3]

Two embedded Tansu brokers on loopback, each started fresh: one advertising itself (direct),
one advertising a fault proxy process in front of it (``python -m webapp.faultproxy``, the
same command the lab runs, without a database: disarmed, the data path never touches it).
The lab's own producer settings (kafka.config.producer_config, idempotent, acks=all) produce N
payment-sized events; the clock runs from the first produce() to the last delivery report.
Prints events/s for both and the relative cost of the proxy (median of the runs); then the
same one event at a time (each delivery report awaited, as a person publishing does), where
the extra hop is paid on every event.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from webapp.dev.stack import Stack
from webapp.domain import events
from webapp.kafka.config import producer_config


def produce_all(bootstrap: str, count: int, one_at_a_time: bool = False) -> float:
    """Seconds to produce ``count`` events and receive every delivery report; fails on any error.

    ``one_at_a_time`` waits for each report before the next produce: one request per event, so
    the proxy's extra hop is paid on every event instead of being shared by a batch."""
    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    for future in admin.create_topics([NewTopic(topic, 3, 1)], operation_timeout=10).values():
        future.result()
    payloads = [(e.key, e.encode()) for e in (events.credit(f"acc-{n % 5 + 1}", 100 + n) for n in range(count))]
    producer = Producer(producer_config(bootstrap, idempotent=True, client_id="bench-faultproxy"))
    failures: list[str] = []
    delivered = 0

    def on_delivery(error, message) -> None:
        nonlocal delivered
        if error is not None:
            failures.append(error.str())
        else:
            delivered += 1
    producer.produce(topic, value=b"warm-up")  # connections and metadata outside the clock
    producer.flush(10)
    started = time.perf_counter()
    for key, value in payloads:
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if one_at_a_time:
            producer.flush(10)
    left = producer.flush(120)
    elapsed = time.perf_counter() - started
    if left or failures or delivered != count:
        raise RuntimeError(f"{left} unacknowledged, {len(failures)} failed ({failures[:3]}), {delivered}/{count}")
    return elapsed


def direct_run(workdir: Path, count: int, one_at_a_time: bool) -> float:
    # A broker alone (webapp/dev/stack.py), in a directory of this run's own.
    with Stack(workdir / f"direct-{uuid.uuid4().hex[:6]}", postgres=False, agent=False) as stack:
        return produce_all(stack.bootstrap_servers, count, one_at_a_time)


def proxied_run(workdir: Path, count: int, one_at_a_time: bool) -> float:
    # A broker advertising the fault proxy and the proxy; no database, so the proxy runs disarmed.
    with Stack(workdir / f"proxied-{uuid.uuid4().hex[:6]}", postgres=False, fault_proxy=True, agent=False,
               stop_timeout=10) as stack:
        return produce_all(stack.producer_bootstrap_servers, count, one_at_a_time)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--one-at-a-time", type=int, default=1_000, metavar="N",
                        help="also N events each waited for before the next (0: skip)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-faultproxy-") as tmp:
        workdir = Path(tmp)
        print(f"{'events':>8} {'direct ev/s':>12} {'proxied ev/s':>13} {'cost':>7}")
        cases = [(count, False) for count in args.events]
        if args.one_at_a_time:
            cases.append((args.one_at_a_time, True))
        for count, one_at_a_time in cases:
            direct, proxied = [], []
            for _ in range(args.runs):
                # Alternated, so a noisy neighbour on the machine hurts both sides alike.
                direct.append(count / direct_run(workdir, count, one_at_a_time))
                proxied.append(count / proxied_run(workdir, count, one_at_a_time))
            direct_rate, proxied_rate = statistics.median(direct), statistics.median(proxied)
            cost = 1 - proxied_rate / direct_rate
            label = f"{count}{' one at a time' if one_at_a_time else ''}"
            print(f"{label:>8} {direct_rate:>12,.0f} {proxied_rate:>13,.0f} {cost:>7.1%}   "
                  f"(runs direct {', '.join(f'{r:,.0f}' for r in direct)}; "
                  f"proxied {', '.join(f'{r:,.0f}' for r in proxied)})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
