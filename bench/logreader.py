"""How fast the log reader mirrors a topic, against a bare confluent-kafka consume loop (``make bench``).

Starts a private embedded PostgreSQL and Tansu broker in a temp dir, creates one lab (3
partitions), produces N lab events (every 100th malformed), then, in the same run:

1. a bare loop: an assigned Consumer reading every partition from the start with ``consume(n)``
   and doing nothing with the records: the ceiling;
2. the log reader: the same reads, plus decoding each record with ``events.decode`` and writing
   one ``log_records`` row per record; as the agent runs it (``run``: a writer thread inserts
   while the next batch is decoded), then one batch at a time (``poll_once``).

Prints the rates and the reader's as a ratio of the bare loop's.

    .venv/bin/python bench/logreader.py [--records 100000] [--batch 1000]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from webapp.dev.stack import Stack
from webapp.domain.lab import Lab
from webapp.kafka.admin import admin_client, ensure_topics
from webapp.logreader import LogReader
from webapp.store.connection import connect
from webapp.store.labs import create_database_state

LAB = Lab("benchlog")
PARTITIONS = 3


def produce(bootstrap: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 1000,
                         "enable.idempotence": False, "acks": "all", "log_level": 3})
    for i in range(records):
        account = f"acc-{i % 5 + 1}"
        if i % 100 == 99:
            value = b"{malformed"
        else:
            value = json.dumps({"event_id": str(uuid.uuid4()), "transaction_id": f"B{i}", "type": "credit",
                                "account_id": account, "amount_cents": 100 + i % 900,
                                "occurred_at": "2026-12-01T00:00:00+00:00"}).encode()
        while True:
            try:
                producer.produce(LAB.topic, key=account.encode(), value=value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise SystemExit("the broker did not acknowledge every record")


def bare_loop(bootstrap: str, records: int, batch: int) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-unused", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100, "log_level": 3})
    try:
        consumer.assign([TopicPartition(LAB.topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        seen, started = 0, time.perf_counter()
        while seen < records:
            seen += sum(1 for m in consumer.consume(batch, 0.2) if not m.error())
        return seen / (time.perf_counter() - started)
    finally:
        consumer.close()


def reader_loop(database_url: str, bootstrap: str, records: int, batch: int) -> tuple[float, float]:
    """The reader as the agent runs it (``run``: decoding overlaps writing), then one batch at a
    time on one thread (``poll_once``), each into a fresh table. Records per second, both."""
    rates = []
    for pipelined in (True, False):
        with connect(database_url, schema=LAB.schema, autocommit=True) as conn:
            conn.execute("TRUNCATE log_records")
            reader = LogReader(database_url, bootstrap, labs=lambda c: [LAB], batch=batch)
            reader.refresh()  # assignment and positions: not part of the reading rate
            started = time.perf_counter()
            if pipelined:
                stop = threading.Event()
                thread = threading.Thread(target=reader.run, args=(stop,), daemon=True)
                thread.start()
                while reader.stats.records < records:
                    time.sleep(0.01)
                elapsed = time.perf_counter() - started
                stop.set()
                thread.join(timeout=30)
            else:
                written = 0
                while written < records:
                    written += reader.poll_once()
                elapsed = time.perf_counter() - started
                reader.close()
            count = conn.execute("SELECT count(*) FROM log_records").fetchone()[0]
        if count != records:
            raise SystemExit(f"the mirror holds {count} records, not {records}")
        rates.append(records / elapsed)
    return rates[0], rates[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000, help="records per consume(n) (default 1000)")
    args = parser.parse_args()
    # PostgreSQL (the control schema at head) and the broker, no agent (webapp/dev/stack.py).
    with tempfile.TemporaryDirectory(prefix="lab-bench-logreader-") as tmp, \
            Stack(Path(tmp), agent=False) as stack:
        engine = stack.engine()
        with engine.begin() as conn:
            create_database_state(conn, LAB, PARTITIONS)
        engine.dispose()
        ensure_topics(admin_client(stack.bootstrap_servers), {LAB.topic: PARTITIONS})
        started = time.perf_counter()
        produce(stack.bootstrap_servers, args.records)
        print(f"produced {args.records:,} records ({PARTITIONS} partitions, 1% malformed) "
              f"in {time.perf_counter() - started:.1f}s")
        bare = bare_loop(stack.bootstrap_servers, args.records, args.batch)
        pipelined, single = reader_loop(stack.database_url, stack.bootstrap_servers, args.records, args.batch)
        print(f"bare consume({args.batch}) loop          {bare:10,.0f} records/s")
        print(f"log reader, run() (as in the agent)  {pipelined:10,.0f} records/s  "
              f"{pipelined / bare:5.2f} of the bare loop")
        print(f"log reader, poll_once() one thread   {single:10,.0f} records/s  {single / bare:5.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
