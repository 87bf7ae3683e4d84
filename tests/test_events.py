"""The event schema: build, encode, decode, validate (pure)."""
import json
import uuid

import pytest

from webapp import events


def test_credit_round_trip():
    event = events.credit("acc-1", 1250)
    assert events.decode(event.encode()) == event
    assert event.key == b"acc-1"
    assert event.transaction_id.startswith("E") and len(event.transaction_id) == 32


def test_set_status_round_trip():
    event = events.set_status("acc-2", "BLOCKED")
    decoded = events.decode(event.encode())
    assert decoded.status == "BLOCKED" and decoded.amount_cents is None


def test_source_duplicate_keeps_the_business_id_only():
    event = events.credit("acc-1", 100)
    duplicate = event.as_source_duplicate()
    assert duplicate.transaction_id == event.transaction_id
    assert duplicate.event_id != event.event_id
    uuid.UUID(duplicate.event_id)


def valid(**changes):
    data = json.loads(events.credit("acc-1", 100).encode())
    data.update(changes)
    return json.dumps({k: v for k, v in data.items() if v is not None}).encode()


@pytest.mark.parametrize("raw,reason", [
    (None, "empty record"),
    (b"\xff\xfe", "not UTF-8"),
    (b"{nope", "not JSON"),
    (b"[1, 2]", "not an object"),
    (b'{"type": "credit"}', "missing field"),
    (valid(extra=1), "unknown field"),
    (valid(event_id="not-a-uuid"), "event_id"),
    (valid(type="debit"), "type must be"),
    (valid(amount_cents=-5), "amount_cents"),
    (valid(amount_cents=True), "amount_cents"),
    (valid(amount_cents=1.5), "amount_cents"),
    (valid(account_id="a b"), "account_id"),
    (valid(transaction_id=""), "transaction_id"),
    (valid(occurred_at="yesterday"), "occurred_at"),
])
def test_decode_names_what_is_wrong(raw, reason):
    with pytest.raises(events.InvalidEvent) as error:
        events.decode(raw)
    assert reason in error.value.reason


@pytest.mark.parametrize("kind", sorted(events.POISON_PILLS))
def test_every_poison_pill_is_rejected(kind):
    with pytest.raises(events.InvalidEvent):
        events.decode(events.poison_pill(kind))


def test_unknown_poison_kind():
    with pytest.raises(ValueError, match="poison pill kind"):
        events.poison_pill("cyanide")


@pytest.mark.parametrize("event,field,value", [
    (events.set_balance("acc-3", 50_000), "balance_cents", 50_000),
    (events.set_score("acc-3", 720), "score", 720),
    (events.set_status("acc-3", "PAID"), "status", "PAID"),
])
def test_sets_round_trip_with_their_event_time(event, field, value):
    decoded = events.decode(event.encode())
    assert decoded == event and getattr(decoded, field) == value and decoded.amount_cents is None
    assert event.type in events.SET_TYPES


def test_an_event_time_given_is_kept_so_a_resend_carries_the_same_one():
    event = events.set_status("acc-1", "PAID", occurred_at="2026-12-01T09:00:00+00:00")
    assert events.decode(event.encode()).occurred_at == "2026-12-01T09:00:00+00:00"


def raw(**fields):
    data = {"event_id": str(uuid.uuid4()), "transaction_id": "E1", "account_id": "acc-1",
            "occurred_at": "2026-12-01T09:00:00+00:00", **fields}
    return json.dumps(data).encode()


@pytest.mark.parametrize("value,reason", [
    (raw(type="set_balance"), "balance_cents must be"),
    (raw(type="set_balance", balance_cents=-1), "balance_cents must be"),
    (raw(type="set_balance", balance_cents=1.5), "balance_cents must be"),
    (raw(type="set_score", score=1001), "score must be"),
    (raw(type="set_score", score="700"), "score must be"),
    (raw(type="credit", amount_cents=100, status="PAID"), "status is for type set_status"),
    (raw(type="set_status", status="PAID", balance_cents=5), "balance_cents is for type set_balance"),
    (raw(type="set_status", status="PAID", occurred_at="2026-12-01T09:00:00"), "needs a UTC offset"),
])
def test_set_fields_are_checked(value, reason):
    with pytest.raises(events.InvalidEvent) as error:
        events.decode(value)
    assert reason in error.value.reason


def test_a_utc_z_suffix_is_an_offset():
    assert events.decode(raw(type="set_score", score=0, occurred_at="2026-12-01T09:00:00Z")).score == 0
