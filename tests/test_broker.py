"""What the embedded broker (Tansu) does with what a lesson needs, measured on the session's broker
(docs/concepts/broker.md). A test here that starts failing means the broker changed: the lesson
it held back may run on it now."""
from __future__ import annotations

import uuid
from contextlib import contextmanager
from typing import Iterator

from confluent_kafka import Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from webapp.domain.waits import wait_until

TIMEOUT = 15


def read_all(bootstrap_servers: str, topic: str, isolation: str, expected: int) -> list[str]:
    """The values of ``topic`` partition 0 as a consumer with ``isolation.level`` reads them."""
    reader = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"{topic}-{isolation}",
                       "isolation.level": isolation, "enable.auto.commit": False, "log_level": 3})
    seen: list[str] = []
    try:
        reader.assign([TopicPartition(topic, 0, 0)])

        def read() -> bool:
            message = reader.poll(0.2)
            if message is not None and not message.error():
                seen.append(message.value().decode())
            return len(seen) >= expected
        wait_until(read, timeout=TIMEOUT, interval=0,
                   message=lambda: f"a {isolation} consumer read {seen}, expected {expected} records")
    finally:
        reader.close()
    return seen


def topics_with_a_payment(bootstrap_servers: str, source: str, *others: str) -> None:
    """Create ``source`` and ``others`` (one partition each) and write one record, "payment", to ``source``."""
    admin = AdminClient({"bootstrap.servers": bootstrap_servers})
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in (source, *others)]).values():
        future.result(TIMEOUT)
    plain = Producer({"bootstrap.servers": bootstrap_servers, "log_level": 3})
    plain.produce(source, value=b"payment")
    assert plain.flush(TIMEOUT) == 0


@contextmanager
def processor_of(bootstrap_servers: str, topic: str, group: str) -> Iterator[tuple[Consumer, Message]]:
    """A consumer of ``group`` assigned ``topic`` partition 0, with the record it read first; closed after."""
    processor = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": group, "enable.auto.commit": False,
                          "log_level": 3})
    try:
        processor.assign([TopicPartition(topic, 0, 0)])
        yield processor, wait_until(lambda: processor.poll(0.2), timeout=TIMEOUT, interval=0,
                                    message="the processor never read the payment")
    finally:
        processor.close()


def test_tansu_takes_kafka_transactions_but_a_read_committed_consumer_reads_an_aborted_one(services):
    """A transactional producer initializes, sends a consumer's offsets to its transaction and
    commits them with its record; it aborts a second transaction. On Apache Kafka a read_committed
    consumer then reads the committed record alone. Tansu hands it the aborted one too: it does not
    filter aborted transactions. A lesson whose transactions produce records therefore needs Apache
    Kafka (the compose stack); exercise 24 commits offsets alone, which Tansu does as Kafka does."""
    bootstrap = services.bootstrap_servers
    source, sink = (f"broker-txn-{name}-{uuid.uuid4().hex[:8]}" for name in ("in", "out"))
    topics_with_a_payment(bootstrap, source, sink)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{source}-txn", "log_level": 3})
    with processor_of(bootstrap, source, f"{source}-processor") as (processor, consumed):
        producer.init_transactions(TIMEOUT)
        producer.begin_transaction()
        producer.produce(sink, value=b"committed")
        producer.send_offsets_to_transaction([TopicPartition(source, 0, consumed.offset() + 1)],
                                             processor.consumer_group_metadata(), TIMEOUT)
        producer.commit_transaction(TIMEOUT)
        producer.begin_transaction()
        producer.produce(sink, value=b"aborted")
        producer.flush(TIMEOUT)
        producer.abort_transaction(TIMEOUT)
        # The offset went in with the transaction: what Kafka's exactly-once covers, inside Kafka.
        assert processor.committed([TopicPartition(source, 0)], TIMEOUT)[0].offset == consumed.offset() + 1

    assert read_all(bootstrap, sink, "read_uncommitted", 2) == ["committed", "aborted"]
    assert read_all(bootstrap, sink, "read_committed", 2) == ["committed", "aborted"], (
        "Tansu hands an aborted record to a read_committed consumer (measured 2026-12-04)")


def test_a_new_producer_under_the_same_transactional_id_aborts_the_open_transaction_and_its_offsets(services):
    """What exercise 24 stands on: a process dies inside a transaction that holds a group's offsets;
    its successor's init_transactions (same transactional.id) aborts it, so the group's committed
    offset is still the one before. The fenced producer's commit then fails: Kafka says
    PRODUCER_FENCED (fatal); Tansu lets it time out (measured 2026-12-05), and the lab aborts and
    drops such a producer either way (consumer/commit.py)."""
    bootstrap = services.bootstrap_servers
    topic = f"broker-fence-{uuid.uuid4().hex[:8]}"
    topics_with_a_payment(bootstrap, topic)
    settings = {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "log_level": 3}
    first, successor = Producer(settings), Producer(settings)
    with processor_of(bootstrap, topic, f"{topic}-g") as (processor, consumed):
        first.init_transactions(TIMEOUT)
        first.begin_transaction()
        first.send_offsets_to_transaction([TopicPartition(topic, 0, consumed.offset() + 1)],
                                          processor.consumer_group_metadata(), TIMEOUT)
        successor.init_transactions(TIMEOUT)
        assert processor.committed([TopicPartition(topic, 0)], TIMEOUT)[0].offset < 0, "the open transaction's offset landed"
        try:
            first.commit_transaction(3)
            committed = True
        except KafkaException:
            committed = False
        assert not committed, "a fenced producer committed its transaction"
        assert processor.committed([TopicPartition(topic, 0)], TIMEOUT)[0].offset < 0
