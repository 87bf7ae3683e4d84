"""The learners' gateway (webapp/faultproxy/gateway.py), as an attendee's own code meets it: real
librdkafka clients (confluent-kafka) with SASL_PLAINTEXT/PLAIN, a real Tansu broker, the lanes'
Kafka principals in the real PostgreSQL, and the fault proxy with its learner listener (in this
process for most tests, the fault proxy process of a stack for one).

Alice and Bob each have a lab of their own and a lane in it. With Alice's credentials a client
reads her lab's topic and commits in her lane's group, and every other thing (Bob's topics and
groups, producing, deleting) is refused with the error code Apache Kafka's authorizer gives.
Some attacks go round what librdkafka would send: a client of our own (kafka-python's protocol
classes, an encoder independent of the gateway's) sends Fetch, JoinGroup and OffsetCommit for
Bob's topic and group straight away, without asking for metadata or a coordinator first.
"""
from __future__ import annotations

import asyncio
import itertools
import socket
import struct
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from confluent_kafka import (ConsumerGroupTopicPartitions, Consumer, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from webapp.dev.embedded import LOOPBACK, EmbeddedBroker
from webapp.domain.credentials import hash_password
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.faultproxy.faults import Faults
from webapp.faultproxy.principals import DatabasePrincipals
from webapp.faultproxy.proxy import FaultProxy
from webapp.store.connection import CONTROL_SCHEMA, sqlalchemy_url

LANE = "mine"
RECORDS = 5
_labs = itertools.count(1)


@dataclass(frozen=True)
class Learner:
    lab: Lab
    password: str

    @property
    def username(self) -> str:
        return self.lab.lane_role(LANE)

    @property
    def group_id(self) -> str:
        return self.lab.group_id(LANE)

    @property
    def client_id(self) -> str:
        return self.lab.client_id(LANE)

    def config(self, bootstrap: str, password: str | None = None, **extra) -> dict:
        """A learner's client settings, as the /yours page gives them."""
        return {"bootstrap.servers": bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                "sasl.username": self.username, "sasl.password": self.password if password is None else password,
                "client.id": self.client_id, "log_level": 2, **extra}


def make_principal(database_url: str, learner: Learner) -> None:
    """The lane's Kafka principal, as the lab keeps it (store.outside.kafka_principal reads it)."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"CREATE TABLE IF NOT EXISTS {CONTROL_SCHEMA}.kafka_principals (username text PRIMARY "
                              "KEY, lab text NOT NULL, topic text NOT NULL, group_id text NOT NULL, "
                              "password_hash text NOT NULL)"))
            conn.execute(text(f"INSERT INTO {CONTROL_SCHEMA}.kafka_principals VALUES (:u, :l, :t, :g, :h) "
                              "ON CONFLICT (username) DO UPDATE SET password_hash = EXCLUDED.password_hash"),
                         {"u": learner.username, "l": learner.lab.name, "t": learner.lab.topic,
                          "g": learner.group_id, "h": hash_password(learner.password)})
    finally:
        engine.dispose()


@dataclass
class Gateway:
    lab_bootstrap: str  # the lab's own listener: the lab's clients, no authentication
    learner_bootstrap: str  # the learners' gateway
    faults: Faults
    proxy: FaultProxy


@contextmanager
def in_process_gateway(base, database_url: str):
    """A Tansu broker advertising a FaultProxy (its lab listener), which also listens for learners,
    on an event loop in a thread of this process."""
    broker = EmbeddedBroker(base / "tansu.log")
    faults = Faults()
    principals = DatabasePrincipals(database_url)
    loop = asyncio.new_event_loop()
    proxy = FaultProxy((LOOPBACK, 0), (LOOPBACK, broker.port), faults, learner_listen=(LOOPBACK, 0),
                       authenticate=principals.authenticate)
    thread = threading.Thread(target=loop.run_forever, name="gateway-loop")
    try:
        loop.run_until_complete(proxy.start())
        thread.start()
        broker.start(advertised_port=proxy.port)
        yield Gateway(f"{LOOPBACK}:{proxy.port}", f"{LOOPBACK}:{proxy.learner_port}", faults, proxy)
    finally:
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        else:
            loop.run_until_complete(proxy.close())
        loop.close()
        principals.close()
        broker.stop()


def lab_admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})


def create_topics(bootstrap: str, *topics: str) -> None:
    admin = lab_admin(bootstrap)  # kept alive until every future is done
    futures = admin.create_topics([NewTopic(topic, 1, 1) for topic in topics], operation_timeout=10)
    for future in futures.values():
        future.result()


def produce(bootstrap: str, topic: str, count: int, **config) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "log_level": 2, "linger.ms": 0, **config})
    for n in range(count):
        producer.produce(topic, value=f"{topic}-{n}".encode())
    assert producer.flush(30) == 0


@pytest.fixture(scope="module")
def world(services, tmp_path_factory):
    """Alice's and Bob's labs (topics with records, Bob's dead-letter topic too), their principals,
    and the gateway in front of a broker of its own."""
    n = next(_labs)
    alice = Learner(Lab(f"gwalice{n}_{uuid.uuid4().hex[:6]}"), "alice-" + uuid.uuid4().hex)
    bob = Learner(Lab(f"gwbob{n}_{uuid.uuid4().hex[:6]}"), "bob-" + uuid.uuid4().hex)
    for learner in (alice, bob):
        make_principal(services.database_url, learner)
    with in_process_gateway(tmp_path_factory.mktemp("gateway"), services.database_url) as gateway:
        create_topics(gateway.lab_bootstrap, alice.lab.topic, bob.lab.topic, bob.lab.dlq_topic)
        for learner in (alice, bob):
            produce(gateway.lab_bootstrap, learner.lab.topic, RECORDS)
        yield gateway, alice, bob


def consume(consumer: Consumer, count: int, timeout: float = 30) -> list:
    messages: list = []

    def enough() -> bool:
        for message in consumer.consume(count - len(messages), timeout=0.5):
            assert message.error() is None, message.error()
            messages.append(message)
        return len(messages) >= count
    wait_until(enough, timeout=timeout, interval=0, message=lambda: f"consumed {len(messages)} of {count}")
    return messages


def test_alice_consumes_her_labs_topic_and_commits_in_her_group(world):
    gateway, alice, _ = world
    consumer = Consumer(alice.config(gateway.learner_bootstrap, **{
        "group.id": alice.group_id, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}))
    try:
        consumer.subscribe([alice.lab.topic])
        messages = consume(consumer, RECORDS)
        assert [m.value() for m in messages] == [f"{alice.lab.topic}-{n}".encode() for n in range(RECORDS)]
        consumer.commit(messages[-1], asynchronous=False)
        committed = consumer.committed([TopicPartition(alice.lab.topic, 0)], timeout=10)
        assert committed[0].error is None and committed[0].offset == RECORDS
    finally:
        consumer.close()
