"""The lost-ack fault proxy, on real frames: a real librdkafka producer through it to a Tansu broker
that advertises the proxy, then exercise 7 end to end (agent, consumers, PostgreSQL), and two labs
whose faults are each their own.

The session broker does not advertise a proxy: the in-process tests have a broker of their own,
and the integration tests run on the session's proxied stack (its own PostgreSQL, broker, fault
proxy and lab agent: the ``proxied_stack`` fixture), so every command below names its agent.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from dataclasses import dataclass
from typing import Callable

import psutil
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from support import LabDriver, in_process_fault_proxy
from webapp import ops
from webapp.dev.embedded import EmbeddedBroker
from webapp.domain.lab import Lab
from webapp.domain.vocabulary import FAULT_PROXY_FRESH_SECONDS
from webapp.domain.waits import wait_until
from webapp.faultproxy.control import CHANNEL, DEFAULT_NAME
from webapp.faultproxy.faults import Faults
from webapp.faultproxy.protocol import OFFSET_COMMIT, PRODUCE, RequestHeader
from webapp.faultproxy.proxy import FaultProxy
from webapp.kafka.admin import admin_client, committed_offsets
from webapp.logreader.reader import LOG_READER_CLIENT_ID
from webapp.readmodel import partitions as partitions_readmodel
from webapp.readmodel.partitions import Cell
from webapp.store import command_channel, faultproxies
from webapp.store.connection import sqlalchemy_url
from webapp.store.labs import create_database_state, ensure_control_schema
from webapp.web.db import lab_session

API_VERSIONS, METADATA = 18, 3
CREDIT = 1000  # cents of the event whose ack is lost
SENTINEL = 1  # cents of the event published after it, on the same key: read it and the log before it is read


def quiet(config: dict) -> dict:
    # librdkafka logs the proxy's dropped connections as errors: they are the point here.
    return {"log_level": 2, **config}


def create_topic(bootstrap: str, topic: str, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 2})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=10).values():
        future.result()


# The in-process proxy's faults are armed for this lab: they act on its clients' requests only.
FP_LAB = Lab("fp")


def produce(bootstrap: str, topic: str, values: list[bytes], idempotent: bool,
            client_id: str = FP_LAB.producer_client_id) -> list:
    """Produce and wait for every delivery report; returns (error, offset) per value."""
    producer = Producer(quiet({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all",
                               "enable.idempotence": idempotent, "linger.ms": 0, "retry.backoff.ms": 200,
                               "message.timeout.ms": 20000}))
    reports: list = []
    for value in values:
        while True:
            try:
                producer.produce(topic, value=value,
                                 on_delivery=lambda error, message: reports.append((error, message.offset())))
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(60) == 0, "records left unacknowledged"
    return reports


def read_back(bootstrap: str, topic: str, partition: int, until, timeout: float = 30) -> list[tuple[int, bytes]]:
    """(offset, value) from the partition's start until ``until(records)`` holds."""
    consumer = Consumer(quiet({"bootstrap.servers": bootstrap, "group.id": f"reader-{uuid.uuid4()}",
                               "enable.auto.commit": False}))
    records: list[tuple[int, bytes]] = []
    try:
        consumer.assign([TopicPartition(topic, partition, 0)])

        def done():
            for message in consumer.consume(1000, timeout=0.5):
                assert message.error() is None, message.error()
                records.append((message.offset(), message.value()))
            return until(records)
        wait_until(done, timeout=timeout, interval=0, message=lambda: f"read {len(records)} record(s) of {topic}")
    finally:
        consumer.close()
    return records


# --- every fault is one lab's: matched by the client id that names the lab ------------------

def test_a_labs_faults_match_only_requests_whose_client_id_names_that_lab():
    """Pure logic: the faults lab a armed answer only requests of a's clients; a lab whose name
    starts like a's (ab), another lab (b), and clients of no lab (admin, log reader) pass."""
    faults, a, b = Faults(), Lab("a"), Lab("b")
    faults.arm("a", drop_produce_responses=1, delay_ms=100)
    faults.block_commits("a", {a.client_id("c1"), b.client_id("c1")})  # b's consumer is not a's to block
    faults.cut_clients = len  # closes, here, one connection per client id it is given

    def request(api_key: int, client_id: str | None) -> RequestHeader:
        return RequestHeader(api_key, 9, 1, client_id)
    others = [b.producer_client_id, Lab("ab").producer_client_id, "rdkafka", LOG_READER_CLIENT_ID, None]
    for client in others:
        assert faults.delay_for(request(PRODUCE, client)) == 0, client
        assert not asyncio.run(faults.take_drop(request(PRODUCE, client))), client
    assert not faults.blocks_commit(request(OFFSET_COMMIT, b.client_id("c1")))
    assert faults.blocks_commit(request(OFFSET_COMMIT, a.client_id("c1")))
    assert faults.delay_for(request(PRODUCE, a.producer_client_id)) == 0.1
    assert asyncio.run(faults.take_drop(request(PRODUCE, a.producer_client_id)))
    assert faults.cut("a", [a.producer_client_id, b.producer_client_id, b.client_id("c1")]) == 1
    assert (faults.of("a").responses_dropped, faults.of("a").connections_cut) == (1, 1)
    for other in ("b", "ab"):
        assert not faults.of(other).armed and faults.of(other).responses_dropped == faults.of(other).commits_blocked == 0


# --- the proxy alone, in this process: frames, drops, delays --------------------------------

@dataclass
class InProcessProxy:
    proxy: FaultProxy
    faults: Faults
    frames: list[tuple[str, RequestHeader | None, int]]
    address: str


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """A Tansu broker advertising a FaultProxy in this process, every frame it sees recorded."""
    frames: list = []
    with in_process_fault_proxy(tmp_path_factory.mktemp("in_process"), observer=lambda direction, request,
                                correlation_id: frames.append((direction, request, correlation_id))) as (
            proxy, faults, address, _loop):
        yield InProcessProxy(proxy, faults, frames, address)


def test_frames_are_parsed_on_real_traffic(in_process):
    in_process.frames.clear()
    topic = f"frames-{uuid.uuid4().hex[:8]}"
    create_topic(in_process.address, topic)
    reports = produce(in_process.address, topic, [b"a", b"b", b"c"], idempotent=True, client_id="fp-frames")
    assert [error for error, _ in reports] == [None, None, None]

    frames = list(in_process.frames)
    requests = [request for direction, request, _ in frames if direction == "request"]
    responses = [(request, correlation_id) for direction, request, correlation_id in frames if direction == "response"]
    # librdkafka opens every connection with ApiVersions, then asks for metadata.
    assert frames[0][0] == "request" and frames[0][1].api_key == API_VERSIONS
    assert METADATA in {r.api_key for r in requests}
    produce_requests = [r for r in requests if r.api_key == PRODUCE]
    assert produce_requests and all(r.client_id == "fp-frames" for r in produce_requests)
    assert all(3 <= r.api_version <= 13 for r in produce_requests), [r.api_version for r in produce_requests]
    assert all(0 <= r.api_key < 100 and 0 <= r.api_version < 30 for r in requests)
    # Every response matched the request it answers, by correlation id on its connection.
    assert all(request is not None and request.correlation_id == cid for request, cid in responses)
    answered_produce = [request for request, _ in responses if request.api_key == PRODUCE]
    assert len(answered_produce) == len(produce_requests)


@pytest.mark.parametrize("idempotent, copies", [(False, 2), (True, 1)], ids=["plain-producer", "idempotent-producer"])
def test_a_dropped_produce_response_makes_librdkafka_retry(in_process, idempotent, copies):
    topic = f"drop-{uuid.uuid4().hex[:8]}"
    create_topic(in_process.address, topic)
    dropped_before = in_process.faults.responses_dropped
    in_process.faults.arm(FP_LAB.name, drop_produce_responses=1)
    try:
        reports = produce(in_process.address, topic, [b"the event", b"sentinel"], idempotent)
    finally:
        in_process.faults.arm(FP_LAB.name, 0, 0)
    assert [error for error, _ in reports] == [None, None]
    assert in_process.faults.responses_dropped == dropped_before + 1
    records = read_back(in_process.address, topic, 0, lambda r: any(v == b"sentinel" for _, v in r))
    assert [v for _, v in records].count(b"the event") == copies, records


def test_a_delay_holds_produce_responses(in_process):
    topic = f"delay-{uuid.uuid4().hex[:8]}"
    create_topic(in_process.address, topic)
    produce(in_process.address, topic, [b"warm-up"], idempotent=True)
    delayed_before = in_process.faults.responses_delayed
    in_process.faults.arm(FP_LAB.name, delay_ms=400)
    try:
        started = time.monotonic()
        reports = produce(in_process.address, topic, [b"slow"], idempotent=True)
        elapsed = time.monotonic() - started
    finally:
        in_process.faults.arm(FP_LAB.name, 0, 0)
    assert reports[0][0] is None
    assert elapsed >= 0.4
    assert in_process.faults.responses_delayed > delayed_before


@pytest.mark.long
def test_a_blocked_clients_offset_commits_never_reach_the_broker_while_its_fetches_flow(in_process):
    blocked_client = FP_LAB.client_id("blocked")
    topic = f"commits-{uuid.uuid4().hex[:8]}"
    create_topic(in_process.address, topic)
    produce(in_process.address, topic, [b"first", b"second", b"third"], idempotent=True)
    consumer = Consumer(quiet({"bootstrap.servers": in_process.address, "group.id": f"g-{topic}",
                               "client.id": blocked_client, "enable.auto.commit": False,
                               "auto.offset.reset": "earliest"}))

    def next_record():
        got = []

        def arrived() -> bool:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                got.append(message)
            return bool(got)
        wait_until(arrived, timeout=30, interval=0, message=f"no record came from {topic}")
        return got[0]

    # What the broker holds, asked by a client of its own: the proxy cuts the blocked client's
    # connection to the coordinator, and that client's own OffsetFetch could wait behind it.
    admin = admin_client(in_process.address)

    def committed() -> int | None:
        return committed_offsets(admin, f"g-{topic}", topic)[0]

    blocked_before = in_process.faults.commits_blocked
    try:
        consumer.subscribe([topic])
        consumer.commit(message=next_record(), asynchronous=False)
        assert committed() == 1
        in_process.faults.block_commits(FP_LAB.name, {blocked_client})
        second = next_record()  # fetched through the proxy while commits are blocked
        assert second.value() == b"second"
        with pytest.raises(KafkaException) as failed:
            consumer.commit(message=second, asynchronous=False)
        assert failed.value.args[0].code() == KafkaError._TRANSPORT
        consumer.commit(message=second, asynchronous=True)  # returns at once: nothing says it is lost
        assert committed() == 1, "a blocked commit reached the broker"
        assert in_process.faults.commits_blocked > blocked_before
        in_process.faults.block_commits(FP_LAB.name, set())
        consumer.commit(message=second, asynchronous=False)
        assert committed() == 2
    finally:
        in_process.faults.block_commits(FP_LAB.name, set())
        consumer.close()


# --- the proxy as the lab runs it: its own process, armed through PostgreSQL ---------------

@dataclass
class Stack:
    broker: EmbeddedBroker
    proxy: subprocess.Popen
    proxy_address: str
    agent_id: str
    engine: Engine


@pytest.fixture(scope="module")
def stack(proxied_stack):
    """The session's proxied stack: a broker advertising a fault proxy process, and a lab agent
    whose producer goes through it (webapp/dev/stack.py)."""
    engine = proxied_stack.engine()
    try:
        with engine.connect() as conn:
            agent_id = conn.execute(text("SELECT id FROM lab_control.agents WHERE pid = :pid"),
                                    {"pid": proxied_stack.agent.pid}).scalar_one()
        yield Stack(proxied_stack.broker, proxied_stack.fault_proxy, proxied_stack.producer_bootstrap_servers,
                    agent_id, engine)
    finally:
        engine.dispose()


class ProxiedLab(LabDriver):
    """A LabDriver whose agent commands go to the module's agent (the one behind the proxy)."""

    def __init__(self, client, lab: Lab, stack: Stack):
        super().__init__(client, lab)
        self.stack = stack
        self.engine = stack.engine

    def command(self, verb: str, args: dict) -> dict:
        return command_channel.run(self.engine, self.lab.name, verb, args, agent_id=self.stack.agent_id, timeout=60)

    def publish_credit(self, amount_cents: int, idempotent: bool) -> dict:
        result = self.command("publish", {"mode": "normal", "type": "credit", "account_id": "acc-1",
                                          "amount_cents": amount_cents, "idempotent": idempotent})
        return {"event_id": result["records"][0]["event_id"], **result["records"][0]}

    def start_consumer_here(self, strategy: str | None = None) -> int:
        return self.command("consumer.start", {"group": "payments", "strategy": strategy, "name": None})["consumer_id"]

    def journal_partition(self, event_id: str) -> int:
        with self.engine.connect() as conn:
            return conn.execute(text(f'SELECT partition FROM "{self.lab.schema}".published_events '
                                     "WHERE event_id = :e"), {"e": event_id}).scalar_one()

    def copies_in_log(self, event_id: str, sentinel_id: str) -> list[int]:
        """Offsets of the event in its partition, read from the broker up to the sentinel after it."""
        partition = self.journal_partition(sentinel_id)
        records = read_back(self.stack.broker.bootstrap_servers, self.lab.topic, partition,
                            lambda r: any(sentinel_id.encode() in v for _, v in r))
        return [offset for offset, value in records if json.loads(value)["event_id"] == event_id]

    def fault_timeline(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(text(f'SELECT summary FROM "{self.lab.schema}".timeline '
                                          "WHERE kind = 'fault' ORDER BY id")).scalars())

    def producer_duplicates(self) -> dict:
        return self.state()["producer_duplicates"]

    def cells(self) -> list[Cell]:
        with self.client.application.app_context(), lab_session(self.lab.schema) as session:
            return [cell for view in partitions_readmodel.partitions(session, self.lab) for cell in view.cells]


@pytest.fixture
def proxied_labs(stack, proxied_stack, app_factory, lab_name) -> Callable[[str], ProxiedLab]:
    """Make labs on the proxied stack (``lab_name`` + a suffix); each is dropped at the end."""
    made: list[ProxiedLab] = []

    def make(suffix: str = "") -> ProxiedLab:
        client = app_factory(LAB_NAME=lab_name + suffix, DATABASE_URL=proxied_stack.database_url,
                             KAFKA_BOOTSTRAP_SERVERS=proxied_stack.bootstrap_servers).test_client()
        driver = ProxiedLab(client, Lab(lab_name + suffix), stack)
        driver.command("lab.ensure", {"partitions": 3})
        made.append(driver)
        return driver
    yield make
    for driver in made:
        # The drop stops the lab's consumers and ends its faults; the stack's later tests walk no leftover lab.
        driver.command("lab.drop", {})


@pytest.fixture
def proxied_lab(proxied_labs) -> ProxiedLab:
    return proxied_labs("")


@pytest.fixture
def proxyless_database(services, lab_name):
    """A database of its own on the session's PostgreSQL, with a lab in it, that no fault proxy
    ever reported to: the session's database holds this module's proxy's report while (and for
    a few seconds after) its stack runs, so whether a proxy is running there depends on test order."""
    name = f"noproxy_{lab_name}"
    admin = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    url = make_url(sqlalchemy_url(services.database_url)).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        with engine.begin() as conn:
            ensure_control_schema(conn)
            create_database_state(conn, Lab(lab_name), 3)
        yield engine, url
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_arming_needs_a_running_proxy(app_factory, lab_name, proxyless_database):
    """With no proxy process reporting, nothing could inject the fault: 503, not a silent no-op."""
    engine, url = proxyless_database
    assert ops.call("get_fault_proxy", ops.Context(engine, Lab(lab_name)))["running"] is False
    response = app_factory(LAB_NAME=lab_name, DATABASE_URL=url).test_client().post(
        "/api/v1/fault-proxy", json={"drop_produce_responses": 1})
    assert response.status_code == 503
    assert "no fault proxy is running" in response.get_json()["error"]
    # Nothing was armed or written: no proxy row, no fault on the lab's timeline.
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM lab_control.fault_proxies")).scalar_one() == 0
        assert conn.execute(text(f'SELECT count(*) FROM "{Lab(lab_name).schema}".timeline '
                                 "WHERE kind = 'fault'")).scalar_one() == 0


def test_disarmed_proxy_passes_10000_events_without_loss(stack):
    topic = f"burst-{uuid.uuid4().hex[:8]}"
    create_topic(stack.proxy_address, topic)
    values = [f"event-{n}".encode() for n in range(10_000)]
    reports = produce(stack.proxy_address, topic, values, idempotent=True)
    assert len(reports) == 10_000 and all(error is None for error, _ in reports)
    records = read_back(stack.proxy_address, topic, 0, lambda r: len(r) >= 10_000, timeout=60)
    assert sorted(v for _, v in records) == sorted(values)
    assert [offset for offset, _ in records] == list(range(10_000))
    report = ops.call("get_fault_proxy", ops.Context(stack.engine, FP_LAB))
    assert (report["responses_dropped"], report["responses_delayed"]) == (0, 0)
    # Counted for the lab the producer's client id names, and for that lab only.
    wait_until(lambda: ops.call("get_fault_proxy", ops.Context(stack.engine, FP_LAB))["produce_requests"] > 0,
               timeout=5, message="the proxy never reported the Produce requests it forwarded")
    assert ops.call("get_fault_proxy", ops.Context(stack.engine, Lab("x")))["produce_requests"] == 0


def test_api_and_cli_arm_and_report(proxied_lab):
    client = proxied_lab.client
    bad = client.post("/api/v1/fault-proxy", json={"drop_produce_responses": -1})
    assert bad.status_code == 400 and bad.get_json()["field"] == "drop_produce_responses"
    bad = client.post("/api/v1/fault-proxy", json={"delay_ms": "soon"})
    assert bad.status_code == 400 and bad.get_json()["field"] == "delay_ms"
    assert client.post("/api/v1/fault-proxy", json={}).status_code == 400
    armed = proxied_lab.post("/fault-proxy", {"drop_produce_responses": 2, "delay_ms": 50})
    assert armed["running"] and armed["armed_by_this_lab"]
    assert (armed["drop_produce_responses"], armed["delay_ms"]) == (2, 50)
    assert client.get("/api/v1/fault-proxy").get_json()["armed_by"] == proxied_lab.lab.name

    result = client.application.test_cli_runner().invoke(args=["lab", "lost-ack", "--drop-produce-responses", "0"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["armed"] is False
    assert proxied_lab.fault_timeline()[-2:] == [
        "fault proxy armed: drop the next 2 Produce response(s), delay Produce responses by 50 ms",
        "fault proxy disarmed"]


def test_api_blocks_and_unblocks_a_consumers_commits_and_a_block_ends_on_its_own(proxied_lab):
    client = proxied_lab.client
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    name = proxied_lab.consumer(consumer_id)["name"]
    assert client.post("/api/v1/consumers/999999/commits-blocked", json={}).status_code == 404
    bad = client.post(f"/api/v1/consumers/{consumer_id}/commits-blocked", json={"seconds": 0})
    assert bad.status_code == 400 and bad.get_json()["field"] == "seconds"

    blocked = proxied_lab.post(f"/consumers/{consumer_id}/commits-blocked", {"seconds": 120})
    assert blocked["armed_by_this_lab"] and 110 < blocked["commits_blocked_of"][name] <= 120
    unblocked = proxied_lab.post(f"/consumers/{consumer_id}/commits-blocked", {"blocked": False})
    assert unblocked["commits_blocked_of"] == {} and not unblocked["armed"]

    result = client.application.test_cli_runner().invoke(
        args=["lab", "block-commits", str(consumer_id), "--seconds", "1"])
    assert result.exit_code == 0, result.output
    assert name in json.loads(result.output)["commits_blocked_of"]
    wait_until(lambda: ops.call("get_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab))
               ["commits_blocked_of"] == {}, timeout=10, message="a block of 1 s did not end")
    assert proxied_lab.fault_timeline()[-3:] == [
        f"fault proxy blocks {name}'s offset commits for 120 s: they no longer reach the broker (its fetches still do)",
        f"fault proxy lets {name}'s offset commits through again",
        f"fault proxy blocks {name}'s offset commits for 1 s: they no longer reach the broker (its fetches still do)"]



def test_a_lab_consumer_whose_commits_are_blocked_applies_but_its_offset_stays_on_the_broker_until_let_through(
        proxied_lab, stack):
    """block_commits (exercise 17's step) by its effect on a lab consumer: while blocked it applies
    the next credit, its synchronous commit fails and is retried, and the broker's committed offset
    does not move; let through, the retried commit lands."""
    lab = proxied_lab
    consumer_id = lab.start_consumer_here("none")
    lab.wait_assigned(consumer_id)
    partition = lab.journal_partition(lab.publish_credit(100, idempotent=True)["event_id"])
    lab.wait_caught_up()
    # What the broker holds, asked by a client of the test's own (its client id is no lab consumer's).
    admin = admin_client(stack.broker.bootstrap_servers)

    def committed() -> int | None:
        return committed_offsets(admin, lab.lab.group_id("payments"), lab.lab.topic)[partition]
    before = committed()
    assert before is not None, "the consumer's first commit never reached the broker"

    lab.post(f"/consumers/{consumer_id}/commits-blocked", {"seconds": 120})
    applied = lab.consumer(consumer_id)["applied"]
    assert lab.journal_partition(lab.publish_credit(200, idempotent=True)["event_id"]) == partition  # acc-1's
    failing = lab.wait_consumer(
        consumer_id, lambda c: c["applied"] == applied + 1 and "failed" in (c["last_error"] or ""),
        "the consumer never applied the credit with its commit failing", timeout=60)
    assert failing["last_error"].startswith(f"commit of offset {before + 1} on partition {partition} failed"), \
        failing["last_error"]
    assert committed() == before, "a commit reached the broker while the consumer's commits were blocked"

    lab.post(f"/consumers/{consumer_id}/commits-blocked", {"blocked": False})
    wait_until(lambda: committed() == before + 1, timeout=60,
               message=lambda: f"the retried commit never landed once let through: {committed()}, "
                               f"{lab.consumer(consumer_id)['last_error']}")
    assert lab.consumer(consumer_id)["state"] == "running"

def test_a_consumer_with_no_connection_through_the_proxy_is_refused_not_pretended_blocked(proxied_lab):
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    proxied_lab.command("consumer.stop", {"consumer_id": consumer_id})
    proxied_lab.wait_state(consumer_id, "stopped")
    faults_before = proxied_lab.fault_timeline()
    response = proxied_lab.client.post(f"/api/v1/consumers/{consumer_id}/commits-blocked", json={})
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["field"] == "consumer_id"
    assert "has no connection through the fault proxy" in response.get_json()["error"]
    assert proxied_lab.client.get("/api/v1/fault-proxy").get_json()["commits_blocked_of"] == {}
    assert proxied_lab.fault_timeline() == faults_before


def test_a_lab_reset_ends_its_consumers_commit_blocks(proxied_lab):
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    assert proxied_lab.post(f"/consumers/{consumer_id}/commits-blocked", {"seconds": 600})["commits_blocked_of"]
    proxied_lab.command("lab.reset", {"partitions": 3})
    # A new consumer of the same name must not inherit the block.
    assert proxied_lab.client.get("/api/v1/fault-proxy").get_json()["commits_blocked_of"] == {}


def test_the_consumer_card_blocks_and_lets_through_its_commits(proxied_lab):
    client = proxied_lab.client
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    name = proxied_lab.consumer(consumer_id)["name"]
    card = client.get("/panels/consumers").get_data(as_text=True)
    assert "⊘ Block commits" in card and "data-commits-blocked" not in card

    response = client.post(f"/controls/consumers/{consumer_id}/commits-blocked", data={"blocked": "true", "seconds": "60"})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert f"Consumer {name}: its offset commits no longer reach the broker" in response.get_data(as_text=True)
    card = client.get("/panels/consumers").get_data(as_text=True)
    assert "data-commits-blocked" in card and "✓ Let commits through" in card

    response = client.post(f"/controls/consumers/{consumer_id}/commits-blocked", data={"blocked": "false"})
    assert f"Consumer {name}: its offset commits reach the broker again." in response.get_data(as_text=True)
    assert "data-commits-blocked" not in client.get("/panels/consumers").get_data(as_text=True)


def test_lost_ack_without_idempotence_writes_the_event_twice_and_none_credits_twice(proxied_lab):
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    ops.call("arm_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab), {"drop_produce_responses": 1, "delay_ms": 0})
    event = proxied_lab.publish_credit(CREDIT, idempotent=False)
    sentinel = proxied_lab.publish_credit(SENTINEL, idempotent=False)
    assert event["error"] is None and sentinel["error"] is None

    copies = proxied_lab.copies_in_log(event["event_id"], sentinel["event_id"])
    assert len(copies) == 2, copies
    proxy = ops.call("get_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab))
    assert proxy["responses_dropped"] >= 1 and proxy["drop_produce_responses"] == 0
    assert any("dropped the response to a Produce request" in s for s in proxied_lab.fault_timeline())

    proxied_lab.wait_caught_up()
    account = proxied_lab.account("acc-1")
    assert account["expected"] == CREDIT + SENTINEL
    assert account["actual"] == 2 * CREDIT + SENTINEL
    assert proxied_lab.verdict()["duplicates_applied"] == 1
    duplicates = proxied_lab.producer_duplicates()
    assert duplicates["producer_retry_duplicates"] == 1
    assert duplicates["events"][0]["event_id"] == event["event_id"]
    # The partition strip marks both records of the event, each applied: the same credit twice.
    cells = [c for c in proxied_lab.cells() if c.event_id == event["event_id"]]
    assert sorted(c.offset for c in cells) == copies
    assert all(c.producer_retry and c.outcome == "applied-twice" for c in cells), cells
    assert any("record written by a producer retry" in c.label for c in cells), [c.label for c in cells]


def test_lost_ack_with_idempotence_writes_the_event_once(proxied_lab):
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    ops.call("arm_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab), {"drop_produce_responses": 1, "delay_ms": 0})
    event = proxied_lab.publish_credit(CREDIT, idempotent=True)
    sentinel = proxied_lab.publish_credit(SENTINEL, idempotent=True)
    assert event["error"] is None

    assert len(proxied_lab.copies_in_log(event["event_id"], sentinel["event_id"])) == 1
    assert ops.call("get_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab))["drop_produce_responses"] == 0
    assert any("dropped the response" in s for s in proxied_lab.fault_timeline())
    proxied_lab.wait_caught_up()
    account = proxied_lab.account("acc-1")
    assert account["actual"] == account["expected"] == CREDIT + SENTINEL
    assert proxied_lab.producer_duplicates()["producer_retry_duplicates"] == 0


@pytest.mark.parametrize("strategy, credited", [("none", 2), ("eventid-atomic", 1)])
def test_idempotent_producer_does_not_stop_consumer_side_duplicates(proxied_lab, strategy, credited):
    ops.call("set_strategy", ops.Context(proxied_lab.engine, proxied_lab.lab), {"group": "payments", "strategy": strategy})
    consumer_id = proxied_lab.start_consumer_here()
    proxied_lab.wait_assigned(consumer_id)
    ops.call("arm", ops.Context(proxied_lab.engine, proxied_lab.lab), {"consumer_id": consumer_id, "point": "after-effect-before-commit"})
    ops.call("arm_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab), {"drop_produce_responses": 1, "delay_ms": 0})
    event = proxied_lab.publish_credit(CREDIT, idempotent=True)
    proxied_lab.wait_state(consumer_id, "crashed")
    sentinel = proxied_lab.publish_credit(SENTINEL, idempotent=True)
    # The producer layer did its job: one record.
    assert len(proxied_lab.copies_in_log(event["event_id"], sentinel["event_id"])) == 1

    ops.call("restart_consumer", ops.Context(proxied_lab.engine, proxied_lab.lab), {"consumer_id": consumer_id})
    proxied_lab.wait_caught_up(timeout=60)
    account = proxied_lab.account("acc-1")
    assert account["expected"] == CREDIT + SENTINEL
    assert account["actual"] == credited * CREDIT + SENTINEL
    verdict = proxied_lab.verdict()
    assert verdict["duplicates_applied"] == credited - 1
    assert proxied_lab.producer_duplicates()["producer_retry_duplicates"] == 0


def test_chaos_cuts_the_broker_connections_of_a_consumer_and_the_producer_and_both_reconnect(proxied_lab):
    """Chaos's cut-connections: the proxy closes the connections whose requests carry the
    consumer's and the lab producer's client ids; librdkafka reconnects and nothing is lost."""
    consumer_id = proxied_lab.start_consumer_here("none")
    proxied_lab.wait_assigned(consumer_id)
    proxied_lab.publish_credit(100, idempotent=True)
    proxied_lab.wait_caught_up()
    session = proxied_lab.post("/chaos", {"seed": 5, "every_seconds": 0.3, "actions": ["cut-connections"],
                                          "max_actions": 2})

    def stopped():
        return next((s for s in proxied_lab.client.get("/api/v1/chaos").get_json()["sessions"]
                     if s["id"] == session["id"] and s["status"] == "stopped"), None)
    wait_until(stopped, timeout=30, message="the chaos session never stopped")
    with proxied_lab.engine.connect() as conn:
        outcomes = list(conn.execute(text(
            f"SELECT detail->>'outcome' FROM \"{proxied_lab.lab.schema}\".timeline WHERE kind = 'chaos' "
            "AND detail->>'action' = 'cut-connections' ORDER BY id")).scalars())
    # The lab's own count: its consumer's connections and its producer's (lab-<lab>.producer).
    cut = ops.call("get_fault_proxy", ops.Context(proxied_lab.engine, proxied_lab.lab))["connections_cut"]
    assert outcomes == ["done", "done"] and cut >= 2, (outcomes, cut)
    proxied_lab.publish_credit(250, idempotent=True)
    proxied_lab.wait(lambda s: s["verdict"]["status"] == "exactly-once" and s["verdict"]["transactions"] == 2,
                     "the consumer did not go on after its connections were cut", timeout=60)
    assert proxied_lab.consumer(consumer_id)["state"] == "running"


# --- two labs at once: every lab's faults are its own ---------------------------------

# Long enough that a publish it held cannot pass for a prompt one on a busy machine.
HELD_MS = 5000


def connections_to_proxy(pid: int, proxy_address: str) -> set[tuple[str, int]]:
    """The local addresses of a process's open TCP connections to the fault proxy."""
    port = int(proxy_address.rsplit(":", 1)[1])
    return {tuple(c.laddr) for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def rebalances(lab: ProxiedLab) -> int:
    with lab.engine.connect() as conn:
        return conn.execute(text(f'SELECT count(*) FROM "{lab.lab.schema}".timeline '
                                 "WHERE kind = 'rebalanced'")).scalar_one()


def test_two_labs_at_once_each_labs_faults_act_on_its_own_clients_only(proxied_labs, stack):
    """Lab A arms exercise 7's lost ack and holds its Produce responses: lab B's publishes pass
    untouched and promptly; B's disarm leaves A's faults armed and acting; a cut A asks for, even
    one naming B's clients, closes none of B's connections; neither lab sees the other's faults."""
    a, b = proxied_labs("a"), proxied_labs("b")
    a_consumer, b_consumer = a.start_consumer_here("none"), b.start_consumer_here("none")
    a.wait_assigned(a_consumer)
    b_row = b.wait_assigned(b_consumer)
    warm_up = b.publish_credit(SENTINEL, idempotent=False)  # B's producer is connected through the proxy
    assert warm_up["error"] is None

    armed = a.post("/fault-proxy", {"drop_produce_responses": 1, "delay_ms": HELD_MS})
    assert armed["armed_by_this_lab"] and (armed["drop_produce_responses"], armed["delay_ms"]) == (1, HELD_MS)
    seen_by_b = b.client.get("/api/v1/fault-proxy").get_json()
    assert seen_by_b["running"] and not seen_by_b["armed"] and seen_by_b["armed_by"] is None, seen_by_b
    assert (seen_by_b["drop_produce_responses"], seen_by_b["delay_ms"]) == (0, 0)

    # B publishes with a plain producer: promptly, and once in the log (A's drop was not B's to take).
    started = time.monotonic()
    event = b.publish_credit(CREDIT, idempotent=False)
    b_elapsed = time.monotonic() - started
    sentinel = b.publish_credit(SENTINEL, idempotent=False)
    assert event["error"] is None and b_elapsed < HELD_MS / 1000, b_elapsed
    assert len(b.copies_in_log(event["event_id"], sentinel["event_id"])) == 1

    # B disarms its own faults, none; A's stay armed ...
    assert b.post("/fault-proxy", {"drop_produce_responses": 0, "delay_ms": 0})["armed"] is False
    still = a.client.get("/api/v1/fault-proxy").get_json()
    assert still["armed"] and (still["drop_produce_responses"], still["delay_ms"]) == (1, HELD_MS), still
    # ... and act: A's plain publish loses its ack, librdkafka retries, the retry's answer is held.
    started = time.monotonic()
    lost = a.publish_credit(CREDIT, idempotent=False)
    assert time.monotonic() - started >= HELD_MS / 1000
    records = read_back(stack.broker.bootstrap_servers, a.lab.topic, a.journal_partition(lost["event_id"]),
                        lambda r: sum(lost["event_id"].encode() in v for _, v in r) >= 2)
    assert sum(lost["event_id"].encode() in v for _, v in records) == 2
    a_report = a.post("/fault-proxy", {"drop_produce_responses": 0, "delay_ms": 0})
    assert a_report["responses_dropped"] == 1 and a_report["responses_delayed"] >= 1, a_report
    b_report = b.client.get("/api/v1/fault-proxy").get_json()
    assert (b_report["responses_dropped"], b_report["responses_delayed"]) == (0, 0), b_report
    assert b_report["produce_requests"] >= 3 and a_report["produce_requests"] >= 2
    # Each fault went to the timeline of the lab whose client it hit, the lab that armed it.
    assert any("dropped the response to a Produce request" in s for s in a.fault_timeline())
    assert not [s for s in b.fault_timeline() if "dropped" in s or "delayed" in s], b.fault_timeline()

    # A cut lab A asks for, naming its own clients and (as a buggy or hostile caller might) B's.
    b_sockets = connections_to_proxy(b_row["pid"], stack.proxy_address)
    b_rebalances = rebalances(b)
    assert b_sockets, "B's consumer has no connection through the proxy"
    b_name = b.consumer(b_consumer)["name"]
    with stack.engine.begin() as conn:
        version = faultproxies.cut(conn, DEFAULT_NAME, a.lab.name, [
            a.lab.client_id(a.consumer(a_consumer)["name"]), a.lab.producer_client_id,
            b.lab.client_id(b_name), b.lab.producer_client_id], FAULT_PROXY_FRESH_SECONDS)
        faultproxies.notify(conn, CHANNEL, DEFAULT_NAME)

    def cut_count() -> int | None:
        with stack.engine.connect() as conn:
            return faultproxies.connections_cut(conn, DEFAULT_NAME, a.lab.name, version)
    wait_until(lambda: cut_count() is not None, timeout=10, message="the proxy did not carry out lab A's cut")
    assert cut_count() >= 2  # A's consumer's connections and its producer's
    assert b.client.get("/api/v1/fault-proxy").get_json()["connections_cut"] == 0
    # B's consumer keeps the very connections it had, and consumes on without a rebalance.
    assert connections_to_proxy(b_row["pid"], stack.proxy_address) == b_sockets
    after = b.publish_credit(250, idempotent=False)
    assert after["error"] is None
    b.wait(lambda s: s["verdict"]["transactions"] == 4 and s["verdict"]["status"] == "exactly-once",
           "B's consumer did not consume on after A's cut")
    assert rebalances(b) == b_rebalances
    assert connections_to_proxy(b_row["pid"], stack.proxy_address) == b_sockets
