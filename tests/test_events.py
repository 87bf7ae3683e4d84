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
