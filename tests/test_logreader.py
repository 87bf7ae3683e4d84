"""The log reader: every record of a lab's topic mirrored into ``log_records``, whoever wrote it.

Real broker, real PostgreSQL: records come from an outside client (a plain confluent-kafka
Producer, not the lab's), the reader runs on a thread of this test process and is stopped in
teardown. Waits are on conditions with deadlines.
"""
from __future__ import annotations

import contextlib
import json
import threading
import uuid
from typing import Iterator

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.kafka.admin import admin_client, delete_topics, ensure_topics, partition_count
from webapp.kafka.config import producer_config
from webapp.kafka.producer import PublishError, produce_raw
from webapp.logreader import LogReader, record_row, wait_mirrored
from webapp.logreader.reader import _Mirror
from webapp.store.connection import connect, sqlalchemy_url
from webapp.store.labs import create_database_state


def credit_json(account: str = "acc-1", cents: int = 100, transaction_id: str | None = None,
                event_id: str | None = None) -> str:
    return json.dumps({"event_id": event_id or str(uuid.uuid4()), "transaction_id": transaction_id or f"T{uuid.uuid4().hex[:12]}",
                       "type": "credit", "account_id": account, "amount_cents": cents,
                       "occurred_at": "2026-12-01T00:00:00+00:00"})


@contextlib.contextmanager
def made_lab(services, lab: Lab) -> Iterator[Lab]:
    """A lab's schema and topics, made directly (no agent): what the reader needs and nothing else."""
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    with engine.begin() as conn:
        create_database_state(conn, lab, 3)
    admin = admin_client(services.bootstrap_servers)
    ensure_topics(admin, {lab.topic: 3, lab.dlq_topic: 1})
    try:
        yield lab
    finally:
        # The topics stay (the broker lives for the session): deleting a topic that another reader
        # (a lab agent's) has assigned crashes librdkafka 2.16 on the embedded broker.
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{lab.schema}" CASCADE'))
        engine.dispose()


@pytest.fixture
def bare_lab(services, lab_name):
    with made_lab(services, Lab(lab_name)) as lab:
        yield lab


class RunningReader:
    """A LogReader on a thread of its own, limited to the given labs; stopped by ``stop()``."""

    def __init__(self, services, *labs: Lab):
        self.reader = LogReader(services.database_url, services.bootstrap_servers, labs=lambda conn: list(labs))
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.reader.run, args=(self.stop_event,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=15)
        assert not self.thread.is_alive(), "the log reader thread did not stop"


@pytest.fixture
def start_reader(services):
    running: list[RunningReader] = []

    def start(*labs: Lab) -> RunningReader:
        running.append(RunningReader(services, *labs))
        return running[-1]
    yield start
    for item in running:
        item.stop()


def rows(services, lab: Lab, where: str = "true") -> list[dict]:
    with connect(services.database_url, schema=lab.schema) as conn:
        cursor = conn.execute(f'SELECT * FROM log_records WHERE {where} ORDER BY partition, "offset"')
        names = [c.name for c in cursor.description]
        return [dict(zip(names, row)) for row in cursor.fetchall()]


def wait_rows(services, lab: Lab, count: int, timeout: float = 30) -> list[dict]:
    return wait_until(lambda: (found := rows(services, lab)) and len(found) >= count and found, timeout=timeout,
                      message=lambda: f"the mirror never held {count} records: {len(rows(services, lab))}")


def outside_producer(services, **extra) -> Producer:
    """Another Kafka client: not the lab's producer, no idempotence, its own batching."""
    return Producer({"bootstrap.servers": services.bootstrap_servers, "enable.idempotence": False, "acks": "all",
                     "log_level": 3, **extra})


def produce_credits(producer: Producer, lab, count: int) -> None:
    """``count`` credits of 1, 2, ... cents to acc-1, all on partition 0, delivered."""
    for n in range(count):
        producer.produce(lab.topic, key=b"acc-1", value=credit_json(cents=n + 1).encode(), partition=0)
    assert producer.flush(30) == 0


def test_every_record_of_an_outside_producer_is_mirrored_decoded_or_with_its_reason(services, bare_lab, start_reader):
    producer = outside_producer(services, **{"linger.ms": 200})
    valid = credit_json("acc-2", 777)
    # Five records in one produce batch: the broker's high watermark is wrong for them on Tansu.
    producer.produce(bare_lab.topic, key=b"acc-2", value=valid.encode(), partition=1,
                     headers=[("source", b"other-system"), ("trace", b"\x00\xff")])
    producer.produce(bare_lab.topic, key=b"acc-2", value=b"{this is not json", partition=1)
    producer.produce(bare_lab.topic, key=None, value=None, partition=1)
    producer.produce(bare_lab.topic, key=b"acc-2", value=b"\xff\xfe\x00garbage", partition=1)
    producer.produce(bare_lab.topic, key=b"acc-2", value=credit_json("acc-2", 5).encode(), partition=1)
    assert producer.flush(30) == 0
    start_reader(bare_lab)

    mirrored = wait_rows(services, bare_lab, 5)
    assert [(r["partition"], r["offset"]) for r in mirrored] == [(1, o) for o in range(5)]
    first, not_json, empty, not_utf8, last = mirrored
    event = json.loads(valid)
    assert (first["type"], first["account_id"], first["amount_cents"], first["transaction_id"]) == \
        ("credit", "acc-2", 777, event["transaction_id"])
    assert str(first["event_id"]) == event["event_id"] and first["invalid_reason"] is None
    assert first["headers"] == [["source", "other-system"], ["trace", "\\x00\\xff"]]
    assert first["key"] == "acc-2" and first["timestamp"] is not None and json.loads(first["value"]) == event
    assert "not JSON" in not_json["invalid_reason"] and not_json["type"] is None
    assert empty["invalid_reason"] == "empty record (no value)" and empty["key"] is None and empty["value"] is None
    assert not_utf8["invalid_reason"] == "value is not UTF-8" and not_utf8["value"] == "\\xff\\xfe\\x00garbage"
    assert last["amount_cents"] == 5

    # The log end the lab shows is the reader's, not the broker's high watermark.
    from webapp.readmodel.partitions import log_ends
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    try:
        from sqlalchemy.orm import Session
        with Session(engine) as session:
            session.execute(text("SELECT set_config('search_path', :s, true)"), {"s": bare_lab.schema})
            assert log_ends(session, bare_lab.schema) == {1: 5}
    finally:
        engine.dispose()


def test_a_restarted_reader_resumes_from_the_table_and_a_reread_writes_nothing(services, bare_lab, start_reader):
    producer = outside_producer(services)
    produce_credits(producer, bare_lab, 4)
    first = start_reader(bare_lab)
    wait_rows(services, bare_lab, 4)
    first.stop()

    for n in range(3):
        producer.produce(bare_lab.topic, key=b"acc-1", value=credit_json(cents=10 + n).encode(), partition=0)
    assert producer.flush(30) == 0
    second = start_reader(bare_lab)
    mirrored = wait_rows(services, bare_lab, 7)
    second.stop()
    assert [r["offset"] for r in mirrored] == list(range(7))
    assert [r["amount_cents"] for r in mirrored] == [1, 2, 3, 4, 10, 11, 12]

    # Re-reading the whole partition from the start and writing it again inserts nothing.
    reader = LogReader(services.database_url, services.bootstrap_servers, labs=lambda conn: [bare_lab])
    consumer = Consumer({"bootstrap.servers": services.bootstrap_servers, "group.id": "unused", "log_level": 3,
                         "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(bare_lab.topic, 0, 0)])
        messages: list = []
        wait_until(lambda: messages.extend(m for m in consumer.consume(10, 0.5) if not m.error()) or len(messages) >= 7,
                   timeout=30, message="could not re-read the partition")
        oid = reader._db().execute("SELECT oid::bigint FROM pg_namespace WHERE nspname = %s",
                                   [bare_lab.schema]).fetchone()[0]
        assert reader._write(reader._db(), _Mirror(bare_lab, oid, [0, 1, 2]), [record_row(m) for m in messages]) == 0
    finally:
        consumer.close()
        reader.close()
    assert len(rows(services, bare_lab)) == 7


def test_produce_raw_writes_exactly_what_was_typed(services, bare_lab, start_reader):
    config = producer_config(services.bootstrap_servers, idempotent=True, client_id=bare_lab.producer_client_id)
    where = produce_raw(config, bare_lab.topic, key="acc-9", value="hello, not an event",
                        headers={"from": "the raw form"}, partition=2)
    assert where == {"partition": 2, "offset": 0}
    typed = credit_json("acc-3", 250)
    assert produce_raw(config, bare_lab.topic, key="acc-3", value=typed, headers=None, partition=2)["offset"] == 1
    with pytest.raises(PublishError, match="partition"):
        produce_raw(config, bare_lab.topic, key=None, value="x", partition=-1)
    with pytest.raises(PublishError, match="headers"):
        produce_raw(config, bare_lab.topic, key=None, value="x", headers=[("", "no name")])
    with connect(services.database_url, autocommit=True) as conn:
        # (The session's agent may run its own reader over every lab: this test's reader or that one.)
        start_reader(bare_lab)
        assert wait_mirrored(conn, bare_lab, [(2, 0), (2, 1)], timeout=30)
    raw, event = wait_rows(services, bare_lab, 2)
    assert (raw["key"], raw["value"], raw["headers"]) == ("acc-9", "hello, not an event", [["from", "the raw form"]])
    assert "not JSON" in raw["invalid_reason"]
    assert (event["type"], event["amount_cents"], event["invalid_reason"]) == ("credit", 250, None)


def test_the_first_record_of_each_transaction_is_marked_across_batches(services, bare_lab, start_reader):
    producer = outside_producer(services)
    same = credit_json("acc-5", 100, transaction_id="T-SAME")
    source_duplicate = credit_json("acc-5", 100, transaction_id="T-SAME")  # another event id, same transaction
    for value in (same, b"{bad".decode(), same, credit_json("acc-5", 7)):
        producer.produce(bare_lab.topic, key=b"acc-5", value=value.encode(), partition=0)
    assert producer.flush(30) == 0
    first = start_reader(bare_lab)
    wait_rows(services, bare_lab, 4)
    first.stop()
    producer.produce(bare_lab.topic, key=b"acc-5", value=source_duplicate.encode(), partition=0)
    assert producer.flush(30) == 0
    start_reader(bare_lab)
    mirrored = wait_rows(services, bare_lab, 5)
    assert [r["first_of_transaction"] for r in mirrored] == [True, False, False, True, False]
    assert [r["transaction_id"] for r in mirrored if r["first_of_transaction"]][0] == "T-SAME"


def test_a_reset_lab_is_mirrored_again_from_the_start_of_its_new_topic(services, bare_lab, start_reader):
    producer = outside_producer(services)
    produce_credits(producer, bare_lab, 3)
    running = start_reader(bare_lab)
    wait_rows(services, bare_lab, 3)

    # What a lab reset does: delete the topics, drop the schema, create both again; the reader
    # is held off Kafka meanwhile (librdkafka crashes on a deleted topic it has assigned).
    admin = admin_client(services.bootstrap_servers)
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    with running.reader.paused():
        delete_topics(admin, [bare_lab.topic])
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{bare_lab.schema}" CASCADE'))

        def recreated() -> bool:
            try:
                ensure_topics(admin, {bare_lab.topic: 3})
                return partition_count(admin, bare_lab.topic) == 3
            except Exception:  # noqa: BLE001 - deletion completes asynchronously: try again
                return False
        # Tansu finishes a deletion later; a loaded machine has seen it take more than 20 s.
        wait_until(recreated, timeout=60, interval=0.2, message="could not recreate the topic")
        with engine.begin() as conn:
            create_database_state(conn, bare_lab, 3)
    engine.dispose()
    producer.produce(bare_lab.topic, key=b"acc-1", value=credit_json(cents=42).encode(), partition=0)
    assert producer.flush(30) == 0
    [fresh] = wait_rows(services, bare_lab, 1)
    assert (fresh["partition"], fresh["offset"], fresh["amount_cents"]) == (0, 0, 42)
    assert len(rows(services, bare_lab)) == 1


def test_a_hold_asked_again_right_after_a_release_is_answered_again():
    """Two lab resets in a row: the agent releases the reader and holds it again before the
    reader's waiting loop has seen the release. Each hold must be answered, or the agent waits
    its 10 s and restarts the reader."""
    reader = LogReader("postgresql://unused@127.0.0.1:1/none", "127.0.0.1:1")
    answers = threading.Semaphore(0)
    reader.on_held = answers.release
    reader.hold()
    waiting = threading.Thread(target=reader._pause_point, daemon=True)
    waiting.start()
    try:
        assert answers.acquire(timeout=5), "the first hold was never answered"
        reader.release()
        reader.hold()  # at once: the loop (it looks every 50 ms) never sees the release
        assert answers.acquire(timeout=5), "a hold asked again right after a release was never answered"
    finally:
        reader.release()
        waiting.join(timeout=5)
    assert not waiting.is_alive(), "released, the reader did not leave its wait"


def mirrored_count(services, lab: Lab) -> int:
    with connect(services.database_url, schema=lab.schema) as conn:
        return conn.execute("SELECT count(*) FROM log_records").fetchone()[0]


# Fewer than librdkafka's default prefetch (100,000 records or 64 MB queued): with the defaults the
# consumer has the whole backlog queued before the quiet lab's record, which is mirrored last.
BUSY_BACKLOG = 90_000


def test_a_quiet_labs_record_is_mirrored_while_a_busy_labs_backlog_is_still_being_read(services, bare_lab,
                                                                                       start_reader):
    """One reader serves every lab: a lab with one new record does not wait behind everything the
    reader has already fetched of another lab's large backlog."""
    with made_lab(services, Lab(f"{bare_lab.name}q")) as quiet_lab:
        producer = outside_producer(services, **{"linger.ms": 20})
        for n in range(BUSY_BACKLOG):
            while True:
                try:
                    producer.produce(bare_lab.topic, key=b"acc-1", value=credit_json(cents=n + 1).encode(),
                                     partition=n % 3)
                    break
                except BufferError:
                    producer.poll(0.05)
        assert producer.flush(60) == 0
        start_reader(bare_lab, quiet_lab)
        # Reading the backlog is well under way (the consumer has had time to fetch far ahead).
        wait_until(lambda: mirrored_count(services, bare_lab) >= 5_000, timeout=60,
                   message=lambda: f"the busy lab's mirror never reached 5,000: {mirrored_count(services, bare_lab)}")

        producer.produce(quiet_lab.topic, key=b"acc-1", value=credit_json().encode(), partition=0)
        assert producer.flush(30) == 0
        del producer  # destroyed now, not after the session's broker has stopped
        busy_when_produced = mirrored_count(services, bare_lab)
        wait_until(lambda: mirrored_count(services, quiet_lab) == 1, timeout=60,
                   message="the quiet lab's record was never mirrored")
        # Counted after the quiet record was seen: the busy mirror only grows, so it was at most this then.
        busy_when_mirrored = mirrored_count(services, bare_lab)

        assert busy_when_mirrored < BUSY_BACKLOG, \
            (f"the quiet lab's record was mirrored only after the busy lab's whole backlog of {BUSY_BACKLOG:,} "
             f"(the busy lab's mirror held {busy_when_produced:,} when the record was produced)")
