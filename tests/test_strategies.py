"""Each strategy against real PostgreSQL: what it does on a first delivery and on a redelivery,
and that the SQL it runs is the SQL its plan shows on screen (one source for both)."""
from __future__ import annotations

import psycopg
import pytest

from webapp import events, strategies
from webapp.db import connect
from webapp.strategies.base import POINTS, RECORD_DELIVERY


class Crash(Exception):
    pass


class RecordingContext:
    """The strategy's context on a real connection: records statements and points passed,
    and can 'crash' (raise) at one point, which rolls back any open transaction."""

    def __init__(self, conn: psycopg.Connection, crash_at: str | None = None):
        self.conn = conn
        self.crash_at = crash_at
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
    return conn.execute("SELECT balance + coalesce((SELECT sum(amount_cents) FROM ledger WHERE account_id = %s), 0) "
                        "FROM accounts WHERE id = %s", [account_id, account_id]).fetchone()[0]


@pytest.mark.parametrize("name,second_outcome,second_balance", [
    ("none", "applied", 2000),
    ("check-then-act", "absorbed", 1000),
    ("eventid-atomic", "absorbed", 1000),
    ("eventid-split", "absorbed", 1000),
    ("business-key", "absorbed", 1000),
    ("natural", "absorbed", 1000),
])
def test_first_delivery_applies_and_redelivery_follows_the_strategy(conn, name, second_outcome, second_balance):
    strategy = strategies.get(name)
    event = events.credit("acc-1", 1000)
    first = RecordingContext(conn)
    assert strategy.apply(first, event) == "applied"
    assert balance(conn) == 1000
    # Every statement run is one the plan shows, in the plan's order.
    shown = list(strategy.statements)
    assert all(s in shown for s in first.statements)
    assert [shown.index(s) for s in first.statements] == sorted(shown.index(s) for s in first.statements)

    second = RecordingContext(conn)
    second.offset = 1
    assert strategy.apply(second, event) == second_outcome
    assert balance(conn) == second_balance


@pytest.mark.parametrize("name", strategies.NAMES)
def test_points_passed_are_the_points_shown(conn, name):
    strategy = strategies.get(name)
    context = RecordingContext(conn)
    strategy.apply(context, events.credit("acc-2", 100))
    assert set(context.points) <= set(strategy.points)
    assert all(point in POINTS for point in strategy.points)


@pytest.mark.parametrize("name,effect_after_crash", [
    ("eventid-atomic", 0),   # key and effect in one transaction: both rolled back
    ("business-key", 0),
    ("eventid-split", 0),    # the key is committed, the effect is not
])
def test_crash_between_key_and_effect(conn, name, effect_after_crash):
    strategy = strategies.get(name)
    event = events.credit("acc-1", 1000)
    with pytest.raises(Crash):
        strategy.apply(RecordingContext(conn, crash_at="between-key-and-effect"), event)
    assert balance(conn) == effect_after_crash
    key_table = "processed_transactions" if name == "business-key" else "processed_events"
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


def test_natural_set_status_is_the_same_however_often_it_runs(conn):
    event = events.set_status("acc-5", "BLOCKED")
    natural = strategies.get("natural")
    for _ in range(3):
        assert natural.apply(RecordingContext(conn), event) == "applied"
    assert conn.execute("SELECT status FROM accounts WHERE id = 'acc-5'").fetchone()[0] == "BLOCKED"
    assert conn.execute("SELECT count(*) FROM processed_events").fetchone()[0] == 0


@pytest.mark.parametrize("name", strategies.NAMES)
def test_unknown_account_is_invalid_and_changes_nothing(conn, name):
    with pytest.raises(events.InvalidEvent, match="no account"):
        strategies.get(name).apply(RecordingContext(conn), events.credit("acc-404", 100))
    assert conn.execute("SELECT count(*) FROM deliveries").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM payments").fetchone()[0] == 0


def test_unknown_strategy_is_named():
    with pytest.raises(strategies.UnknownStrategy, match="must be one of none, check-then-act"):
        strategies.get("exactly-once-please")
