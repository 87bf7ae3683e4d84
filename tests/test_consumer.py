"""The behaviour table: real consumer processes, real crash points, real Kafka and PostgreSQL.

Each test is one row of the table in the issue: a strategy, a fault, and what the lab must
observe. Waits are on conditions (a consumer's state, a balance, the group caught up).
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from confluent_kafka import Consumer, Producer
from sqlalchemy import text

from webapp.consumer.retry import BACKOFF_SECONDS, MAX_ATTEMPTS
from webapp.domain import events
from webapp.domain.group_health import SESSION_TIMEOUT_MS
from webapp.domain.vocabulary import DEDUP_TABLES
from webapp.domain.waits import wait_until
from webapp.store.connection import connect
from webapp.web.db import lab_session


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


def caught_up(lab, *records: dict, timeout: float = 30) -> dict:
    """The group caught up with the log end, once the log reader has seen every record published
    (until it has, the log end it reports is older than the records, and "caught up" is vacuous)."""
    def logged(s):
        ends = {p["partition"]: p["log_end"] for p in s["partitions"]}
        return all(ends.get(r["partition"], 0) > r["offset"] for r in records)
    lab.wait(logged, "the log reader never saw every published record", timeout)
    return lab.wait_caught_up(timeout)


def deliveries(app, lab, event_id: str) -> list[dict]:
    with app.app_context(), lab_session(lab.lab.schema) as session:
        rows = session.execute(text(
            'SELECT consumer, "offset", attempt, outcome FROM deliveries WHERE event_id = :e ORDER BY id'),
            {"e": event_id}).mappings().all()
    return [dict(row) for row in rows]


def crash_then_recover(lab, consumer_id: int, point: str) -> dict:
    """Arm a crash at ``point``, publish one credit, watch the process die, restart it, catch up."""
    record = lab.crash_and_restart(consumer_id, point)
    caught_up(lab, record)
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
    # The other keys, claimed in the effect's transaction (test_strategies.py checks the same with a
    # raised exception): after a real SIGKILL past the effect the redelivery is absorbed by the
    # transaction id or the payload's hash ...
    ("business-key", "after-effect-before-commit", 1000,
     {"duplicates_applied": 0, "redeliveries_absorbed": 1, "exactly_once": True}, ["applied", "absorbed"]),
    ("payload-hash", "after-effect-before-commit", 1000,
     {"duplicates_applied": 0, "redeliveries_absorbed": 1, "exactly_once": True}, ["applied", "absorbed"]),
    # ... and killed between the key and the effect, both are rolled back: the redelivery applies it, once.
    ("business-key", "between-key-and-effect", 1000,
     {"duplicates_applied": 0, "effects_lost": 0, "exactly_once": True}, ["applied"]),
    ("payload-hash", "between-key-and-effect", 1000,
     {"duplicates_applied": 0, "effects_lost": 0, "exactly_once": True}, ["applied"]),
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


def test_check_then_act_zombie_and_successor_both_apply(services, app, lab):
    use_strategy(lab, "check-then-act")
    c1, c2, record = freeze_then_hand_over(lab, "between-check-and-act")
    wait_balance(lab, 1000)  # the successor checked "absent" and applied
    lab.post(f"/consumers/{c1}/thaw")
    wait_balance(lab, 2000)  # the zombie carries on: its check said "absent" too
    zombie = lab.wait_consumer(c1, lambda c: c["commit_failures"] >= 1, "the zombie's late commit did not fail")
    assert "UNKNOWN_MEMBER_ID" in zombie["last_error"] or "generation" in zombie["last_error"].lower()
    # The zombie still holds the group's generation it was frozen in; the successor joined a later one.
    assert zombie["generation"] < lab.consumer(c2)["generation"], (zombie, lab.consumer(c2))
    assert lab.verdict()["duplicates_applied"] == 1
    outcomes = {d["consumer"]: d["outcome"] for d in deliveries(app, lab, record["event_id"])}
    assert outcomes == {"c1": "applied", "c2": "applied"}
    # No unique constraint: both plain INSERTs of the key went in.
    assert query(services, lab, "SELECT count(*) FROM seen_events WHERE event_id = %s", record["event_id"]) == [(2,)]


def test_an_idle_in_transaction_timeout_ends_the_zombies_transaction_and_the_successor_goes_on(services, app, lab):
    """A zombie frozen inside its transaction holds the key's lock. With the lab's
    idle_in_transaction_session_timeout, PostgreSQL ends its session (the transaction rolls back,
    the lock goes), the successor applies the credit once, and the thawed zombie's work fails."""
    use_strategy(lab, "eventid-atomic")
    lab.post("/database-settings", {"idle_in_transaction_session_timeout_ms": 1000, "lock_timeout_ms": 0})
    c1, c2, record = freeze_then_hand_over(lab, "between-key-and-effect")
    # The zombie's key insert was rolled back with its session: nothing holds the successor up.
    wait_balance(lab, 1000)
    assert not lab.consumer(c2).get("waiting_on")
    lab.post(f"/consumers/{c1}/thaw")
    zombie = lab.wait_consumer(c1, lambda c: c["last_error"] and ("terminat" in c["last_error"].lower()
                                                                   or "closed" in c["last_error"].lower()
                                                                   or c["commit_failures"] >= 1),
                               "the thawed zombie never noticed its session was gone", timeout=45)
    assert zombie["applied"] == 0
    caught_up(lab, record)
    assert balance(lab) == 1000
    assert [d["consumer"] for d in deliveries(app, lab, record["event_id"]) if d["outcome"] == "applied"] == ["c2"]


def test_insert_first_the_zombies_insert_hits_the_constraint_and_one_credit_stands(services, app, lab):
    use_strategy(lab, "insert-first")
    c1, c2, record = freeze_then_hand_over(lab, "before-effect")
    wait_balance(lab, 1000)  # the successor inserted the key and credited
    lab.post(f"/consumers/{c1}/thaw")
    zombie = lab.wait_consumer(c1, lambda c: c["absorbed"] >= 1 and c["commit_failures"] >= 1,
                               "the thawed zombie never absorbed the violation and tried to commit")
    assert zombie["state"] == "running"  # caught specifically: no crash, no restart loop
    assert balance(lab) == 1000
    ledger = query(services, lab, "SELECT consumer, outcome, reason FROM deliveries WHERE event_id = %s ORDER BY id",
                   record["event_id"])
    assert ledger == [("c2", "applied", None),
                      ("c1", "absorbed", "unique violation: already processed (processed_events_pkey)")]
    assert query(services, lab, "SELECT count(*) FROM payments") == [(1,)]
    assert lab.verdict()["duplicates_applied"] == 0


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
    caught_up(lab, original, duplicate)
    assert lab.account("acc-1")["actual"] == credited
    assert lab.account("acc-1")["expected"] == 1000
    verdict = lab.verdict()
    assert verdict["source_duplicates"] == 1 and verdict["source_duplicates_absorbed"] == absorbed


def test_ttl_cleanup_then_reset_to_earliest_applies_old_events_again(app, lab):
    use_strategy(lab, "eventid-atomic")
    start(lab, "c1")
    records = [lab.credit("acc-1", 1000), lab.credit("acc-2", 300)]
    caught_up(lab, *records)
    cleaned = lab.post("/ttl/cleanup", {"ttl_seconds": 0})
    assert cleaned["deleted"][lab.lab.schema]["processed_events"] == 2
    result = lab.post("/groups/payments/reset-offsets", {"mode": "earliest"})
    assert result["restarted"]
    caught_up(lab, *records)
    wait_balance(lab, 2000)
    wait_balance(lab, 600, "acc-2")
    assert lab.verdict()["duplicates_applied"] == 2


def test_expired_offsets_restart_the_group_at_auto_offset_reset_earliest(services, lab):
    """Mode ``expire`` stands in for expired offsets (nothing expires in the broker: the empty group is
    moved to a fresh Kafka group id, which has none, as offsets.retention.minutes leaves a group):
    the restarted consumer replays the log, and the timeline says what the lab did."""
    use_strategy(lab, "eventid-atomic")
    start(lab, "c1")
    records = [lab.credit("acc-1", 1000), lab.credit("acc-2", 300)]
    caught_up(lab, *records)
    result = lab.post("/groups/payments/reset-offsets", {"mode": "expire"})
    assert result["offsets"] == {} and result["restarted"], result
    assert result["kafka_group_id"] == lab.lab.group_id("payments") + ".r1", result
    lab.wait(lambda s: s["verdict"]["redeliveries_absorbed"] == 2 and s,
             "the restarted consumer never replayed the log from its start")
    caught_up(lab, *records)
    assert lab.verdict()["duplicates_applied"] == 0
    said = [summary for (summary,) in query(services, lab, "SELECT summary FROM timeline WHERE kind = 'offsets-reset'")]
    assert any(f"moved to Kafka group id {result['kafka_group_id']}, which has no committed offset, as the broker "
               "leaves an empty group once its offsets expire" in summary for summary in said), said


def test_offsets_do_not_expire_while_the_group_has_a_member_the_lab_cannot_stop(services, lab):
    """Kafka expires only an empty group's offsets. A member the lab does not run (a plain client in
    the group) keeps the expiry waiting, refused once GROUP_EMPTY_TIMEOUT passes, the group unmoved."""
    lab.credit("acc-1", 1000)
    # The lab's session timeout: the broker's first assignment waits about half of it (docs/concepts/broker.md).
    outsider = Consumer({"bootstrap.servers": services.bootstrap_servers, "group.id": lab.lab.group_id("payments"),
                         "auto.offset.reset": "earliest", "enable.auto.commit": False, "log_level": 3,
                         "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 1000})
    try:
        outsider.subscribe([lab.lab.topic])
        wait_until(lambda: outsider.poll(0.5) is not None or bool(outsider.assignment()), timeout=30,
                   message="the outside member never joined the group")
        refused = lab.client.post("/api/v1/groups/payments/reset-offsets", json={"mode": "expire"})
        assert refused.status_code == 400 and "not empty" in refused.get_json()["error"], refused.get_json()
        assert outsider.assignment(), "the outside member lost its partitions"
        assert query(services, lab, "SELECT kafka_group_id FROM consumer_groups") == [(None,)]
    finally:
        outsider.close()


def test_offsets_committed_in_a_kafka_transaction_still_come_back_after_a_crash_inside_it(services, app, lab):
    """Commit mode transactional: each offset goes through a Kafka transaction of the consumer's own.
    A crash inside it (after the effect's COMMIT and send_offsets_to_transaction) leaves it open; the
    restarted process's init_transactions aborts it, offset included, and the record comes back:
    the PostgreSQL effect was never part of the Kafka transaction."""
    lab.post("/groups/payments/throughput", {"commit_mode": "transactional"})
    c1 = start(lab, "c1")
    first = lab.credit("acc-2", 500)
    caught_up(lab, first)  # committed through a transaction: the group is caught up only if it landed
    record = crash_then_recover(lab, c1, "after-effect-before-commit")
    assert (lab.account("acc-1")["actual"], lab.account("acc-2")["actual"]) == (2000, 500)
    assert [d["outcome"] for d in deliveries(app, lab, record["event_id"])] == ["applied", "applied"]
    assert lab.verdict()["duplicates_applied"] == 1
    said = query(services, lab, "SELECT detail->>'transactional_id' FROM timeline WHERE kind = 'transactions'")
    # One per process: the first, and the restarted one whose init_transactions fenced it.
    assert said == [(lab.lab.client_id("c1") + ".offsets",)] * 2, said


def query(services, lab, sql: str, *params) -> list[tuple]:
    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def produce(services, lab, *records: events.PaymentEvent) -> None:
    """Write events to the lab's topic with a plain Kafka client: the lab treats every producer alike."""
    producer = Producer({"bootstrap.servers": services.bootstrap_servers, "enable.idempotence": True,
                         "log_level": 3})
    for event in records:
        producer.produce(lab.lab.topic, key=event.key, value=event.encode())
    assert producer.flush(15) == 0, "the broker did not acknowledge every record"


def wait_deliveries(services, lab, n: int, timeout: float = 45, where: str = "true") -> None:
    wait_until(lambda: query(services, lab, f"SELECT count(*) FROM deliveries WHERE {where}")[0][0] >= n,
               timeout=timeout, interval=0.2, message=f"fewer than {n} deliveries ({where})")


KEY_TABLES = (*DEDUP_TABLES, "ledger")


def test_natural_replayed_sets_change_nothing_replayed_credits_double_and_no_key_is_kept(services, lab):
    use_strategy(lab, "natural")
    start(lab, "c1")
    produce(services, lab, events.credit("acc-3", 2500), events.set_status("acc-4", "BLOCKED"),
            events.set_balance("acc-5", 50_000), events.set_score("acc-5", 720))
    wait_deliveries(services, lab, 4)
    lab.post("/groups/payments/reset-offsets", {"mode": "earliest"})
    wait_deliveries(services, lab, 8)
    assert query(services, lab, "SELECT id, balance, status FROM accounts WHERE id IN ('acc-3', 'acc-4', 'acc-5') "
                 "ORDER BY id") == [("acc-3", 5000, "ACTIVE"), ("acc-4", 0, "BLOCKED"), ("acc-5", 50_000, "ACTIVE")]
    assert query(services, lab, "SELECT account_id, score FROM scores") == [("acc-5", 720)]
    # Every delivery applied: the sets rewrote the same values, the credit went in twice.
    assert query(services, lab, "SELECT outcome, count(*) FROM deliveries GROUP BY 1") == [("applied", 8)]
    for table in KEY_TABLES:
        assert query(services, lab, f"SELECT count(*) FROM {table}") == [(0,)], table


@pytest.mark.parametrize("strategy,final,last_outcome", [("none", "PAID", "applied"),
                                                         ("natural", "CLOSED", "absorbed")])
def test_an_old_set_resent_after_a_newer_one(services, lab, strategy, final, last_outcome):
    """Idempotent is not commutative: the old PAID re-sent after CLOSED regresses a plain set."""
    if strategy != "none":
        use_strategy(lab, strategy)
    start(lab, "c1")
    now = datetime.now(timezone.utc)
    paid = events.set_status("acc-2", "PAID", occurred_at=(now - timedelta(minutes=5)).isoformat())
    closed = events.set_status("acc-2", "CLOSED", occurred_at=now.isoformat())
    produce(services, lab, paid, closed, paid)  # the third: an application-level resend of the first
    wait_deliveries(services, lab, 3)
    assert query(services, lab, "SELECT status FROM accounts WHERE id = 'acc-2'") == [(final,)]
    last = query(services, lab, "SELECT outcome, reason FROM deliveries ORDER BY id DESC LIMIT 1")[0]
    assert last[0] == last_outcome
    if strategy == "natural":
        assert "newer event" in last[1]


@pytest.mark.parametrize("policy", ["already-processed", "retry"])
def test_a_redelivery_under_insert_first_by_unique_violation_policy(services, app, lab, policy):
    """The 001 seed: the violation means "already processed", not a generic error for the retry
    mechanism. Under retry the partition stalls (the next record waits), then the DLQ; no crash."""
    use_strategy(lab, "insert-first")
    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as conn:
        conn.execute("UPDATE consumer_groups SET on_unique_violation = %s WHERE group_id = %s",
                     [policy, lab.lab.group_id("payments")])
    c1 = start(lab, "c1")
    first = crash_then_recover_without_waiting(lab, c1)
    later = lab.credit("acc-1", 500)  # same key, same partition: behind the redelivered record
    wait_deliveries(services, lab, 1, where=f"event_id = '{later['event_id']}' AND outcome = 'applied'", timeout=60)
    ledger = query(services, lab, "SELECT outcome, reason, extract(epoch FROM delivered_at) FROM deliveries "
                   "WHERE event_id = %s ORDER BY id", first["event_id"])
    applied_later = query(services, lab, "SELECT extract(epoch FROM delivered_at) FROM deliveries "
                          "WHERE event_id = %s", later["event_id"])[0][0]
    assert balance(lab) == 1500  # the first credit applied once, before the crash; the later one once
    consumer = lab.consumer(c1)
    assert consumer["state"] == "running"
    if policy == "already-processed":
        assert [(o, r) for o, r, _ in ledger] == [
            ("applied", None), ("absorbed", "unique violation: already processed (processed_events_pkey)")]
        assert consumer["dead_lettered"] == 0
    else:
        outcomes = [o for o, _, _ in ledger]
        assert outcomes == ["applied"] + ["failed"] * (MAX_ATTEMPTS - 1) + ["dead-lettered"]
        assert all("UniqueViolation" in r for _, r, _ in ledger[1:])
        assert ledger[-1][1].startswith(f"gave up after {MAX_ATTEMPTS} attempts")
        # The partition waited out each backoff before the later record could be applied.
        stalled = float(applied_later) - float(ledger[1][2])
        assert stalled >= sum(BACKOFF_SECONDS[:MAX_ATTEMPTS - 1]) - 0.2
        assert consumer["dead_lettered"] == 1 and "UniqueViolation" in consumer["last_error"]


def crash_then_recover_without_waiting(lab, consumer_id: int) -> dict:
    """Crash after the effect, before the offset commit; restart; the record comes back."""
    lab.post(f"/consumers/{consumer_id}/arm", {"point": "after-effect-before-commit", "action": "crash"})
    record = lab.credit("acc-1", 1000)
    lab.wait_consumer(consumer_id, lambda c: c["state"] == "crashed" and c["exit_code"] is not None,
                      "did not crash after the effect")
    lab.post(f"/consumers/{consumer_id}/restart")
    return record


def test_poison_pill_goes_to_the_dlq_with_its_reason_and_the_consumer_continues(services, lab):
    c1 = start(lab, "c1")
    poison = lab.publish(mode="poison", poison_kind="not-json")["records"][0]
    later = lab.credit("acc-4", 700)
    caught_up(lab, poison, later)
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
    c1 = start(lab, "c1")  # assigned alone first: c2's join is a second rebalance of the group
    alone = lab.consumer(c1)["generation"]
    c2 = lab.start_consumer(name="c2")["consumer_id"]
    shared = lab.wait(lambda s: sorted(p for c in s["consumers"] for p in c["assigned"]) == [0, 1, 2]
                      and all(c["assigned"] for c in s["consumers"]) and s,
                      "the two consumers never shared the partitions", 45)
    # The generation is the group's, one epoch for every member of a rebalance (not each
    # consumer's own count of its assignments, which would say 2 for c1 and 1 for c2).
    generations = {c["name"]: c["generation"] for c in shared["consumers"]}
    assert generations["c1"] == generations["c2"] > alone, (alone, generations)
    lab.post(f"/consumers/{c1}/kill")
    records = [record for account in ("acc-1", "acc-2", "acc-3", "acc-4", "acc-5")
               for record in lab.publish(account_id=account, amount_cents=100, mode="burst", count=4)["records"]]
    survivor = lab.wait_consumer(c2, lambda c: c["assigned"] == [0, 1, 2], "the survivor never took every partition", 45)
    assert survivor["generation"] > generations["c2"], "the rebalance after the kill did not bump the group's generation"
    state = caught_up(lab, *records, timeout=45)
    assert all(a["actual"] == a["expected"] == 400 for a in state["accounts"])
    assert state["verdict"]["not_yet_applied"] == 0 and state["verdict"]["exactly_once"]
    assert lab.consumer(c1)["state"] == "killed"


def test_a_lost_database_session_is_retried_not_dead_lettered_and_the_consumer_carries_on(services, lab):
    """OperationalError (here: the session terminated by an administrator) is transient: the
    record waits, the consumer reconnects and applies it; nothing goes to the DLQ."""
    c1 = start(lab, "c1")
    first = lab.credit("acc-1", 1000)
    wait_deliveries(services, lab, 1, where=f"event_id = '{first['event_id']}'")
    with connect(services.database_url, autocommit=True) as admin:
        terminated = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                   "WHERE application_name = %s", [f"lab {lab.lab.name} c1 effects"]).fetchall()
    assert terminated == [(True,)]
    second = lab.credit("acc-1", 500)
    wait_deliveries(services, lab, 1, where=f"event_id = '{second['event_id']}' AND outcome = 'applied'")
    assert balance(lab) == 1500
    consumer = lab.consumer(c1)
    assert consumer["state"] == "running" and consumer["dead_lettered"] == 0
    assert "AdminShutdown" in consumer["last_error"]  # an OperationalError
    errors = query(services, lab, "SELECT summary FROM timeline WHERE kind = 'error'")
    assert len(errors) == 1 and "attempt 1 failed: AdminShutdown" in errors[0][0]


# --- the poll interval: nothing a consumer does between two polls takes that long ---------

def set_poll_interval(services, lab, milliseconds: int) -> None:
    """The lab's max.poll.interval.ms (domain/group_health.py), read by a consumer when it starts:
    short here, so a test waits past it in seconds."""
    query(services, lab, "INSERT INTO settings (key, value) VALUES ('max_poll_interval_ms', %s::jsonb) "
                         "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value RETURNING key", str(milliseconds))


def test_a_consumer_blocked_on_a_row_lock_gives_the_statement_up_and_stays_in_its_group(services, lab):
    """The lab's lock_timeout is 0 (wait for ever), yet the consumer's lock wait ends below its
    max.poll.interval.ms (6 s here: lock_timeout 1.5 s), its card says why, and past the poll
    interval it is still the same member (no new generation, its partitions kept); the lock released,
    the credit is applied once."""
    set_poll_interval(services, lab, 6000)
    lab.post("/database-settings", {"lock_timeout_ms": 0})
    c1 = start(lab, "c1")
    member = lab.consumer(c1)
    with connect(services.database_url, schema=lab.lab.schema) as holder:  # a transaction of the test's own
        holder.execute("SELECT 1 FROM accounts WHERE id = 'acc-1' FOR UPDATE")
        record = lab.credit("acc-1", 1000)
        blocked = lab.wait_consumer(c1, lambda c: "lock timeout" in (c["last_error"] or ""),
                                    "the consumer never gave its statement up")
        assert "stays in its group" in blocked["last_error"], blocked["last_error"]
        # The third attempt starts 1.5 + 1 + 1.5 + 2 s after the first: past the 6 s poll interval.
        later = lab.wait_consumer(c1, lambda c: "attempt 3" in (c["last_error"] or ""),
                                  "the consumer stopped retrying", timeout=30)
        assert later["state"] == "running"
        assert (later["generation"], later["assigned"]) == (member["generation"], member["assigned"]), later
        holder.rollback()
    caught_up(lab, record)
    assert balance(lab) == 1000


@pytest.mark.parametrize("batch", [False, True], ids=["per-message", "batch"])
def test_a_consumer_held_at_a_step_keeps_polling_so_a_new_member_is_assigned(services, lab, batch):
    """Step mode holds a record for as long as a class discusses it. The held consumer polls with its
    partitions paused, so a member joining meanwhile completes the rebalance and is assigned (on
    Tansu a member that does not poll wedges the group for good: docs/concepts/broker.md)."""
    use_strategy(lab, "eventid-atomic")
    if batch:
        lab.post("/groups/payments/throughput", {"batch_size": 10})
    c1 = start(lab, "c1")
    lab.post(f"/consumers/{c1}/step-mode", {"on": True})
    record = lab.credit("acc-1", 1000)
    lab.wait_state(c1, "stepping")
    c2 = lab.start_consumer(name="c2")["consumer_id"]
    lab.wait_consumer(c2, lambda c: c["assigned"], "the new member was never assigned while c1 held its step",
                      timeout=30)
    assert lab.consumer(c1)["state"] == "stepping"  # still holding its record
    lab.post(f"/consumers/{c1}/step-mode", {"on": False})
    caught_up(lab, record)
    assert balance(lab) == 1000
