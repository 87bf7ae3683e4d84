"""The behaviour table: real consumer processes, real crash points, real Kafka and PostgreSQL.

Each test is one row of the table in the issue: a strategy, a fault, and what the lab must
observe. Waits are on conditions (a consumer's state, a balance, the group caught up).
"""
from __future__ import annotations

import pytest
from confluent_kafka import Consumer
from sqlalchemy import text

from webapp.db import lab_session
from webapp.waits import wait_until


def use_strategy(lab, strategy: str) -> None:
    lab.post("/groups/payments/strategy", {"strategy": strategy})


def start(lab, name: str) -> int:
    consumer_id = lab.start_consumer(name=name)["consumer_id"]
    lab.wait_assigned(consumer_id)
    return consumer_id


def balance(lab, account_id: str = "acc-1") -> int:
    return lab.account(account_id)["actual"]


def wait_balance(lab, cents: int, account_id: str = "acc-1", timeout: float = 30) -> None:
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == account_id)["actual"] == cents,
             f"{account_id} never reached {cents} cents", timeout)


def deliveries(app, lab, event_id: str) -> list[dict]:
    with app.app_context(), lab_session(lab.lab.schema) as session:
        rows = session.execute(text(
            'SELECT consumer, "offset", attempt, outcome FROM deliveries WHERE event_id = :e ORDER BY id'),
            {"e": event_id}).mappings().all()
    return [dict(row) for row in rows]


def crash_then_recover(lab, consumer_id: int, point: str) -> dict:
    """Arm a crash at ``point``, publish one credit, watch the process die, restart it."""
    lab.post(f"/consumers/{consumer_id}/arm", {"point": point, "action": "crash"})
    record = lab.credit("acc-1", 1000)
    crashed = lab.wait_consumer(consumer_id, lambda c: c["state"] == "crashed" and c["exit_code"] is not None,
                                f"did not crash at {point}")
    assert crashed["step_at"] == point and crashed["exit_code"] == -9  # SIGKILL: no commit, no leave
    lab.post(f"/consumers/{consumer_id}/restart")
    lab.wait_assigned(consumer_id)
    lab.wait_caught_up()
    return record


@pytest.mark.parametrize("strategy,point,actual,verdict,outcomes", [
    # The classic window: effect committed, offset not; the redelivery credits again.
    ("none", "after-effect-before-commit", 2000,
     {"duplicates_applied": 1, "exactly_once": False}, ["applied", "applied"]),
    # Same fault, the key in the effect's transaction: the redelivery is absorbed.
    ("eventid-atomic", "after-effect-before-commit", 1000,
     {"duplicates_applied": 0, "redeliveries_absorbed": 1, "exactly_once": True}, ["applied", "absorbed"]),
    # The key committed in its own transaction, the crash before the effect: the effect is lost.
    ("eventid-split", "between-key-and-effect", 0,
     {"effects_lost": 1, "exactly_once": False}, ["absorbed"]),
])
def test_crash_then_redelivery(app, lab, strategy, point, actual, verdict, outcomes):
    if strategy != "none":
        use_strategy(lab, strategy)
    c1 = start(lab, "c1")
    record = crash_then_recover(lab, c1, point)
    account = lab.account("acc-1")
    assert (account["actual"], account["expected"]) == (actual, 1000)
    observed = lab.verdict()
    assert {key: observed[key] for key in verdict} == verdict
    ledger = deliveries(app, lab, record["event_id"])
    assert [d["outcome"] for d in ledger] == outcomes
    # Attempts count the deliveries the ledger recorded at that offset (a crash before any write leaves none).
    assert [d["attempt"] for d in ledger] == list(range(1, len(outcomes) + 1))


def freeze_then_hand_over(lab, point: str) -> tuple[int, int, dict]:
    """c1 freezes itself at ``point`` mid-message; c2 joins and, after c1's session times out,
    takes the partition and gets the same (uncommitted) message."""
    c1 = start(lab, "c1")
    lab.post(f"/consumers/{c1}/arm", {"point": point, "action": "freeze"})
    record = lab.credit("acc-1", 1000)
    lab.wait_state(c1, "frozen")
    c2 = lab.start_consumer(name="c2")["consumer_id"]
    lab.wait_consumer(c2, lambda c: record["partition"] in c["assigned"],
                      "never took over the frozen consumer's partition", timeout=45)
    return c1, c2, record


def test_check_then_act_zombie_and_successor_both_apply(app, lab):
    use_strategy(lab, "check-then-act")
    c1, c2, record = freeze_then_hand_over(lab, "between-check-and-act")
    wait_balance(lab, 1000)  # the successor checked "absent" and applied
    lab.post(f"/consumers/{c1}/thaw")
    wait_balance(lab, 2000)  # the zombie carries on: its check said "absent" too
    zombie = lab.wait_consumer(c1, lambda c: c["commit_failures"] >= 1, "the zombie's late commit did not fail")
    assert "UNKNOWN_MEMBER_ID" in zombie["last_error"] or "generation" in zombie["last_error"].lower()
    assert lab.verdict()["duplicates_applied"] == 1
    outcomes = {d["consumer"]: d["outcome"] for d in deliveries(app, lab, record["event_id"])}
    assert outcomes == {"c1": "applied", "c2": "applied"}


def test_eventid_atomic_zombie_and_successor_apply_once(app, lab):
    use_strategy(lab, "eventid-atomic")
    c1, c2, record = freeze_then_hand_over(lab, "between-key-and-effect")
    # The successor's INSERT ... ON CONFLICT waits on the frozen transaction's uncommitted key.
    lab.post(f"/consumers/{c1}/thaw")
    lab.wait_consumer(c2, lambda c: c["absorbed"] >= 1, "the successor never absorbed the redelivery")
    assert balance(lab) == 1000
    ledger = deliveries(app, lab, record["event_id"])
    assert sorted((d["consumer"], d["outcome"]) for d in ledger) == [("c1", "applied"), ("c2", "absorbed")]
    assert lab.verdict()["duplicates_applied"] == 0


@pytest.mark.parametrize("strategy,credited,absorbed", [("eventid-atomic", 2000, 0), ("business-key", 1000, 1)])
def test_source_duplicate(lab, strategy, credited, absorbed):
    use_strategy(lab, strategy)
    start(lab, "c1")
    original = lab.credit("acc-1", 1000)
    duplicate = lab.publish(mode="source-duplicate", event_id=original["event_id"])["records"][0]
    assert duplicate["event_id"] != original["event_id"]
    lab.wait_caught_up()
    assert lab.account("acc-1")["actual"] == credited
    assert lab.account("acc-1")["expected"] == 1000
    verdict = lab.verdict()
    assert verdict["source_duplicates"] == 1 and verdict["source_duplicates_absorbed"] == absorbed


def test_ttl_cleanup_then_reset_to_earliest_applies_old_events_again(app, lab):
    use_strategy(lab, "eventid-atomic")
    start(lab, "c1")
    lab.credit("acc-1", 1000)
    lab.credit("acc-2", 300)
    lab.wait_caught_up()
    cleaned = lab.post("/ttl/cleanup", {"ttl_seconds": 0})
    assert cleaned["deleted"][lab.lab.schema]["processed_events"] == 2
    result = lab.post("/groups/payments/reset-offsets", {"mode": "earliest"})
    assert result["restarted"]
    lab.wait_caught_up()
    wait_balance(lab, 2000)
    assert lab.account("acc-2")["actual"] == 600
    assert lab.verdict()["duplicates_applied"] == 2


def test_natural_replays_change_nothing_and_need_no_dedup_table(app, lab):
    use_strategy(lab, "natural")
    start(lab, "c1")
    lab.credit("acc-3", 2500)
    lab.publish(type="set_status", account_id="acc-3", status="BLOCKED")
    lab.wait_caught_up()
    for _ in range(2):
        lab.post("/groups/payments/reset-offsets", {"mode": "earliest"})
        lab.wait_caught_up()
    account = lab.account("acc-3")
    assert (account["actual"], account["status"]) == (2500, "BLOCKED")
    state = lab.state()
    assert state["verdict"]["exactly_once"]
    with app.app_context(), lab_session(lab.lab.schema) as session:
        assert session.execute(text("SELECT count(*) FROM processed_events")).scalar() == 0
        assert session.execute(text("SELECT count(*) FROM processed_transactions")).scalar() == 0
        delivered = session.execute(text("SELECT count(*) FROM deliveries")).scalar()
    assert delivered == 6  # two records, each delivered three times


def test_poison_pill_goes_to_the_dlq_with_its_reason_and_the_consumer_continues(services, lab):
    c1 = start(lab, "c1")
    poison = lab.publish(mode="poison", poison_kind="not-json")["records"][0]
    later = lab.credit("acc-4", 700)
    lab.wait_caught_up()
    assert lab.account("acc-4")["actual"] == 700
    consumer = lab.consumer(c1)
    assert consumer["state"] == "running" and consumer["dead_lettered"] == 1
    assert lab.verdict()["dead_letters"] == 1

    reader = Consumer({"bootstrap.servers": services.bootstrap_servers, "group.id": f"{lab.lab.name}.dlq-reader",
                       "auto.offset.reset": "earliest", "log_level": 3, "session.timeout.ms": 6000})
    try:
        reader.subscribe([lab.lab.dlq_topic])
        message = wait_until(lambda: (m := reader.poll(0.5)) is not None and not m.error() and m, timeout=30,
                             message="nothing arrived on the dead-letter topic")
    finally:
        reader.close()
    headers = dict(message.headers())
    assert b"not JSON" in headers["dlq.reason"]
    assert headers["dlq.source.offset"] == str(poison["offset"]).encode()
    assert message.value() == b"{this is not json"
    assert later["offset"] is not None


def test_kill_one_of_two_consumers_the_other_takes_over_and_nothing_is_lost(lab):
    c1 = lab.start_consumer(name="c1")["consumer_id"]
    c2 = lab.start_consumer(name="c2")["consumer_id"]
    lab.wait(lambda s: sorted(p for c in s["consumers"] for p in c["assigned"]) == [0, 1, 2]
             and all(c["assigned"] for c in s["consumers"]), "the two consumers never shared the partitions", 45)
    lab.post(f"/consumers/{c1}/kill")
    for account in ("acc-1", "acc-2", "acc-3", "acc-4", "acc-5"):
        lab.publish(account_id=account, amount_cents=100, mode="burst", count=4)
    lab.wait_consumer(c2, lambda c: c["assigned"] == [0, 1, 2], "the survivor never took every partition", 45)
    state = lab.wait_caught_up(45)
    assert all(a["actual"] == a["expected"] == 400 for a in state["accounts"])
    assert state["verdict"]["not_yet_applied"] == 0 and state["verdict"]["exactly_once"]
    assert lab.consumer(c1)["state"] == "killed"
