"""The verdict judges what the log holds, whoever produced it: real agent, real consumers, the
log reader on a thread of this test (stopped in teardown), records from outside clients.
"""
from __future__ import annotations

import json
import re
import threading
import uuid

import pytest
from confluent_kafka import Producer

from webapp.logreader import LogReader


@pytest.fixture
def log_reader(services, lab):
    """The log reader for this test's lab, on a thread; stopped and joined in teardown."""
    reader = LogReader(services.database_url, services.bootstrap_servers, labs=lambda conn: [lab.lab])
    stop = threading.Event()
    thread = threading.Thread(target=reader.run, args=(stop,), daemon=True)
    thread.start()
    yield reader
    stop.set()
    thread.join(timeout=15)
    assert not thread.is_alive(), "the log reader thread did not stop"


def outside_produce(services, topic: str, records: list[tuple[bytes | None, bytes]]) -> None:
    """Write records with another Kafka client: not the lab's producer, nothing journaled."""
    producer = Producer({"bootstrap.servers": services.bootstrap_servers, "enable.idempotence": False,
                         "acks": "all", "log_level": 3})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def credit(account: str, cents: int, event_id: str | None = None) -> bytes:
    return json.dumps({"event_id": event_id or str(uuid.uuid4()), "transaction_id": f"X{uuid.uuid4().hex[:16]}",
                       "type": "credit", "account_id": account, "amount_cents": cents,
                       "occurred_at": "2026-12-01T03:00:00+00:00"}).encode()


def use_strategy(lab, strategy: str) -> None:
    lab.post("/groups/payments/strategy", {"strategy": strategy})


def start(lab, name: str = "c1") -> int:
    consumer_id = lab.start_consumer(name=name)["consumer_id"]
    lab.wait_assigned(consumer_id)
    return consumer_id


def wait_verdict(lab, status: str, message: str, timeout: float = 45, **fields) -> dict:
    return lab.wait(lambda s: s["verdict"]["status"] == status
                    and all(s["verdict"][k] == v for k, v in fields.items()) and s,
                    f"{message} (wanted {status} {fields})", timeout)


def test_no_events_then_pending_until_the_group_consumes_then_green(lab, log_reader):
    assert lab.verdict()["status"] == "no-events" and not lab.verdict()["exactly_once"]
    lab.credit("acc-1", 10000)
    state = wait_verdict(lab, "pending", "the unconsumed credit never showed as pending", records=1)
    verdict = state["verdict"]
    assert (verdict["records_pending"], verdict["not_yet_applied"], verdict["pending"]) == (1, 1, 1)
    assert not verdict["exactly_once"] and verdict["duplicates_applied"] == verdict["effects_lost"] == 0
    account = next(a for a in state["accounts"] if a["id"] == "acc-1")
    assert (account["actual"], account["expected"]) == (0, 10000)

    start(lab)
    lab.wait_caught_up()
    state = wait_verdict(lab, "exactly-once", "the consumed credit never turned the verdict green")
    assert state["verdict"]["exactly_once"] and state["verdict"]["records_pending"] == 0


def test_an_outside_producers_credit_is_expected_and_applied(services, lab, log_reader):
    use_strategy(lab, "eventid-atomic")
    start(lab)
    outside_produce(services, lab.lab.topic, [(b"acc-2", credit("acc-2", 777))])
    state = wait_verdict(lab, "exactly-once", "the outside credit was never judged", transactions=1, records=1)
    account = next(a for a in state["accounts"] if a["id"] == "acc-2")
    assert (account["actual"], account["expected"]) == (777, 777)
    assert state["verdict"]["exactly_once"]


def test_a_record_written_twice_is_in_the_strip_twice_and_in_the_truth_once(services, lab, log_reader):
    use_strategy(lab, "eventid-atomic")
    start(lab)
    payload = credit("acc-3", 300)
    # What a lost-ack retry without enable.idempotence leaves: the same bytes at two offsets.
    outside_produce(services, lab.lab.topic, [(b"acc-3", payload), (b"acc-3", payload)])
    state = wait_verdict(lab, "exactly-once", "the twice-written record was never settled", records=2,
                         transactions=1, redeliveries_absorbed=1)
    account = next(a for a in state["accounts"] if a["id"] == "acc-3")
    assert (account["actual"], account["expected"]) == (300, 300)
    partition = next(p for p in state["partitions"] if p["log_end"])
    assert partition["log_end"] == 2
    assert state["producer_duplicates"]["events_at_several_offsets"] == 1
    assert state["producer_duplicates"]["extra_records"] == 1


def test_a_malformed_outside_record_is_expected_in_the_dlq_and_in_the_verdict(services, lab, log_reader):
    outside_produce(services, lab.lab.topic, [(b"acc-1", b"{oops, not json")])
    state = wait_verdict(lab, "pending", "the malformed record never showed as pending", records=1, invalid_records=1)
    assert state["verdict"]["transactions"] == 0 and state["verdict"]["dead_letters"] == 0
    start(lab)
    state = wait_verdict(lab, "exactly-once", "the malformed record never reached the DLQ", dead_letters=1)
    assert state["verdict"]["invalid_records"] == 1 and state["verdict"]["invalid_not_dead_lettered"] == 0
    assert all(a["actual"] == a["expected"] == 0 for a in state["accounts"])


def test_an_old_status_resent_after_a_newer_one_does_not_move_the_expected_status(lab, log_reader):
    paid = lab.publish(type="set_status", account_id="acc-4", status="PAID")["records"][0]
    lab.publish(type="set_status", account_id="acc-4", status="CLOSED")
    lab.publish(mode="resend", event_id=paid["event_id"])
    state = wait_verdict(lab, "pending", "the three sets were never mirrored", records=3, transactions=2)
    assert next(a for a in state["accounts"] if a["id"] == "acc-4")["expected_status"] == "CLOSED"

    use_strategy(lab, "natural")
    start(lab)
    lab.wait_caught_up()
    state = wait_verdict(lab, "exactly-once", "the guarded sets never settled on CLOSED")
    account = next(a for a in state["accounts"] if a["id"] == "acc-4")
    assert (account["status"], account["expected_status"]) == ("CLOSED", "CLOSED")


def test_why_a_double_credit_after_a_kill_at_after_effect_before_commit(lab, log_reader):
    c1 = start(lab)
    lab.post(f"/consumers/{c1}/arm", {"point": "after-effect-before-commit", "action": "crash"})
    record = lab.credit("acc-1", 1000)
    lab.wait_consumer(c1, lambda c: c["state"] == "crashed" and c["exit_code"] is not None, "did not crash")
    lab.post(f"/consumers/{c1}/restart")
    lab.wait_assigned(c1)
    lab.wait_caught_up()
    state = wait_verdict(lab, "anomalies", "the double credit was never judged", duplicates_applied=1)
    verdict = state["verdict"]
    assert not verdict["exactly_once"] and verdict["transactions_applied_twice"] == 1
    [anomaly] = verdict["anomalies"]
    p, o = record["partition"], record["offset"]
    assert anomaly["kind"] == "applied-twice" and (anomaly["partition"], anomaly["offset"]) == (p, o)
    assert re.fullmatch(
        rf"P{p}@{o} was applied by c1 \(generation \d+\); c1 was killed at after-effect-before-commit before its "
        rf"offset commit; c1 rejoined \(generation \d+\), offset {o} came back and `none` applied it again",
        anomaly["why"]), anomaly["why"]
