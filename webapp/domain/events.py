"""The payment event: build, encode, decode, validate. Pure: no I/O.

On the topic an event is UTF-8 JSON, keyed by account id:
``{"event_id", "transaction_id", "type", "account_id", "occurred_at"}`` plus the field of its type:

- ``credit``: ``amount_cents``, a delta (``balance = balance + 100``: not idempotent);
- ``set_status``: ``status``, an absolute set (``UPDATE order SET status = 'PAID'``);
- ``set_balance``: ``balance_cents``, an absolute set (the seed's ``SET saldo = 500``);
- ``set_score``: ``score``, an upsert by primary key (the seed's credit-score upsert).

``occurred_at`` is the event time (ISO-8601 with a UTC offset), set once when the event is created:
a resend or a redelivery carries the same one, so a set can be ordered by it.

Optional, together: ``producer_id`` and ``producer_seq``, stamped by the lab's producer as it
sends (webapp/kafka/producer.py): which producer instance wrote the record and its running number
for that producer. A retry inside the client re-sends the same bytes, so the same number; a
lower number after a higher one in a partition is a batch that landed out of order
(webapp/readmodel/ordering.py). Events without them (another client, the outbox relay) are as valid.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone

EVENT_TYPES = ("credit", "set_status", "set_balance", "set_score")
# The field each type carries; a field of another type is refused.
TYPE_FIELDS = {"credit": "amount_cents", "set_status": "status", "set_balance": "balance_cents", "set_score": "score"}
SET_TYPES = ("set_status", "set_balance", "set_score")
STATUSES = ("ACTIVE", "BLOCKED", "PAID", "CLOSED")
MAX_AMOUNT_CENTS = 100_000_000  # R$ 1,000,000.00: a lab, not a bank
MAX_BALANCE_CENTS = 100_000_000
SCORE_RANGE = (0, 1000)          # a credit score, as Brazilian bureaus give it
ACCOUNT_ID = re.compile(r"^[A-Za-z0-9_-]{1,32}$")
TRANSACTION_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
PRODUCER_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
MAX_PRODUCER_SEQ = 2**62


MAX_REASON = 300  # characters: a dead-letter header and a journal column, not a copy of the record


def _printable_reason(reason: str) -> str:
    """The reason as text every sink accepts: UTF-8 encodable (no lone surrogate), no NUL, short."""
    text = reason.encode("utf-8", errors="backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"


class InvalidEvent(ValueError):
    """A record that is not a valid payment event; ``reason`` goes to the dead-letter topic."""

    def __init__(self, reason: str):
        # The reason quotes the record, which may hold anything: make it safe for a Kafka header
        # and a PostgreSQL text column once, here, rather than in every sink.
        reason = _printable_reason(reason)
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class PaymentEvent:
    event_id: str
    transaction_id: str
    type: str
    account_id: str
    occurred_at: str
    amount_cents: int | None = None
    status: str | None = None
    balance_cents: int | None = None
    score: int | None = None
    producer_id: str | None = None
    producer_seq: int | None = None

    @property
    def key(self) -> bytes:
        return self.account_id.encode()

    def encode(self) -> bytes:
        fields = {k: v for k, v in asdict(self).items() if v is not None}
        return json.dumps(fields, sort_keys=True).encode()

    def as_source_duplicate(self) -> "PaymentEvent":
        """The same business fact arriving through another path: a new event id."""
        return replace(self, event_id=str(uuid.uuid4()))

    def sequenced(self, producer_id: str, producer_seq: int) -> "PaymentEvent":
        """The event as a producer sends it: stamped with that producer's id and running number."""
        return validate(replace(self, producer_id=producer_id, producer_seq=producer_seq))


def _now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def new_transaction_id() -> str:
    """A business id shaped like a PIX endToEndId (E + 31 characters)."""
    return "E" + uuid.uuid4().hex[:31].upper()


def new_event(type_: str, account_id: str, transaction_id: str | None = None, occurred_at: str | None = None,
              **fields) -> PaymentEvent:
    """A new event (a new event id) of ``type_``, validated; ``occurred_at`` defaults to now."""
    event = PaymentEvent(event_id=str(uuid.uuid4()), transaction_id=transaction_id or new_transaction_id(),
                         type=type_, account_id=account_id, occurred_at=occurred_at or _now_iso(), **fields)
    return validate(event)


def credit(account_id: str, amount_cents: int, transaction_id: str | None = None,
           occurred_at: str | None = None) -> PaymentEvent:
    return new_event("credit", account_id, transaction_id, occurred_at, amount_cents=amount_cents)


def set_status(account_id: str, status: str, transaction_id: str | None = None,
               occurred_at: str | None = None) -> PaymentEvent:
    return new_event("set_status", account_id, transaction_id, occurred_at, status=status)


def set_balance(account_id: str, balance_cents: int, transaction_id: str | None = None,
                occurred_at: str | None = None) -> PaymentEvent:
    return new_event("set_balance", account_id, transaction_id, occurred_at, balance_cents=balance_cents)


def set_score(account_id: str, score: int, transaction_id: str | None = None,
              occurred_at: str | None = None) -> PaymentEvent:
    return new_event("set_score", account_id, transaction_id, occurred_at, score=score)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate(event: PaymentEvent) -> PaymentEvent:
    """Raise InvalidEvent naming the first field that is wrong."""
    try:
        uuid.UUID(event.event_id)
    except (ValueError, TypeError, AttributeError):
        raise InvalidEvent(f"event_id is not a UUID: {event.event_id!r}") from None
    # fullmatch: the patterns end in `$`, which re.match also finds before a trailing newline.
    if not isinstance(event.transaction_id, str) or not TRANSACTION_ID.fullmatch(event.transaction_id):
        raise InvalidEvent(f"transaction_id must be 1-64 letters, digits or ._:- : {event.transaction_id!r}")
    if event.type not in EVENT_TYPES:
        raise InvalidEvent(f"type must be one of {', '.join(EVENT_TYPES)}: {event.type!r}")
    if not isinstance(event.account_id, str) or not ACCOUNT_ID.fullmatch(event.account_id):
        raise InvalidEvent(f"account_id must be 1-32 letters, digits, _ or -: {event.account_id!r}")
    for other_type, field in TYPE_FIELDS.items():
        if other_type != event.type and getattr(event, field) is not None:
            raise InvalidEvent(f"{field} is for type {other_type}, not {event.type}")
    if event.type == "credit":
        amount = event.amount_cents
        if not _whole(amount) or not 0 < amount <= MAX_AMOUNT_CENTS:
            raise InvalidEvent(f"amount_cents must be an integer from 1 to {MAX_AMOUNT_CENTS}: {amount!r}")
    if event.type == "set_status" and event.status not in STATUSES:
        raise InvalidEvent(f"status must be one of {', '.join(STATUSES)}: {event.status!r}")
    if event.type == "set_balance":
        cents = event.balance_cents
        if not _whole(cents) or not 0 <= cents <= MAX_BALANCE_CENTS:
            raise InvalidEvent(f"balance_cents must be an integer from 0 to {MAX_BALANCE_CENTS}: {cents!r}")
    if event.type == "set_score":
        low, high = SCORE_RANGE
        if not _whole(event.score) or not low <= event.score <= high:
            raise InvalidEvent(f"score must be an integer from {low} to {high}: {event.score!r}")
    try:
        when = datetime.fromisoformat(event.occurred_at)
    except (TypeError, ValueError):
        raise InvalidEvent(f"occurred_at is not an ISO-8601 timestamp: {event.occurred_at!r}") from None
    if when.tzinfo is None:
        # A set is ordered by its event time: a time without an offset means a different instant
        # to every reader.
        raise InvalidEvent(f"occurred_at needs a UTC offset (like +00:00 or Z): {event.occurred_at!r}")
    if (event.producer_id is None) != (event.producer_seq is None):
        raise InvalidEvent("producer_id and producer_seq go together: give both or neither")
    if event.producer_id is not None:
        if not isinstance(event.producer_id, str) or not PRODUCER_ID.fullmatch(event.producer_id):
            raise InvalidEvent(f"producer_id must be 1-64 letters, digits or ._:- : {event.producer_id!r}")
        if not _whole(event.producer_seq) or not 0 <= event.producer_seq <= MAX_PRODUCER_SEQ:
            raise InvalidEvent(f"producer_seq must be an integer from 0 to {MAX_PRODUCER_SEQ}: {event.producer_seq!r}")
    return event


def decode(value: bytes | None) -> PaymentEvent:
    """Bytes from the topic to a valid PaymentEvent, or InvalidEvent with the reason."""
    if value is None:
        raise InvalidEvent("empty record (no value)")
    try:
        data = json.loads(value.decode("utf-8"))
    except UnicodeDecodeError:
        raise InvalidEvent("value is not UTF-8") from None
    except json.JSONDecodeError as error:
        raise InvalidEvent(f"value is not JSON: {error.msg} at position {error.pos}") from None
    except RecursionError:
        raise InvalidEvent("value is JSON nested too deeply") from None
    except ValueError as error:  # a number of more than 4300 digits (Python's int conversion limit)
        raise InvalidEvent(f"value is JSON the lab cannot read: {error}") from None
    if not isinstance(data, dict):
        raise InvalidEvent(f"value is JSON but not an object: {type(data).__name__}")
    known = {"event_id", "transaction_id", "type", "account_id", "occurred_at", *TYPE_FIELDS.values(),
             "producer_id", "producer_seq"}
    missing = sorted({"event_id", "transaction_id", "type", "account_id", "occurred_at"} - data.keys())
    if missing:
        raise InvalidEvent(f"missing field(s): {', '.join(missing)}")
    unknown = sorted(data.keys() - known)
    if unknown:
        raise InvalidEvent(f"unknown field(s): {', '.join(map(repr, unknown))}")
    return validate(PaymentEvent(**data))


POISON_PILLS = {
    "not-json": b"{this is not json",
    "missing-field": b'{"type": "credit", "account_id": "acc-1", "amount_cents": 100}',
    "negative-amount": json.dumps({
        "event_id": "00000000-0000-4000-8000-000000000000", "transaction_id": "EPOISON",
        "type": "credit", "account_id": "acc-1", "amount_cents": -500,
        "occurred_at": "2026-01-01T00:00:00+00:00"}).encode(),
    "not-utf8": b"\xff\xfe\x00garbage",
}


def poison_pill(kind: str = "not-json") -> bytes:
    """Malformed bytes of a named kind, for the dead-letter exercise."""
    if kind not in POISON_PILLS:
        raise ValueError(f"poison pill kind must be one of {', '.join(POISON_PILLS)}")
    return POISON_PILLS[kind]


def to_dict(event: PaymentEvent) -> dict:
    return {k: v for k, v in asdict(event).items() if v is not None}
