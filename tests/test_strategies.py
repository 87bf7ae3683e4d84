"""Each strategy against real PostgreSQL: what it does on a first delivery and on a redelivery,
and that the SQL it runs is the SQL its plan shows on screen (one source for both)."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Callable

import psycopg
import pytest

from webapp import strategies
from webapp.domain import events
from webapp.store.connection import connect
from webapp.strategies import check_then_act, check_then_act_rr, insert_first
from webapp.strategies.base import CREDIT_BALANCE, INSERT_PAYMENT, POINTS, RECORD_DELIVERY


class Crash(Exception):
    pass


class RecordingContext:
    """The strategy's context on a real connection: records statements and points passed,
    and can 'crash' (raise) at one point, which rolls back any open transaction, or run another
    consumer's whole delivery at one point (``meanwhile``: a second session, a real interleaving)."""

    def __init__(self, conn: psycopg.Connection, crash_at: str | None = None,
                 meanwhile: tuple[str, Callable[[], Any]] | None = None):
        self.conn = conn
        self.crash_at = crash_at
        self.meanwhile = meanwhile
        self.statements: list[str] = []
        self.points: list[str] = []
        self.offset = 0

    def execute(self, statement, params):
        self.statements.append(statement)
        return self.conn.execute(statement, params)

    def transaction(self):
        return self.conn.transaction()

    def checkpoint(self, point):
        self.points.append(point)
        if point == self.crash_at:
            raise Crash(point)
        if self.meanwhile and self.meanwhile[0] == point:
            self.meanwhile[1]()

    def record_delivery(self, event, outcome, reason=None):
        self.execute(RECORD_DELIVERY, {
            "group_id": "g", "consumer": "test", "partition": 0, "offset": self.offset, "generation": 1,
            "event_id": event.event_id if event else None, "transaction_id": event.transaction_id if event else None,
            "strategy": "test", "outcome": outcome, "reason": reason})


@pytest.fixture
def conn(services, lab):
    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as connection:
        yield connection


def balance(conn, account_id="acc-1") -> int:
    return conn.execute("SELECT balance FROM accounts WHERE id = %s", [account_id]).fetchone()[0]


def count(conn, table: str) -> int:
    return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def in_plan_order(strategy, statements) -> bool:
    """Every statement run is one the plan shows, in the plan's order."""
    shown = list(strategy.statements)
    return (all(s in shown for s in statements)
            and [shown.index(s) for s in statements] == sorted(shown.index(s) for s in statements))


@pytest.mark.parametrize("name,second_outcome,second_balance", [
    ("none", "applied", 2000),
    ("check-then-act", "absorbed", 1000),
    ("check-then-act-rr", "absorbed", 1000),
    ("insert-first", psycopg.errors.UniqueViolation, 1000),  # the consumer catches it: see test_consumer
    ("eventid-atomic", "absorbed", 1000),
    ("eventid-split", "absorbed", 1000),
    ("business-key", "absorbed", 1000),
    ("payload-hash", "absorbed", 1000),
    ("natural", "applied", 2000),  # a delta is not naturally idempotent
])
def test_first_delivery_applies_and_redelivery_follows_the_strategy(conn, name, second_outcome, second_balance):
    strategy = strategies.get(name)
    event = events.credit("acc-1", 1000)
    first = RecordingContext(conn)
    assert strategy.apply(first, event) == "applied"
    assert balance(conn) == 1000
    assert in_plan_order(strategy, first.statements)

    second = RecordingContext(conn)
    second.offset = 1
    if isinstance(second_outcome, str):
        assert strategy.apply(second, event) == second_outcome
    else:
        with pytest.raises(second_outcome):
            strategy.apply(second, event)
        assert count(conn, "deliveries") == 1  # the failed transaction left nothing
    assert balance(conn) == second_balance


def one_of_each(account_id: str) -> list[events.PaymentEvent]:
    return [events.credit(account_id, 100), events.set_status(account_id, "PAID"),
            events.set_balance(account_id, 50_000), events.set_score(account_id, 720)]


# Passed by the consumer's loop after the strategy's transaction (webapp/consumer/loop.py process).
LOOP_POINTS = {"after-effect-before-commit", "after-commit"}


@pytest.mark.parametrize("name", strategies.NAMES)
def test_points_passed_are_the_points_shown(conn, name):
    strategy = strategies.get(name)
    assert all(point in POINTS for point in strategy.points)
    passed = set()
    for event in one_of_each("acc-2"):
        context = RecordingContext(conn)
        strategy.apply(context, event)
        assert context.points, f"{name} passed no crash point applying a {event.type}"
        assert set(context.points) <= set(strategy.points), (event.type, context.points)
        passed |= set(context.points)
        assert in_plan_order(strategy, context.statements), (event.type, context.statements)
    # Every point the plan shows is one a delivery passes: arming any of them does something.
    assert passed | LOOP_POINTS == set(strategy.points), sorted(set(strategy.points) - passed - LOOP_POINTS)


@pytest.mark.parametrize("name,effect_after_crash", [
    ("eventid-atomic", 0),   # key and effect in one transaction: both rolled back
    ("business-key", 0),
    ("payload-hash", 0),
    ("eventid-split", 0),    # the key is committed, the effect is not
])
def test_crash_between_key_and_effect(conn, name, effect_after_crash):
    # A raised exception here; tests/test_consumer.py's test_crash_then_redelivery SIGKILLs a real
    # consumer process of business-key and payload-hash at this point and after the effect.
    strategy = strategies.get(name)
    event = events.credit("acc-1", 1000)
    with pytest.raises(Crash):
        strategy.apply(RecordingContext(conn, crash_at="between-key-and-effect"), event)
    assert balance(conn) == effect_after_crash
    key_table = {"business-key": "processed_transactions", "payload-hash": "processed_payloads"}.get(
        name, "processed_events")
    key_kept = conn.execute(f"SELECT count(*) FROM {key_table}").fetchone()[0]
    # The redelivery: atomic strategies apply it now; split finds its key and skips it forever.
    outcome = strategy.apply(RecordingContext(conn), event)
    if name == "eventid-split":
        assert key_kept == 1 and outcome == "absorbed" and balance(conn) == 0
    else:
        assert key_kept == 0 and outcome == "applied" and balance(conn) == 1000


def test_business_key_absorbs_a_source_duplicate_that_eventid_lets_through(conn):
    original = events.credit("acc-1", 1000)
    duplicate = original.as_source_duplicate()
    assert strategies.get("eventid-atomic").apply(RecordingContext(conn), original) == "applied"
    assert strategies.get("eventid-atomic").apply(RecordingContext(conn), duplicate) == "applied"
    assert strategies.get("business-key").apply(RecordingContext(conn), events.credit("acc-2", 5, "TX1")) == "applied"
    again = events.credit("acc-2", 5, "TX1")
    assert strategies.get("business-key").apply(RecordingContext(conn), again) == "absorbed"


KEY_TABLES = ("processed_events", "processed_transactions", "seen_events", "processed_payloads", "ledger")


def account_state(conn, account_id: str) -> tuple:
    return conn.execute("SELECT a.balance, a.status, s.score FROM accounts a LEFT JOIN scores s ON s.account_id = a.id "
                        "WHERE a.id = %s", [account_id]).fetchone()


def test_natural_sets_are_the_same_however_often_they_run_and_credits_double(conn):
    """The 000 seed's table: SET status, an upsert by PK, SET saldo = 500 — yes; balance + 100 — no."""
    natural = strategies.get("natural")
    sets = [events.set_status("acc-5", "BLOCKED"), events.set_balance("acc-5", 50_000), events.set_score("acc-5", 720)]
    for _ in range(3):
        for event in sets:
            assert natural.apply(RecordingContext(conn), event) == "applied"  # rewritten, not skipped
    assert account_state(conn, "acc-5") == (50_000, "BLOCKED", 720)
    credit = events.credit("acc-4", 1000)
    for _ in range(2):
        assert natural.apply(RecordingContext(conn), credit) == "applied"
    assert balance(conn, "acc-4") == 2000  # the replayed credit is applied again
    assert count(conn, "payments") == 2
    assert {table: count(conn, table) for table in KEY_TABLES} == dict.fromkeys(KEY_TABLES, 0)


def status_row(conn, account_id: str) -> tuple:
    return conn.execute("SELECT status, status_at FROM accounts WHERE id = %s", [account_id]).fetchone()


@pytest.mark.parametrize("name, row_changes", [("natural", False), ("natural-clock", True)])
def test_a_set_is_idempotent_only_if_its_values_come_from_the_event(conn, name, row_changes):
    """Source text 000's `SET status = 'PAID', paid_at = ?`: natural writes the event's time, so a
    redelivery rewrites the same row; natural-clock writes now(), so the row changes (the status not)."""
    strategy = strategies.get(name)
    event = events.set_status("acc-5", "PAID", occurred_at=at(0))
    assert strategy.apply(RecordingContext(conn), event) == "applied"
    first = status_row(conn, "acc-5")
    assert strategy.apply(RecordingContext(conn), event) == "applied"  # the redelivery: rewritten, not skipped
    second = status_row(conn, "acc-5")
    assert first[0] == second[0] == "PAID"
    assert (first != second) is row_changes, (first, second)
    assert (second[1] == datetime.fromisoformat(at(0))) is not row_changes


@pytest.mark.parametrize("name, audit_rows_after_redelivery", [("natural-audit", 2), ("natural-audit-keyed", 1)])
def test_an_audit_row_beside_an_idempotent_set_doubles_unless_keyed_on_the_event(conn, name,
                                                                                  audit_rows_after_redelivery):
    """Source text 000's "INSERT de um evento de auditoria" (Não) beside `SET status = 'PAID'` (Sim): a
    redelivery rewrites the same account row under both; natural-audit's audit row takes a new id per
    execution and is there twice, natural-audit-keyed's is keyed on the event and is there once. The
    statement that decides is the one the plan's note says decides."""
    strategy = strategies.get(name)
    event = events.set_status("acc-4", "PAID", occurred_at=at(0))
    first = RecordingContext(conn)
    assert strategy.apply(first, event) == "applied"
    row = status_row(conn, "acc-4")
    assert strategy.apply(RecordingContext(conn), event) == "applied"
    assert status_row(conn, "acc-4") == row == ("PAID", datetime.fromisoformat(at(0)))
    rows = conn.execute("SELECT id::text, event_id::text, transaction_id, action FROM audit_events").fetchall()
    assert len(rows) == audit_rows_after_redelivery
    assert {r[1:] for r in rows} == {(event.event_id, event.transaction_id, "status PAID")}
    deciding = [step for step in strategy.plan if step.kind == "sql" and step.note.startswith("the line that decides")]
    assert len(deciding) == 1 and deciding[0].text in first.statements
    assert deciding[0].text.startswith("INSERT INTO audit_events")
    assert ("gen_random_uuid()" in deciding[0].text) is (audit_rows_after_redelivery == 2)
    assert ("ON CONFLICT (id) DO NOTHING" in deciding[0].text) is (audit_rows_after_redelivery == 1)


def at(seconds: int) -> str:
    return (datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc) + timedelta(seconds=seconds)).isoformat()


@pytest.mark.parametrize("name,regressed", [("none", True), ("eventid-atomic", True), ("natural", False)])
def test_an_older_set_resent_after_a_newer_one(conn, name, regressed):
    """Idempotent is not commutative: an old PAID re-sent after CLOSED regresses a plain set. eventid-atomic
    is no help (a different event, or the same one after its key expired); natural's event-time guard is."""
    strategy = strategies.get(name)
    old = [events.set_status("acc-3", "PAID", occurred_at=at(0)), events.set_balance("acc-3", 10_000, occurred_at=at(0)),
           events.set_score("acc-3", 500, occurred_at=at(0))]
    new = [events.set_status("acc-3", "CLOSED", occurred_at=at(60)),
           events.set_balance("acc-3", 70_000, occurred_at=at(60)), events.set_score("acc-3", 800, occurred_at=at(60))]
    for event in old + new:
        assert strategy.apply(RecordingContext(conn), event) == "applied"
    conn.execute("DELETE FROM processed_events")  # as a TTL cleanup would: the old events' keys are gone
    outcomes = [strategy.apply(RecordingContext(conn), event) for event in old]
    if regressed:
        assert outcomes == ["applied"] * 3 and account_state(conn, "acc-3") == (10_000, "PAID", 500)
    else:
        assert outcomes == ["absorbed"] * 3 and account_state(conn, "acc-3") == (70_000, "CLOSED", 800)
        reasons = [r for (r,) in conn.execute("SELECT reason FROM deliveries WHERE outcome = 'absorbed' ORDER BY id")]
        assert len(reasons) == 3 and all("newer event" in r for r in reasons)


def test_check_then_act_key_table_has_no_unique_constraint_and_the_plan_says_so(conn):
    unique = conn.execute("SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
                          "WHERE c.relname = 'seen_events' AND c.relnamespace = current_schema()::regnamespace "
                          "AND (i.indisunique OR i.indisprimary)").fetchone()[0]
    assert unique == 0
    plan_ddl = [step.text for step in strategies.get("check-then-act").plan if step.kind == "ddl"]
    assert plan_ddl == [check_then_act.KEY_TABLE_DDL] and "no PRIMARY KEY, no UNIQUE" in plan_ddl[0]


def second_session(services, lab, strategy, event) -> Callable[[], None]:
    """Another consumer's whole delivery of ``event``, on its own PostgreSQL session, committed."""
    def run():
        with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as other:
            context = RecordingContext(other)
            context.offset = 7
            assert strategy.apply(context, event) == "applied"
    return run


def test_check_then_act_two_sessions_both_pass_the_check_and_both_credit(services, lab, conn):
    strategy = strategies.get("check-then-act")
    event = events.credit("acc-1", 1000)
    # The zombie's SELECT said "absent"; before it acts, the successor checks, credits, commits.
    zombie = RecordingContext(conn, meanwhile=("between-check-and-act", second_session(services, lab, strategy, event)))
    assert strategy.apply(zombie, event) == "applied"
    assert balance(conn) == 2000
    assert conn.execute("SELECT count(*) FROM seen_events WHERE event_id = %s", [event.event_id]).fetchone()[0] == 2


def test_check_then_act_rr_the_stale_update_fails_with_40001_and_the_retry_absorbs(services, lab, conn):
    strategy = strategies.get("check-then-act-rr")
    event = events.credit("acc-1", 1000)
    # Both pass the check; the other consumer credits and commits while this one waits to act.
    late = RecordingContext(conn, meanwhile=("between-check-and-act", second_session(services, lab, strategy, event)))
    with pytest.raises(psycopg.errors.SerializationFailure, match="could not serialize access due to concurrent update"):
        strategy.apply(late, event)
    # The line the plan points at: the account's UPDATE, after a check that said "absent".
    assert late.statements == [check_then_act_rr.REPEATABLE_READ, check_then_act.CHECK, CREDIT_BALANCE]
    assert balance(conn) == 1000 and count(conn, "seen_events") == 1 and count(conn, "deliveries") == 1
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # rolled back, usable
    # The consumer's retry: a new transaction, a new snapshot, a check that finds the key.
    retry = RecordingContext(conn)
    assert strategy.apply(retry, event) == "absorbed"
    assert balance(conn) == 1000 and count(conn, "seen_events") == 1


@pytest.mark.parametrize("isolation,refused", [("REPEATABLE READ", False), ("SERIALIZABLE", True)])
def test_what_the_rr_plan_says_an_insert_only_effect_is_not_caught_by_repeatable_read(services, lab, conn,
                                                                                      isolation, refused):
    """The plan's note: REPEATABLE READ refuses a write to a row changed since the snapshot, nothing
    else. Two transactions that check seen_events and then only insert rows (a payment, the key)
    both commit under it (write skew); SERIALIZABLE refuses the second through its predicate locks."""
    event = events.credit("acc-1", 1000)

    def check_and_insert(connection) -> None:
        assert connection.execute(check_then_act.CHECK, {"event_id": event.event_id}).fetchone() is None
        connection.execute(INSERT_PAYMENT, {"event_id": event.event_id, "transaction_id": event.transaction_id,
                                            "account_id": "acc-1", "amount_cents": 1000})
        connection.execute(check_then_act.REMEMBER, {"event_id": event.event_id})

    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as other:
        conn.execute("BEGIN")
        conn.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
        assert conn.execute(check_then_act.CHECK, {"event_id": event.event_id}).fetchone() is None
        with other.transaction():
            other.execute(f"SET TRANSACTION ISOLATION LEVEL {isolation}")
            check_and_insert(other)
        try:
            conn.execute(INSERT_PAYMENT, {"event_id": event.event_id, "transaction_id": event.transaction_id,
                                          "account_id": "acc-1", "amount_cents": 1000})
            conn.execute(check_then_act.REMEMBER, {"event_id": event.event_id})
            conn.execute("COMMIT")
            failure = None
        except psycopg.errors.SerializationFailure as error:
            conn.execute("ROLLBACK")
            failure = error
    assert (failure is not None) == refused, failure
    assert count(conn, "payments") == (1 if refused else 2)


def test_insert_first_the_late_insert_hits_the_constraint_and_rolls_back(services, lab, conn):
    strategy = strategies.get("insert-first")
    event = events.credit("acc-1", 1000)
    zombie = RecordingContext(conn, meanwhile=("before-effect", second_session(services, lab, strategy, event)))
    with pytest.raises(psycopg.errors.UniqueViolation) as violation:
        strategy.apply(zombie, event)
    assert violation.value.diag.constraint_name == "processed_events_pkey"
    assert zombie.statements == [insert_first.CLAIM]  # no effect ran in the failed transaction
    assert balance(conn) == 1000 and count(conn, "payments") == 1 and count(conn, "deliveries") == 1
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE  # rolled back, usable


def test_what_the_insert_first_plan_says_about_an_aborted_transaction(conn):
    """The SQL view's claim: after a unique violation PostgreSQL refuses every statement of the
    transaction; ON CONFLICT never raises, and a savepoint keeps the transaction usable."""
    event = events.credit("acc-2", 100)
    conn.execute(insert_first.CLAIM, {"event_id": event.event_id})
    with pytest.raises(psycopg.errors.InFailedSqlTransaction, match="current transaction is aborted"):
        with conn.transaction():
            try:
                conn.execute(insert_first.CLAIM, {"event_id": event.event_id})
            except psycopg.errors.UniqueViolation:
                pass  # "catch it and carry on", in the same transaction
            conn.execute("SELECT 1")
    with conn.transaction():
        try:
            with conn.transaction():  # a SAVEPOINT
                conn.execute(insert_first.CLAIM, {"event_id": event.event_id})
        except psycopg.errors.UniqueViolation:
            pass  # rolled back to the savepoint
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.execute(strategies.eventid_atomic.CLAIM, {"event_id": event.event_id}).rowcount == 0


@pytest.mark.parametrize("name", strategies.NAMES)
def test_unknown_account_is_invalid_and_changes_nothing(conn, name):
    for event in one_of_each("acc-404"):
        with pytest.raises(events.InvalidEvent, match="no account"):
            strategies.get(name).apply(RecordingContext(conn), event)
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM payments").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM scores").fetchone()[0] == 0


def test_unknown_strategy_is_named():
    with pytest.raises(strategies.UnknownStrategy, match="must be one of none, check-then-act"):
        strategies.get("exactly-once-please")


# --- payload-hash: the choice of key --------------------------------------------------------------

def test_payload_hash_absorbs_a_source_duplicate(conn):
    strategy = strategies.get("payload-hash")
    original = events.credit("acc-1", 1000)
    assert strategy.apply(RecordingContext(conn), original) == "applied"
    assert strategy.apply(RecordingContext(conn), original.as_source_duplicate()) == "absorbed"
    assert balance(conn) == 1000 and count(conn, "payments") == 1 and count(conn, "processed_payloads") == 1


def test_payload_hash_merges_two_real_identical_payments_in_the_same_minute(conn):
    """Same account, same amount, same minute, two transaction ids: two real payments, one key.
    business-key keeps them apart; payload-hash applies the first and absorbs the second, with the reason."""
    first = events.credit("acc-1", 5000, "E-REAL-1", occurred_at=at(7))
    second = events.credit("acc-1", 5000, "E-REAL-2", occurred_at=at(41))
    business, by_hash = strategies.get("business-key"), strategies.get("payload-hash")
    assert [business.apply(RecordingContext(conn), e) for e in (first, second)] == ["applied", "applied"]
    conn.execute("UPDATE accounts SET balance = 0")
    conn.execute("DELETE FROM payments")
    conn.execute("DELETE FROM deliveries")
    assert [by_hash.apply(RecordingContext(conn), e) for e in (first, second)] == ["applied", "absorbed"]
    assert balance(conn) == 5000  # one real credit of R$ 50.00 lost
    assert [tx for (tx,) in conn.execute("SELECT transaction_id FROM payments")] == ["E-REAL-1"]
    (reason,) = conn.execute("SELECT reason FROM deliveries WHERE outcome = 'absorbed'").fetchone()
    assert reason.startswith("payload hash ") and "already processed" in reason
    assert "(credit|acc-1|5000|2026-12-01T09:00Z)" in reason and "another real payment" in reason
    # Content that differs, or a later minute, is another key.
    assert by_hash.apply(RecordingContext(conn), events.credit("acc-1", 5000, occurred_at=at(61))) == "applied"
    assert by_hash.apply(RecordingContext(conn), events.credit("acc-1", 5001, occurred_at=at(7))) == "applied"
    assert by_hash.apply(RecordingContext(conn), events.credit("acc-2", 5000, occurred_at=at(7))) == "applied"
    assert count(conn, "processed_payloads") == 4


def test_payload_hash_key_is_the_canonical_form_the_plan_states(conn):
    """The SQL shown computes the key: sha256 of type|account|value|minute (UTC), no event id, no transaction id."""
    import hashlib

    from webapp.strategies import payload_hash

    cases = [(events.credit("acc-1", 1000, occurred_at="2026-12-01T06:59:59.999-03:00"),
              "credit|acc-1|1000|2026-12-01T09:59Z"),
             (events.set_status("acc-1", "PAID", occurred_at=at(30)), "set_status|acc-1|PAID|2026-12-01T09:00Z"),
             (events.set_balance("acc-1", 0, occurred_at=at(30)), "set_balance|acc-1|0|2026-12-01T09:00Z"),
             (events.set_score("acc-1", 720, occurred_at=at(30)), "set_score|acc-1|720|2026-12-01T09:00Z")]
    for event, canonical in cases:
        row = conn.execute(payload_hash.KEY, payload_hash.key_params(event)).fetchone()
        assert row == (canonical, hashlib.sha256(canonical.encode()).hexdigest())
    shown = [step for step in strategies.get("payload-hash").plan if step.kind == "sql"]
    assert shown[0].text == payload_hash.KEY and "no event_id, no transaction_id" in shown[0].note
    assert "minute" in shown[0].note and shown[1].text == payload_hash.CLAIM


def test_payload_hash_plan_points_are_the_points_apply_passes(conn):
    strategy = strategies.get("payload-hash")
    assert strategy.points == strategies.get("eventid-atomic").points
    event = events.credit("acc-1", 1000)
    first, again = RecordingContext(conn), RecordingContext(conn)
    assert strategy.apply(first, event) == "applied" and strategy.apply(again, event) == "absorbed"
    # apply passes these two; the consumer passes after-effect-before-commit and after-commit around the commit
    assert first.points == ["before-effect", "between-key-and-effect"] and again.points == ["before-effect"]
    assert set(first.points) | {"after-effect-before-commit", "after-commit"} == set(strategy.points)
    unique = conn.execute("SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid "
                          "WHERE c.relname = 'processed_payloads' AND c.relnamespace = current_schema()::regnamespace "
                          "AND i.indisprimary").fetchone()[0]
    assert unique == 1
