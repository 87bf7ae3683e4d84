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
from markupsafe import escape

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
    assert "No events yet" in lab.client.get("/panels/verdict").get_data(as_text=True)
    lab.credit("acc-1", 10000)
    state = wait_verdict(lab, "pending", "the unconsumed credit never showed as pending", records=1)
    panel = lab.client.get("/panels/verdict").get_data(as_text=True)
    assert 'data-status="pending"' in panel and "<span data-pending>1</span> record(s) not yet applied" in panel
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


def test_an_old_status_resent_after_a_newer_one_is_a_regression_not_a_harmless_reapplied_set(lab, log_reader):
    start(lab)  # strategy none: a plain set, whatever its time
    paid = lab.publish(type="set_status", account_id="acc-4", status="PAID")["records"][0]
    closed = lab.publish(type="set_status", account_id="acc-4", status="CLOSED")["records"][0]
    lab.wait_caught_up()
    resent = lab.publish(mode="resend", event_id=paid["event_id"])["records"][0]
    lab.wait_caught_up()
    state = wait_verdict(lab, "anomalies", "the regressed status was never judged", statuses_mismatched=1,
                         sets_regressed=1)
    verdict = state["verdict"]
    # Applied twice, but after CLOSED: not "the same value again".
    assert (verdict["sets_reapplied"], verdict["reapplied_sets_regressed"], verdict["sets_reapplied_harmless"]) \
        == (1, 1, 0), verdict
    regression = next(a for a in verdict["anomalies"] if a["kind"] == "set-regressed")
    p = resent["partition"]
    assert regression["severity"] == "bad" and (regression["partition"], regression["offset"]) == (p, resent["offset"])
    assert re.fullmatch(
        rf"P{p}@{resent['offset']} \(status acc-4 = PAID\) was applied by c1 \(generation \d+, `none`\) after the "
        rf"newer P{p}@{closed['offset']} \(status acc-4 = CLOSED\) had been: an older set written over a newer one, a "
        r"regression, and nothing newer was applied since: the account keeps the older value — a set is idempotent, "
        r"not commutative", regression["why"]), regression["why"]
    assert not any(a["kind"] == "re-applied" for a in verdict["anomalies"]), verdict["anomalies"]
    panel = lab.client.get("/panels/verdict").get_data(as_text=True)
    assert re.search(r'class="bad"><dt>↶ Sets regressed[^<]*</dt><dd data-verdict="sets_regressed">1<', panel), panel
    assert '<dd data-verdict="sets_reapplied_harmless">0<' in panel and regression["why"] in panel
    # The re-sent record's drill-down tells the same regression, not a harmless re-applied set.
    drill = lab.client.get(f"/records/{p}/{resent['offset']}", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert str(escape(regression["why"])) in drill and "re-applied" not in drill, drill


@pytest.mark.parametrize("strategy, changed", [("natural", 0), ("natural-clock", 1)])
def test_a_status_set_again_with_the_clocks_time_is_a_set_the_redelivery_changed(lab, log_reader, strategy, changed):
    """natural writes the event's time beside the status: replayed, the row is the same (re-applied,
    harmless). natural-clock writes now(): replayed, the row's status_at moves (source text 000's
    `paid_at = ?` is idempotent only because ? is the event's)."""
    use_strategy(lab, strategy)
    start(lab)
    record = lab.publish(type="set_status", account_id="acc-4", status="PAID")["records"][0]
    lab.wait_caught_up()
    wait_verdict(lab, "exactly-once", "the status was never applied", sets_changed_by_redelivery=0)
    lab.post("/groups/payments/reset-offsets", {"mode": "earliest"})
    state = wait_verdict(lab, "anomalies" if changed else "exactly-once", "the replayed status was never judged",
                         sets_reapplied=1, sets_changed_by_redelivery=changed)
    verdict = state["verdict"]
    assert verdict["sets_reapplied_harmless"] == 1 - changed, verdict
    kinds = [a["kind"] for a in verdict["anomalies"]]
    assert kinds == (["set-changed"] if changed else ["re-applied"]), verdict["anomalies"]
    [anomaly] = verdict["anomalies"]
    p, o = record["partition"], record["offset"]
    # The record's drill-down tells the verdict's why: what was re-applied, and whether it changed the row.
    drill = lab.client.get(f"/records/{p}/{o}", headers={"HX-Request": "true"}).get_data(as_text=True)
    assert str(escape(anomaly["why"])) in drill, drill
    if not changed:
        assert re.fullmatch(
            rf"P{p}@{o} \(status acc-4 = PAID\) was applied 2 times, last by c1 \(generation \d+, `natural`\): each "
            r"application wrote only values its event carries \(status acc-4 = PAID, status_at = its occurred_at\) "
            r"and no newer set of the account came between, so the row is what one application leaves: re-applied, "
            r"unchanged", anomaly["why"]), anomaly["why"]
    if changed:
        assert re.fullmatch(
            rf"P{p}@{o} \(status acc-4 = PAID, occurred_at [^)]+\) was applied 2 times, last by c1 \(generation "
            r"\d+, `natural-clock`\): acc-4's status_at is now [^,]+, and each application wrote its own time "
            r"\(`status_at = now\(\)`\), not the event's, so the redelivery changed the row — a set is idempotent "
            r"only if every value it writes comes from the event", anomaly["why"]), anomaly["why"]
        panel = lab.client.get("/panels/verdict").get_data(as_text=True)
        assert '<dd data-verdict="sets_changed_by_redelivery">1<' in panel and str(escape(anomaly["why"])) in panel


def test_why_a_double_credit_after_a_kill_at_after_effect_before_commit(lab, log_reader):
    c1 = start(lab)
    record = lab.crash_and_restart(c1, "after-effect-before-commit")
    lab.wait_caught_up()
    state = wait_verdict(lab, "anomalies", "the double credit was never judged", duplicates_applied=1)
    verdict = state["verdict"]
    assert not verdict["exactly_once"] and verdict["transactions_applied_twice"] == 1
    [anomaly] = verdict["anomalies"]
    p, o = record["partition"], record["offset"]
    assert anomaly["kind"] == "applied-twice" and (anomaly["partition"], anomaly["offset"]) == (p, o)
    match = re.fullmatch(
        rf"P{p}@{o} was applied by c1 \(generation (\d+)\); c1 was killed at after-effect-before-commit before "
        rf"its offset commit; c1 rejoined the group \(generation (\d+)\), offset {o} came back and `none` applied "
        r"it again", anomaly["why"])
    assert match, anomaly["why"]
    # The group's generations: the restarted process joined a later one than the killed one held.
    assert int(match[2]) > int(match[1]), anomaly["why"]
    # The drill-down of that record tells the same sentence, and the verdict panel lists it.
    drill = lab.client.get(f"/records/{p}/{o}", headers={"HX-Request": "true"})
    assert drill.status_code == 200 and anomaly["why"] in drill.get_data(as_text=True)
    panel = lab.client.get("/panels/verdict").get_data(as_text=True)
    assert anomaly["why"] in panel and 'data-status="anomalies"' in panel


def test_why_an_effect_lost_by_eventid_split(lab, log_reader):
    use_strategy(lab, "eventid-split")
    c1 = start(lab)
    record = lab.crash_and_restart(c1, "between-key-and-effect")
    state = wait_verdict(lab, "anomalies", "the lost effect was never judged", effects_lost=1)
    [anomaly] = state["verdict"]["anomalies"]
    p, o = record["partition"], record["offset"]
    assert anomaly["kind"] == "effect-lost" and (anomaly["partition"], anomaly["offset"]) == (p, o)
    assert re.fullmatch(
        rf"P{p}@{o} \(credit acc-1 \+10\.00\) was never applied: c1 was killed at between-key-and-effect after its "
        rf"key was committed and before the effect; when offset {o} came back, c1 \(generation \d+\) found its key "
        r"and `eventid-split` absorbed it as already processed: the effect was lost", anomaly["why"]), anomaly["why"]


def test_why_a_source_duplicate_slips_past_eventid_atomic(lab, log_reader):
    use_strategy(lab, "eventid-atomic")
    start(lab)
    first = lab.credit("acc-2", 500)
    second = lab.publish(mode="source-duplicate", event_id=first["event_id"])["records"][0]
    state = wait_verdict(lab, "anomalies", "the source duplicate was never judged", duplicates_applied=1,
                         source_duplicates=1)
    [anomaly] = state["verdict"]["anomalies"]
    positions = sorted([(first["partition"], first["offset"]), (second["partition"], second["offset"])])
    (p1, o1), (p2, o2) = positions
    assert re.fullmatch(
        rf"transaction \S+ is in the log under two event ids \(P{p1}@{o1} and P{p2}@{o2}\): a source duplicate; "
        r"`eventid-atomic` does not key on the transaction, so c1 applied it again", anomaly["why"]), anomaly["why"]
    account = next(a for a in state["accounts"] if a["id"] == "acc-2")
    assert (account["actual"], account["expected"]) == (1000, 500)


def test_why_a_zombie_applies_again_under_check_then_act(lab, log_reader):
    use_strategy(lab, "check-then-act")
    zombie = start(lab, "z1")
    lab.post(f"/consumers/{zombie}/arm", {"point": "between-check-and-act", "action": "freeze"})
    record = lab.credit("acc-3", 10000)
    lab.wait_state(zombie, "frozen")
    successor = lab.start_consumer(name="s2")["consumer_id"]
    lab.wait_consumer(successor, lambda c: c["applied"] == 1, "the successor never applied the record", 45)
    lab.post(f"/consumers/{zombie}/thaw")
    state = wait_verdict(lab, "anomalies", "the zombie's second credit was never judged", duplicates_applied=1)
    [anomaly] = state["verdict"]["anomalies"]
    p, o = record["partition"], record["offset"]
    match = re.fullmatch(
        rf"P{p}@{o} was applied by s2 \(generation (\d+)\) while z1 was frozen at between-check-and-act holding "
        r"it; z1 thawed and, a zombie holding the group's stale generation (\d+), applied it again "
        r"\(`check-then-act`\): the broker refuses a stale generation's offset commit, not its write to PostgreSQL",
        anomaly["why"])
    assert match, anomaly["why"]
    # The group's generation, not each consumer's count of assignments (which says 1 for both): the
    # zombie's is the stale one it was frozen in, the successor's the rebalance that followed.
    assert int(match[2]) < int(match[1]), anomaly["why"]


def test_a_consumer_blocked_by_a_frozen_zombies_lock_says_so(app, lab, log_reader):
    from webapp.domain.waits import wait_until
    from webapp.readmodel.consumers import consumers
    from webapp.web.db import lab_session

    use_strategy(lab, "eventid-atomic")
    zombie = start(lab, "z1")
    lab.post(f"/consumers/{zombie}/arm", {"point": "between-key-and-effect", "action": "freeze"})
    lab.credit("acc-5", 100)
    lab.wait_state(zombie, "frozen")  # frozen inside its transaction, holding the key's row lock
    lab.start_consumer(name="s2")

    def waiting():
        with app.app_context(), lab_session(lab.lab.schema) as session:
            rows = {c["name"]: c for c in consumers(session, lab.lab)}
        return rows.get("s2", {}).get("waiting_on")
    wait = wait_until(waiting, timeout=45, interval=0.3, message="the successor never showed its lock wait")
    assert wait["holder"] == "z1" and wait["holder_state"] == "frozen"
    assert re.fullmatch(r"waiting on a lock held by z1 \(frozen\) for \d+ s", wait["text"]), wait["text"]


@pytest.mark.parametrize("key", ["none", "event_id"])
def test_why_your_consumer_applied_a_transaction_twice_reads_the_log_and_names_the_key(services, lab, log_reader, key):
    """A learner's own consumer (lane mine): the lab records no deliveries of code it does not run,
    so the why reads the log (the resend carries the same event_id, the source duplicate a new one)
    against the lane's rows per event_id, and says which key would have absorbed each extra row."""
    import psycopg

    created = lab.client.post("/api/v1/yours", json={"lane": "mine"})
    assert created.status_code == 201, created.get_json()
    pix = lab.credit("acc-4", 4000)
    resent = lab.publish(mode="resend", event_id=pix["event_id"])["records"][0]
    duplicate = lab.publish(mode="source-duplicate", event_id=pix["event_id"])["records"][0]

    def lane(state: dict) -> dict:
        return next(x["verdict"] for x in state["lanes"] if x["lane"] == "mine")
    lab.wait(lambda s: lane(s)["records"] == 3, "the three records were never mirrored")
    from webapp.store.connection import connect

    with connect(services.database_url, schema=lab.lab.schema) as conn:
        [transaction_id] = {row[0] for row in conn.execute(
            "SELECT transaction_id FROM log_records WHERE event_id = %s", [pix["event_id"]])}
    # What the learner's consumer writes: every record (no key), or once per event_id.
    applied = [pix, resent, duplicate] if key == "none" else [pix, duplicate]
    with psycopg.connect(created.get_json()["database_url"], autocommit=True) as conn:
        for record in applied:
            conn.execute("UPDATE accounts SET balance = balance + 4000 WHERE id = 'acc-4'")
            conn.execute("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents) "
                         "VALUES (%s, %s, 'acc-4', 4000)", [record["event_id"], transaction_id])
    extra = len(applied) - 1
    verdict = lab.wait(lambda s: lane(s)["duplicates_applied"] == extra and lane(s)["anomalies"] and lane(s),
                       "your consumer's second credit was never judged", 45)
    [anomaly] = [a for a in verdict["anomalies"] if a["kind"] == "applied-twice"]
    p, o = pix["partition"], pix["offset"]
    event, new_event = pix["event_id"][:8], duplicate["event_id"][:8]
    rows = f"2 of event {event}, 1 of event {new_event}" if key == "none" else f"1 of event {event}, 1 of event {new_event}"
    # Sorted by the event id text: the payments rows come back grouped, in no set order.
    assert anomaly["why"].startswith(f"P{p}@{o} (credit acc-4 +40.00) has {len(applied)} effect rows in your lane ("), \
        anomaly["why"]
    for part in rows.split(", "):
        assert part in anomaly["why"], anomaly["why"]
    assert (f"the lab records no deliveries of your consumer, so from the log: transaction {transaction_id} "
            f"is there 3 times: P{p}@{o}, event {event}; P{resent['partition']}@{resent['offset']}, the same "
            f"event_id again (the lab resent it, an application's retry); P{duplicate['partition']}@"
            f"{duplicate['offset']}, a new event_id for the same transaction_id (a source duplicate). "
            f"Of the {extra} extra row{'s' if extra > 1 else ''}, ") in anomaly["why"], anomaly["why"]
    keys = ("1 repeats an event_id already applied (a key on event_id would have absorbed it); 1 carries a new "
            "event_id (only a key on transaction_id absorbs it)" if key == "none"
            else "1 carries a new event_id (only a key on transaction_id absorbs it)")
    assert anomaly["why"].endswith(f"{keys}. A key on transaction_id, claimed in the same database transaction as "
                                   "the effect, absorbs every copy"), anomaly["why"]
    assert "by hand" not in anomaly["why"], anomaly["why"]
