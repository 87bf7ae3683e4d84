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
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import support
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
    """The lane's Kafka principal, as the lab keeps it (store.outside.kafka_principal reads it): the
    lane role's row with its Kafka password's hash."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"INSERT INTO {CONTROL_SCHEMA}.outside_roles (role, lab, kafka_password_hash) "
                              "VALUES (:u, :l, :h) ON CONFLICT (role) DO UPDATE SET kafka_password_hash = "
                              "EXCLUDED.kafka_password_hash"),
                         {"u": learner.username, "l": learner.lab.name, "h": hash_password(learner.password)})
    finally:
        engine.dispose()


@dataclass
class Gateway:
    lab_bootstrap: str  # the lab's own listener: the lab's clients, no authentication
    learner_bootstrap: str  # the learners' gateway
    faults: Faults
    proxy: FaultProxy
    loop: asyncio.AbstractEventLoop

    def in_loop(self, call):
        """Run ``call`` on the proxy's event loop (its transports are not thread-safe); its result."""
        async def run():
            return call()
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=10)


@contextmanager
def in_process_gateway(base, database_url: str):
    """A Tansu broker advertising a FaultProxy (its lab listener), which also listens for learners,
    on an event loop in a thread of this process."""
    principals = DatabasePrincipals(database_url)
    try:
        with support.in_process_fault_proxy(base, learner_listen=(LOOPBACK, 0),
                                            authenticate=principals.authenticate) as (proxy, faults, address, loop):
            yield Gateway(address, f"{LOOPBACK}:{proxy.learner_port}", faults, proxy, loop)
    finally:
        principals.close()


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


# --- what librdkafka does with Alice's credentials, refused with Kafka's own codes -------------

def errors_of(config: dict) -> tuple[dict, list[KafkaError]]:
    """``config`` with an error callback, and the list it fills."""
    seen: list[KafkaError] = []
    return {**config, "error_cb": seen.append}, seen


def test_a_wrong_password_is_refused_with_sasl_authentication_failed(world):
    gateway, alice, _ = world
    config, seen = errors_of(alice.config(gateway.learner_bootstrap, password="not-" + alice.password))
    admin = AdminClient(config)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    wait_until(lambda: any(e.code() == KafkaError._AUTHENTICATION for e in seen) or admin.poll(0.2) and False,
               timeout=10, message=lambda: f"no authentication error reported: {seen}")
    failure = next(e for e in seen if e.code() == KafkaError._AUTHENTICATION)
    assert "Authentication failed: Invalid username or password" in failure.str()


def test_an_unknown_user_is_refused_like_a_wrong_password(world):
    gateway, alice, _ = world
    config, seen = errors_of({**alice.config(gateway.learner_bootstrap), "sasl.username": "lab_nobody__mine"})
    admin = AdminClient(config)
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)
    wait_until(lambda: any(e.code() == KafkaError._AUTHENTICATION for e in seen) or admin.poll(0.2) and False,
               timeout=10, message=lambda: f"no authentication error reported: {seen}")


def test_without_sasl_the_learner_listener_answers_nothing_but_api_versions(world):
    gateway, alice, _ = world
    admin = AdminClient({"bootstrap.servers": gateway.learner_bootstrap, "log_level": 0})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=3)


def test_metadata_lists_alices_topic_only(world):
    gateway, alice, bob = world
    admin = AdminClient(alice.config(gateway.learner_bootstrap))
    metadata = admin.list_topics(timeout=10)
    assert set(metadata.topics) == {alice.lab.topic}
    # Every broker is the gateway: a client never learns the lab listener's address from it.
    assert {f"{b.host}:{b.port}" for b in metadata.brokers.values()} == {gateway.learner_bootstrap}
    asked = admin.list_topics(topic=bob.lab.topic, timeout=10).topics[bob.lab.topic]
    assert asked.error is not None and asked.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # The lab's own listener still lists every topic for the lab's clients.
    assert {alice.lab.topic, bob.lab.topic, bob.lab.dlq_topic} <= set(lab_admin(gateway.lab_bootstrap)
                                                                       .list_topics(timeout=10).topics)


def test_alice_cannot_read_bobs_topic(world):
    gateway, alice, bob = world
    consumer = Consumer(alice.config(gateway.learner_bootstrap, **{
        "group.id": alice.group_id, "enable.auto.commit": False, "session.timeout.ms": 6000}))
    try:
        # (A Fetch sent without asking for metadata first: test_a_hand_written_client_...)
        consumer.subscribe([bob.lab.topic])
        codes = set()

        def refused() -> bool:
            for message in consumer.consume(10, timeout=0.5):
                assert message.error() is not None, f"read {message.value()!r} of Bob's topic"
                codes.add(message.error().code())
            return KafkaError.TOPIC_AUTHORIZATION_FAILED in codes
        wait_until(refused, timeout=15, interval=0, message=lambda: f"errors seen: {codes}")
    finally:
        consumer.close()


def test_alice_cannot_join_bobs_group(world):
    gateway, alice, bob = world
    consumer = Consumer(alice.config(gateway.learner_bootstrap, **{"group.id": bob.group_id,
                                                                    "session.timeout.ms": 6000}))
    try:
        consumer.subscribe([alice.lab.topic])
        codes = set()

        def refused() -> bool:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is not None, "consumed in Bob's group"
                codes.add(message.error().code())
            return KafkaError.GROUP_AUTHORIZATION_FAILED in codes
        wait_until(refused, timeout=15, interval=0, message=lambda: f"errors seen: {codes}")
    finally:
        consumer.close()


def group_refusal(admin: AdminClient, group_id: str, topic: str) -> tuple[int, int]:
    """The codes librdkafka reports for committing in ``group_id`` (alter_consumer_group_offsets)
    and reading its offsets (list_consumer_group_offsets) through ``admin``."""
    codes = []
    for futures in (admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
                        group_id, [TopicPartition(topic, 0, 1)])]),
                    admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group_id)])):
        with pytest.raises(KafkaException) as refused:
            futures[group_id].result(timeout=15)
        codes.append(refused.value.args[0].code())
    return codes[0], codes[1]


def test_alice_cannot_commit_or_read_offsets_in_bobs_group(world):
    gateway, alice, bob = world
    admin = AdminClient(alice.config(gateway.learner_bootstrap))
    assert group_refusal(admin, bob.group_id, bob.lab.topic) == (KafkaError.GROUP_AUTHORIZATION_FAILED,) * 2
    # (A consumer of Bob's group hears the same from its coordinator lookup: test_alice_cannot_join_bobs_group.)


def test_alice_cannot_delete_bobs_dead_letter_topic_nor_create_topics(world):
    gateway, alice, bob = world
    admin = AdminClient(alice.config(gateway.learner_bootstrap))
    with pytest.raises(KafkaException) as deleted:
        admin.delete_topics([bob.lab.dlq_topic], operation_timeout=10)[bob.lab.dlq_topic].result()
    assert deleted.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as created:
        admin.create_topics([NewTopic(f"{alice.lab.name}.mine", 1, 1)])[f"{alice.lab.name}.mine"].result()
    assert created.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException) as dropped:
        admin.delete_consumer_groups([bob.group_id])[bob.group_id].result()
    assert dropped.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    assert bob.lab.dlq_topic in lab_admin(gateway.lab_bootstrap).list_topics(timeout=10).topics


def test_alice_cannot_produce_not_even_to_her_own_topic(world):
    gateway, alice, bob = world
    for topic in (alice.lab.topic, bob.lab.topic):
        producer = Producer(alice.config(gateway.learner_bootstrap, **{"message.timeout.ms": 10000}))
        reports: list = []
        producer.produce(topic, value=b"forged", on_delivery=lambda error, message: reports.append(error))
        producer.flush(15)
        assert len(reports) == 1 and reports[0] is not None, reports
        assert reports[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, (topic, reports[0])


def test_list_groups_shows_alices_group_only(world):
    gateway, alice, bob = world
    # The groups made on the lab's listener (Tansu lists a group once a member has joined and
    # committed), as the lab's own consumers make theirs.
    consumers = [Consumer({"bootstrap.servers": gateway.lab_bootstrap, "log_level": 2, "group.id": learner.group_id,
                           "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000})
                 for learner in (alice, bob)]
    try:
        for consumer, learner in zip(consumers, (alice, bob)):
            consumer.subscribe([learner.lab.topic])
        assigned = [False, False]

        def both_assigned() -> bool:
            for n, consumer in enumerate(consumers):
                consumer.poll(0.2)
                assigned[n] = assigned[n] or bool(consumer.assignment())
            return all(assigned)
        wait_until(both_assigned, timeout=30, interval=0, message=lambda: f"assigned: {assigned}")
        for consumer, learner in zip(consumers, (alice, bob)):
            consumer.commit(offsets=[TopicPartition(learner.lab.topic, 0, 1)], asynchronous=False)
    finally:
        for consumer in consumers:
            consumer.close()
    admin = lab_admin(gateway.lab_bootstrap)  # each admin client kept until its future is done
    listed = {g.group_id for g in admin.list_consumer_groups().result(timeout=10).valid}
    assert {alice.group_id, bob.group_id} <= listed
    admin = AdminClient(alice.config(gateway.learner_bootstrap))
    groups = {g.group_id for g in admin.list_consumer_groups().result(timeout=10).valid}
    assert alice.group_id in groups and bob.group_id not in groups
    assert all(Lab.of_group_id(group) == alice.lab for group in groups), groups


def test_a_moved_group_of_alices_lane_is_hers(world):
    gateway, alice, bob = world
    moved = alice.lab.moved_group_id(LANE, 3)
    consumer = Consumer(alice.config(gateway.learner_bootstrap, **{"group.id": moved, "enable.auto.commit": False}))
    try:
        consumer.commit(offsets=[TopicPartition(alice.lab.topic, 0, 1)], asynchronous=False)
        assert consumer.committed([TopicPartition(alice.lab.topic, 0)], timeout=10)[0].offset == 1
    finally:
        consumer.close()
    admin = AdminClient(alice.config(gateway.learner_bootstrap))
    for lookalike in (f"{alice.group_id}.r", f"{alice.group_id}.r1x", f"{alice.group_id}x", f"{alice.group_id}.r1.r2",
                      f"{alice.group_id}.r+1"):
        assert group_refusal(admin, lookalike, alice.lab.topic) == (KafkaError.GROUP_AUTHORIZATION_FAILED,) * 2


# --- a hand-written client: the requests librdkafka would never send in that order ----------------

class RawClient:
    """One connection speaking Kafka with kafka-python's protocol classes (an encoder independent of
    the gateway's): each request framed with a v1 header, each answer decoded as its response type."""

    def __init__(self, bootstrap: str, client_id: str = "raw-client"):
        host, _, port = bootstrap.rpartition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.client_id = client_id
        self.correlation_ids = itertools.count(1)

    def close(self) -> None:
        self.sock.close()

    def send_raw(self, payload: bytes) -> None:
        self.sock.sendall(struct.pack(">i", len(payload)) + payload)

    def receive_raw(self) -> bytes | None:
        """One frame's body; None when the gateway closed the connection."""
        prefix = self._exactly(4)
        if prefix is None:
            return None
        return self._exactly(struct.unpack(">i", prefix)[0])

    def _exactly(self, size: int) -> bytes | None:
        data = b""
        while len(data) < size:
            try:
                chunk = self.sock.recv(size - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def ask(self, request):
        """Send ``request``; its decoded answer, or None when the connection was closed instead."""
        from io import BytesIO

        from kafka.protocol.api import RequestHeader
        correlation_id = next(self.correlation_ids)
        # kafka-python binds encode() weakly: the header must outlive the call.
        header = RequestHeader(request, correlation_id=correlation_id, client_id=self.client_id)
        self.send_raw(header.encode() + request.encode())
        body = self.receive_raw()
        if body is None:
            return None
        assert struct.unpack(">i", body[:4])[0] == correlation_id
        return request.RESPONSE_TYPE.decode(BytesIO(body[4:]))

    def sign_in(self, username: str, password: str):
        from kafka.protocol.admin import SaslAuthenticateRequest_v0, SaslHandShakeRequest_v1
        handshake = self.ask(SaslHandShakeRequest_v1("PLAIN"))
        assert handshake.error_code == 0 and handshake.enabled_mechanisms == ["PLAIN"]
        return self.ask(SaslAuthenticateRequest_v0(f"\0{username}\0{password}".encode()))


@contextmanager
def raw_client(gateway: Gateway, learner: Learner | None):
    client = RawClient(gateway.learner_bootstrap, learner.client_id if learner else "raw-client")
    try:
        if learner is not None:
            answer = client.sign_in(learner.username, learner.password)
            assert answer.error_code == 0, answer
        yield client
    finally:
        client.close()


def test_before_authentication_only_api_versions_and_sasl_pass(world):
    from kafka.protocol.admin import ApiVersionRequest_v1, SaslAuthenticateRequest_v0, SaslHandShakeRequest_v1
    from kafka.protocol.metadata import MetadataRequest_v1
    gateway, alice, _ = world
    with raw_client(gateway, None) as client:
        versions = {key: (low, high) for key, low, high in client.ask(ApiVersionRequest_v1()).api_versions}
        assert versions[17] == (0, 1) and versions[36] == (0, 2), "the SASL APIs the gateway answers itself"
        assert versions[3][1] <= 8 and versions[1][1] <= 11, "capped below the first flexible versions"
        assert 71 not in versions and 32 not in versions, "APIs the gateway does not serve are not offered"
        assert client.ask(MetadataRequest_v1(None)) is None, "a request before authentication closes the connection"
    with raw_client(gateway, None) as client:
        assert client.ask(SaslHandShakeRequest_v1("SCRAM-SHA-512")).error_code == 33  # UNSUPPORTED_SASL_MECHANISM
    with raw_client(gateway, None) as client:
        assert client.ask(SaslHandShakeRequest_v1("PLAIN")).error_code == 0
        refused = client.ask(SaslAuthenticateRequest_v0(f"\0{alice.username}\0wrong".encode()))
        assert refused.error_code == 58 and "Authentication failed" in refused.error_message
        assert client.receive_raw() is None, "a failed authentication closes the connection"
    with raw_client(gateway, None) as client:  # an authorization id other than the user's is refused
        client.ask(SaslHandShakeRequest_v1("PLAIN"))
        assert client.ask(SaslAuthenticateRequest_v0(
            f"{alice.lab.lane_role('other')}\0{alice.username}\0{alice.password}".encode())).error_code == 58


def test_malformed_or_oversized_requests_close_the_connection(world):
    from kafka.protocol.metadata import MetadataRequest_v1
    gateway, alice, _ = world
    with raw_client(gateway, None) as client:  # before authentication a frame is a few hundred bytes at most
        client.send_raw(struct.pack(">hhih", 17, 1, 1, 0) + b"x" * (600 * 1024))
        assert client.receive_raw() is None
    with raw_client(gateway, alice) as client:  # a Metadata request cut short
        client.send_raw(struct.pack(">hhih", 3, 1, 7, 0) + struct.pack(">i", 3) + b"\x00")
        assert client.receive_raw() is None
    with raw_client(gateway, alice) as client:  # an API the gateway does not serve (DescribeConfigs)
        client.send_raw(struct.pack(">hhih", 32, 0, 8, 0) + struct.pack(">i", 0))
        assert client.receive_raw() is None
    with raw_client(gateway, alice) as client:  # the gateway still serves the next connection
        assert [t[1] for t in client.ask(MetadataRequest_v1([alice.lab.topic])).topics] == [alice.lab.topic]


def test_a_v0_handshake_takes_the_bare_token(world):
    from kafka.protocol.admin import SaslHandShakeRequest_v0
    from kafka.protocol.metadata import MetadataRequest_v1
    gateway, alice, _ = world
    with raw_client(gateway, None) as client:
        assert client.ask(SaslHandShakeRequest_v0("PLAIN")).error_code == 0
        client.send_raw(f"\0{alice.username}\0{alice.password}".encode())
        assert client.receive_raw() == b""
        assert [t[1] for t in client.ask(MetadataRequest_v1(None)).topics] == [alice.lab.topic]
    with raw_client(gateway, None) as client:
        client.ask(SaslHandShakeRequest_v0("PLAIN"))
        client.send_raw(f"\0{alice.username}\0nope".encode())
        assert client.receive_raw() is None


def test_a_hand_written_client_is_refused_bobs_topic_and_group_on_every_request(world):
    from kafka.protocol.commit import OffsetCommitRequest_v2, OffsetFetchRequest_v1, OffsetFetchRequest_v3
    from kafka.protocol.fetch import FetchRequest_v4
    from kafka.protocol.group import HeartbeatRequest_v1, JoinGroupRequest_v2, SyncGroupRequest_v1
    from kafka.protocol.offset import OffsetRequest_v2
    gateway, alice, bob = world
    with raw_client(gateway, alice) as client:
        fetched = client.ask(FetchRequest_v4(-1, 100, 1, 1 << 20, 0, [(bob.lab.topic, [(0, 0, 1 << 20)])]))
        assert [(t[0], [(p[0], p[1]) for p in t[1]]) for t in fetched.topics] == [(bob.lab.topic, [(0, 29)])]
        assert all(not p[-1] for t in fetched.topics for p in t[1]), "no record of Bob's"
        # Her topic and his in one Fetch: hers answered with her records, his refused.
        both = client.ask(FetchRequest_v4(-1, 100, 1, 1 << 20, 0, [(alice.lab.topic, [(0, 0, 1 << 20)]),
                                                                    (bob.lab.topic, [(0, 0, 1 << 20)])]))
        answers = {t[0]: t[1][0] for t in both.topics}
        assert answers[alice.lab.topic][1] == 0 and answers[alice.lab.topic][-1], "her records come back"
        assert answers[bob.lab.topic][1] == 29 and not answers[bob.lab.topic][-1]
        # Posing as a follower broker, on her own topic: refused (CLUSTER_ACTION).
        follower = client.ask(FetchRequest_v4(1, 100, 1, 1 << 20, 0, [(alice.lab.topic, [(0, 0, 1 << 20)])]))
        assert follower.topics[0][1][0][1] == 29 and not follower.topics[0][1][0][-1]
        offsets = client.ask(OffsetRequest_v2(-1, 0, [(bob.lab.topic, [(0, -1)])]))
        assert offsets.topics[0][1][0][1] == 29
        commit = client.ask(OffsetCommitRequest_v2(bob.group_id, -1, "", -1, [(bob.lab.topic, [(0, 3, "")])]))
        assert commit.topics[0][1][0][1] == 30
        commit = client.ask(OffsetCommitRequest_v2(alice.group_id, -1, "", -1, [(bob.lab.topic, [(0, 3, "")])]))
        assert commit.topics[0][1][0][1] == 29, "her group, his topic"
        fetched_offsets = client.ask(OffsetFetchRequest_v3(bob.group_id, None))
        assert fetched_offsets.error_code == 30 and fetched_offsets.topics == []
        fetched_offsets = client.ask(OffsetFetchRequest_v1(bob.group_id, [(bob.lab.topic, [0])]))
        assert fetched_offsets.topics[0][1][0][-1] == 30
        joined = client.ask(JoinGroupRequest_v2(bob.group_id, 6000, 6000, "", "consumer",
                                                [("range", b"")]))
        assert joined.error_code == 30
        assert client.ask(SyncGroupRequest_v1(bob.group_id, 1, "m", [])).error_code == 30
        assert client.ask(HeartbeatRequest_v1(bob.group_id, 1, "m")).error_code == 30
    # Bob's group never saw any of it: offset 3 was never committed there (another test may commit 1).
    admin = lab_admin(gateway.lab_bootstrap)
    offsets = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(
        bob.group_id, [TopicPartition(bob.lab.topic, 0)])])[bob.group_id].result(timeout=10)
    assert offsets.topic_partitions[0].offset != 3


def test_refusals_of_writes_come_in_the_requests_version(world):
    from kafka.protocol.admin import CreatePartitionsRequest_v0, DeleteGroupsRequest_v1, DeleteTopicsRequest_v1
    from kafka.protocol.produce import ProduceRequest_v3
    gateway, alice, bob = world
    with raw_client(gateway, alice) as client:
        produced = client.ask(ProduceRequest_v3(None, 1, 1000, [(alice.lab.topic, [(0, b"")])]))
        assert produced.topics[0][1][0][1] == 29
        deleted = client.ask(DeleteTopicsRequest_v1([bob.lab.dlq_topic, alice.lab.topic], 1000))
        assert [(name, error) for name, error in deleted.topic_error_codes] == [(bob.lab.dlq_topic, 29),
                                                                               (alice.lab.topic, 29)]
        grown = client.ask(CreatePartitionsRequest_v0([(alice.lab.topic, (4, None))], 1000, False))
        assert grown.topic_errors[0][1] == 29
        dropped = client.ask(DeleteGroupsRequest_v1([alice.group_id]))
        assert dropped.results[0][1] == 30, "deleting a group needs DELETE, which no lane has, on its own either"
    assert {alice.lab.topic, bob.lab.dlq_topic} <= set(lab_admin(gateway.lab_bootstrap).list_topics(timeout=10).topics)


# --- the lab's faults reach a learner's connections through the gateway ----------------------------

def test_cut_and_commit_block_act_on_a_learners_connections_by_client_id(world):
    gateway, alice, bob = world
    consumer = Consumer(alice.config(gateway.learner_bootstrap, **{
        "group.id": alice.lab.moved_group_id(LANE, 7), "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}))
    try:
        consumer.subscribe([alice.lab.topic])
        messages = consume(consumer, 2)
        assert gateway.in_loop(lambda: gateway.faults.cut(bob.lab.name, [alice.client_id])) == 0, \
            "Bob's lab cannot cut Alice's consumer"
        assert gateway.in_loop(lambda: gateway.faults.cut(alice.lab.name, [alice.client_id])) >= 1
        gateway.faults.block_commits(alice.lab.name, {alice.client_id})
        with pytest.raises(KafkaException):
            consumer.commit(messages[-1], asynchronous=False)
        assert gateway.faults.of(alice.lab.name).commits_blocked >= 1
        gateway.faults.block_commits(alice.lab.name, set())

        def committed() -> bool:
            try:
                consumer.commit(messages[-1], asynchronous=False)
            except KafkaException:
                return False  # the cut connection is still being re-made
            return True
        wait_until(committed, timeout=30, message="the commit never got through again")
    finally:
        consumer.close()


# --- the fault proxy process of a stack: its learners' listener, next to the lab's ------------------

def test_the_stacks_fault_proxy_process_serves_learners_and_the_labs_clients(proxied_stack):
    """``Stack(fault_proxy=True)`` starts the proxy process with ``--learner-listen``: a learner's
    consumer reads its topic through it; the lab's clients keep their own listener, unauthenticated."""
    stack = proxied_stack
    learner = Learner(Lab(f"gwproc{next(_labs)}_{uuid.uuid4().hex[:6]}"), "p-" + uuid.uuid4().hex)
    other = Lab(f"gwother{next(_labs)}_{uuid.uuid4().hex[:6]}")
    make_principal(stack.database_url, learner)
    assert stack.learner_bootstrap_servers and stack.env()["KAFKA_LEARNER_BOOTSTRAP_SERVERS"] == \
        stack.learner_bootstrap_servers
    create_topics(stack.bootstrap_servers, learner.lab.topic, other.topic)
    produce(stack.producer_bootstrap_servers, learner.lab.topic, RECORDS)  # the lab's listener, as the lab's producer
    consumer = Consumer(learner.config(stack.learner_bootstrap_servers, **{
        "group.id": learner.group_id, "auto.offset.reset": "earliest", "enable.auto.commit": False,
        "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}))
    try:
        consumer.subscribe([learner.lab.topic])
        messages = consume(consumer, RECORDS)
        consumer.commit(messages[-1], asynchronous=False)
    finally:
        consumer.close()
    admin = AdminClient(learner.config(stack.learner_bootstrap_servers))
    assert set(admin.list_topics(timeout=10).topics) == {learner.lab.topic}
    admin = lab_admin(stack.producer_bootstrap_servers)
    assert {learner.lab.topic, other.topic} <= set(admin.list_topics(timeout=10).topics)


# --- Apache Kafka (compose): the same rights as SCRAM users and ACLs ------------------------------------
# No docker daemon runs where these tests run: the compose file is read, and the admin calls'
# ACLs are checked as values (Tansu answers CreateAcls with something librdkafka aborts on).

def test_compose_kafka_has_a_scram_listener_for_learners_and_an_authorizer():
    from pathlib import Path

    import yaml
    compose = yaml.safe_load((Path(__file__).resolve().parents[1] / "docker-compose.yml").read_text())
    kafka = compose["services"]["kafka"]["environment"]
    protocols = dict(item.split(":") for item in kafka["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert protocols["LEARNERS"] == "SASL_PLAINTEXT"
    assert "LEARNERS://:9095" in kafka["KAFKA_LISTENERS"].split(",")
    assert kafka["KAFKA_LISTENER_NAME_LEARNERS_SASL_ENABLED_MECHANISMS"] == "SCRAM-SHA-512"
    assert "ScramLoginModule required" in kafka["KAFKA_LISTENER_NAME_LEARNERS_SCRAM___SHA___512_SASL_JAAS_CONFIG"]
    assert kafka["KAFKA_AUTHORIZER_CLASS_NAME"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert kafka["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    # The lab's own listeners stay as they were: plaintext, their anonymous principal a super user.
    assert kafka["KAFKA_SUPER_USERS"] == "User:ANONYMOUS"
    assert {protocols[name] for name in ("PLAINTEXT", "PROXIED", "CONTROLLER")} == {"PLAINTEXT"}
    for name in ("kafka-2", "kafka-3"):
        assert "LEARNERS://:9095" in compose["services"][name]["environment"]["KAFKA_LISTENERS"]
    lab = compose["services"]["web"]["environment"]
    assert lab["KAFKA_LEARNER_SASL_MECHANISM"] == "SCRAM-SHA-512"
    # What /yours shows is the address Kafka advertises on LEARNERS: one variable sets both.
    assert lab["KAFKA_LEARNER_BOOTSTRAP_SERVERS"] == "${LAB_KAFKA_LEARNER_ADDRESS:-localhost:9095}"
    assert "LEARNERS://${LAB_KAFKA_LEARNER_ADDRESS:-localhost:9095}" in \
        compose["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]


def test_a_lanes_acls_grant_its_topic_read_and_its_groups_only():
    from confluent_kafka.admin import AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    from webapp.kafka.admin import lane_acl_bindings
    lab = Lab("acl")
    bindings = lane_acl_bindings(lab.lane_role(LANE), lab.topic, lab.group_id(LANE))
    assert {(b.restype, b.name, b.resource_pattern_type, b.operation) for b in bindings} == {
        (ResourceType.TOPIC, lab.topic, ResourcePatternType.LITERAL, AclOperation.READ),
        (ResourceType.TOPIC, lab.topic, ResourcePatternType.LITERAL, AclOperation.DESCRIBE),
        (ResourceType.GROUP, lab.group_id(LANE), ResourcePatternType.LITERAL, AclOperation.READ),
        (ResourceType.GROUP, f"{lab.group_id(LANE)}.r", ResourcePatternType.PREFIXED, AclOperation.READ)}
    assert {(b.principal, b.host, b.permission_type) for b in bindings} == {
        (f"User:{lab.lane_role(LANE)}", "*", AclPermissionType.ALLOW)}
    # The prefixed ACL covers the lab's moves of this lane's group and no other lane's group.
    prefix = f"{lab.group_id(LANE)}.r"
    assert lab.moved_group_id(LANE, 12).startswith(prefix)
    assert not lab.group_id(f"{LANE}2").startswith(prefix) and not lab.group_id("r").startswith(prefix)


def test_a_lanes_scram_user_is_made_through_the_admin_api(tmp_path):
    """The SCRAM half of create_lane_principal, on the embedded broker (which accepts the call)."""
    from webapp.kafka.admin import admin_client, upsert_scram_user
    broker = EmbeddedBroker(tmp_path / "tansu.log").start()
    try:
        admin = admin_client(broker.bootstrap_servers)
        upsert_scram_user(admin, Lab("scram").lane_role(LANE), "a-password")
        upsert_scram_user(admin, Lab("scram").lane_role(LANE), "another")  # again: the password replaced
    finally:
        broker.stop()


def test_kafka_python_reads_through_the_gateway_too(world):
    """Another client library than librdkafka, as a learner may bring: kafka-python 2.0.6, SASL/PLAIN."""
    from kafka import KafkaConsumer, OffsetAndMetadata
    from kafka import TopicPartition as KafkaPythonPartition
    gateway, alice, bob = world
    consumer = KafkaConsumer(bootstrap_servers=gateway.learner_bootstrap, security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username=alice.username,
                             sasl_plain_password=alice.password, client_id=alice.client_id,
                             group_id=alice.lab.moved_group_id(LANE, 9), enable_auto_commit=False,
                             auto_offset_reset="earliest", api_version_auto_timeout_ms=10000)
    try:
        assert consumer.topics() == {alice.lab.topic}
        partition = KafkaPythonPartition(alice.lab.topic, 0)
        consumer.assign([partition])
        records: list = []
        wait_until(lambda: records.extend(r for batch in consumer.poll(500).values() for r in batch)
                   or len(records) >= RECORDS, timeout=20, interval=0, message=lambda: f"read {len(records)}")
        assert records[0].value == f"{alice.lab.topic}-0".encode()
        consumer.commit({partition: OffsetAndMetadata(RECORDS, "")})
        assert consumer.committed(partition) == RECORDS
    finally:
        consumer.close()


def test_a_client_id_naming_another_lab_puts_no_connection_under_that_labs_faults(world):
    gateway, alice, bob = world
    consumer = Consumer({**alice.config(gateway.learner_bootstrap), "client.id": bob.client_id,
                         "group.id": alice.group_id, "enable.auto.commit": False})
    try:
        assert consumer.committed([TopicPartition(alice.lab.topic, 0)], timeout=10)[0].error is None
        assert bob.client_id not in gateway.in_loop(gateway.faults.connected_clients)
        assert gateway.in_loop(lambda: gateway.faults.cut(bob.lab.name, [bob.client_id])) == 0
    finally:
        consumer.close()


# --- settings -------------------------------------------------------------------------------------------

def test_a_gateway_on_every_address_needs_the_address_learners_reach(tmp_path):
    from webapp.settings import ConfigError, load_config
    base = {"LAB_DATA_DIR": str(tmp_path)}
    with pytest.raises(ConfigError, match="KAFKA_LEARNER_BOOTSTRAP_SERVERS"):
        load_config({**base, "KAFKA_LEARNER_LISTEN": "0.0.0.0:9095"}, env_file=None)
    with pytest.raises(ConfigError, match="KAFKA_LEARNER_LISTEN: value error, expected host:port"):
        load_config({**base, "KAFKA_LEARNER_LISTEN": "9095"}, env_file=None)
    config = load_config({**base, "KAFKA_LEARNER_LISTEN": "0.0.0.0:9095",
                          "KAFKA_LEARNER_BOOTSTRAP_SERVERS": "lab.example:9095"}, env_file=None)
    assert (config["KAFKA_LEARNER_LISTEN"], config["KAFKA_LEARNER_BOOTSTRAP_SERVERS"]) == ("0.0.0.0:9095",
                                                                                         "lab.example:9095")
    assert config["KAFKA_LEARNER_SASL_MECHANISM"] == "PLAIN"


def test_a_fetch_session_is_never_opened_through_the_gateway(world):
    """A fetch session's id is the broker's: an incremental fetch naming no topic could read
    another client's session. The gateway sends every Fetch as a full fetch without one."""
    from io import BytesIO

    from kafka.protocol.fetch import FetchResponse_v7

    from webapp.faultproxy.messages import FETCH_REQUEST
    from webapp.faultproxy.wire import encode
    gateway, alice, bob = world
    with raw_client(gateway, alice) as client:
        def fetch(session_id: int, epoch: int, topics: list):
            body = encode(FETCH_REQUEST, 7, {"replica_id": -1, "max_wait_ms": 100, "min_bytes": 0,
                                              "max_bytes": 1 << 20, "session_id": session_id,
                                              "session_epoch": epoch, "topics": topics})
            client.send_raw(struct.pack(">hhih", 1, 7, 99, len(client.client_id)) + client.client_id.encode()
                            + body)
            answer = client.receive_raw()
            return FetchResponse_v7.decode(BytesIO(answer[4:]))
        opened = fetch(0, 0, [{"topic": alice.lab.topic, "partitions": [
            {"partition": 0, "fetch_offset": 0, "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}])
        assert opened.session_id == 0, "asked to open a session (epoch 0), the client got none"
        guessed = fetch(1, 1, [])  # an incremental fetch of someone's session 1
        assert guessed.topics == [] and guessed.session_id == 0
