"""webapp/kafka/admin.py on the session's broker: committed offsets of many groups at once."""
from __future__ import annotations

import uuid

from confluent_kafka import Consumer, KafkaException, TopicPartition

from webapp.kafka.admin import admin_client, committed_offsets, committed_offsets_of, ensure_topics
from webapp.kafka.config import consumer_config


def commit(bootstrap_servers: str, group_id: str, topic: str, offsets: dict[int, int]) -> None:
    """Commit ``offsets`` for ``group_id`` as a consumer of that group does (no records needed)."""
    consumer = Consumer(consumer_config(bootstrap_servers, group_id, client_id=f"test-{group_id}"))
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


def test_the_committed_offsets_of_many_groups_come_back_together_and_a_failure_stays_its_own(services):
    admin = admin_client(services.bootstrap_servers)
    topic = f"t_admin_{uuid.uuid4().hex[:8]}.payments"
    ensure_topics(admin, {topic: 2})
    first, second, idle = (f"{topic}.{name}" for name in ("first", "second", "idle"))
    commit(services.bootstrap_servers, first, topic, {0: 3})
    commit(services.bootstrap_servers, second, topic, {0: 1, 1: 4})
    answers = committed_offsets_of(admin, [(first, topic), (second, topic), (idle, topic), (first, "no.such.topic")])
    assert answers[(first, topic)] == {0: 3, 1: None}
    assert answers[(second, topic)] == {0: 1, 1: 4}
    assert answers[(idle, topic)] == {0: None, 1: None}, "a group that committed nothing"
    assert isinstance(answers[(first, "no.such.topic")], KafkaException), "a missing topic, said for its pair only"
    assert committed_offsets(admin, second, topic) == {0: 1, 1: 4}
