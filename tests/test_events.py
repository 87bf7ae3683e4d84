"""The event schema: build, encode, decode, validate (pure)."""
import dataclasses
import json
import uuid
from datetime import timezone

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from webapp.domain import events


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


# --- properties (hypothesis): whatever bytes arrive, the consumer gets an event or a dead-letter reason ---

# The same examples on every run (no example database in the checkout); a few seconds in all.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=400,
                suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6)
# Values close to the real ones (a UUID, an id with a trailing newline, amounts at the limits)
# reach the checks behind the first one.
near_values = st.one_of(
    json_values, st.uuids().map(str), st.sampled_from(events.EVENT_TYPES + events.STATUSES),
    st.from_regex(r"[A-Za-z0-9_.:-]{1,64}\n?", fullmatch=True),
    st.integers(-2, events.MAX_AMOUNT_CENTS + 2), st.sampled_from([0, 1, 1000, 1001, events.MAX_AMOUNT_CENTS + 1]),
    st.datetimes(timezones=st.none() | st.just(timezone.utc)).map(lambda when: when.isoformat()))
FIELDS = ("event_id", "transaction_id", "type", "account_id", "occurred_at", *events.TYPE_FIELDS.values())
near_events = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=12), near_values, max_size=10).map(
    lambda data: json.dumps(data).encode("utf-8", errors="surrogatepass"))
# JSON that Python's json module refuses with something other than JSONDecodeError.
hostile_json = st.one_of(
    st.integers(1000, 50_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.integers(4301, 6000).map(lambda digits: b'{"amount_cents": ' + b"9" * digits + b"}"))
any_record = st.none() | st.binary(max_size=300) | near_events | hostile_json


def assert_a_reason_for_the_dead_letter_topic(reason: str) -> None:
    assert reason.strip(), "an empty reason"
    reason.encode("utf-8")  # a Kafka header: a lone surrogate would raise here, in the consumer
    assert "\x00" not in reason, "PostgreSQL text refuses NUL"
    assert len(reason) <= events.MAX_REASON


@FUZZ
@given(any_record)
def test_any_bytes_decode_to_an_event_or_a_dead_letter_reason(value):
    try:
        event = events.decode(value)
    except events.InvalidEvent as invalid:
        assert_a_reason_for_the_dead_letter_topic(invalid.reason)
    else:
        assert isinstance(event, events.PaymentEvent)
        assert events.decode(event.encode()) == event  # what the lab accepts, it writes back the same


valid_events = st.one_of(
    st.builds(events.credit, amount_cents=st.integers(1, events.MAX_AMOUNT_CENTS), account_id=st.just("acc-1")),
    st.builds(events.set_status, status=st.sampled_from(events.STATUSES), account_id=st.just("acc-1")),
    st.builds(events.set_balance, balance_cents=st.integers(0, events.MAX_BALANCE_CENTS), account_id=st.just("a")),
    st.builds(events.set_score, score=st.integers(*events.SCORE_RANGE), account_id=st.just("acc-2")),
).flatmap(lambda event: st.builds(
    lambda account, transaction, when: events.validate(
        dataclasses.replace(event, account_id=account, transaction_id=transaction, occurred_at=when)),
    st.from_regex(events.ACCOUNT_ID.pattern.replace("$", r"\Z")),
    st.from_regex(events.TRANSACTION_ID.pattern.replace("$", r"\Z")),
    st.datetimes(timezones=st.just(timezone.utc)).map(lambda when: when.isoformat())))


@settings(FUZZ, max_examples=150)  # a simple property, and building a valid event costs more than bytes
@given(valid_events)
def test_valid_events_round_trip(event):
    assert events.decode(event.encode()) == event


@pytest.mark.parametrize("value, reason", [
    (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
    (b'{"amount_cents": ' + b"1" * 5000 + b"}", "cannot read"),
    (raw(type="credit", amount_cents=1, account_id="acc-1\n"), "account_id must be"),
    (raw(type="credit", amount_cents=1, transaction_id="E1\n"), "transaction_id must be"),
    (json.dumps({"\ud800\x00": 1}).encode(), "missing field"),
    (raw(type="credit", amount_cents=1, **{"\ud800\x00": 1}), "unknown field(s): '\\ud800\\x00'"),
    (raw(type="credit", amount_cents=1, event_id="x" * 10_000), "event_id is not a UUID"),
])
def test_the_crashes_the_fuzzer_found_are_dead_letter_reasons(value, reason):
    with pytest.raises(events.InvalidEvent) as error:
        events.decode(value)
    assert reason in error.value.reason
    assert_a_reason_for_the_dead_letter_topic(error.value.reason)
