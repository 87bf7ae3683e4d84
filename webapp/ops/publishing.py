"""Publishing payment events: normal, a burst, a resend, a source duplicate, a poison pill."""
from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Any, Literal
from uuid import UUID

from pydantic import AliasChoices, Field, field_validator, model_validator

from ..domain import commands, events, verbs
from ..domain.vocabulary import PRODUCER_ACKS, PUBLISH_MODES, Limits
from ..store import labdata, schema
from . import limits
from .agent_commands import run_command
from .fields import Amount, Whole, account, transaction, within
from .registry import Args, Context, InvalidRequest, operation

MAX_CENTS = Limits.AMOUNT_CENTS[1]
# What each event type needs besides the account, and the field that carries it.
TYPE_FIELD = {"credit": "amount", "set_status": "status", "set_balance": "balance_cents", "set_score": "score"}


class PublishArgs(Args):
    """What to publish to the lab's payments topic (the agent's producer writes it)."""
    mode: Literal[PUBLISH_MODES] = Field(
        "normal", description="normal: one event; burst: `count` events; resend: the same event again "
        "(same event_id); source-duplicate: the same transaction under a new event_id; poison: a malformed record")
    type: Literal[tuple(events.EVENT_TYPES)] = Field("credit", description="the event type")
    account_id: str = account()
    amount_cents: Whole = within(Limits.AMOUNT_CENTS, "a credit's amount in cents")
    amount: Amount = Field(None, description="a credit's amount in currency units, like 12.50 "
                               "(instead of amount_cents)")
    status: Literal[events.STATUSES] = Field(None, description="set_status: the status to set")
    balance_cents: Whole = within((0, MAX_CENTS), "set_balance: the absolute balance in cents")
    score: Whole = within(Limits.SCORE, "set_score: the credit score to upsert")
    count: Whole = within(Limits.BURST, "burst: how many events", default=10)
    event_id: UUID | None = Field(None, description="resend/source-duplicate: the event to repeat "
                                 "(default: the newest published)")
    transaction_id: str = transaction()
    occurred_at: datetime | None = Field(None, description="the event's own time (default: now); an old "
                                         "time makes a late set")
    poison_kind: Literal[tuple(events.POISON_PILLS)] = Field(
        "not-json", validation_alias=AliasChoices("poison_kind"), description="poison: which malformed record")
    idempotent: bool = Field(True, description="enable.idempotence on the producer")
    max_in_flight: Whole = within(Limits.MAX_IN_FLIGHT, "max.in.flight.requests.per.connection on the producer "
                                  "(empty: librdkafka's default); with idempotence off and more than one, a retried "
                                  "batch can land after a later one; with idempotence on, more than 5 is refused "
                                  "by librdkafka")
    acks: Literal[PRODUCER_ACKS] | None = Field(None, description="acks on the producer (empty: all, the lab's); "
                                                "with idempotence on, anything but all is refused by librdkafka")
    retries: Whole = within(Limits.PRODUCER_RETRIES, "retries on the producer (empty: librdkafka's default); "
                            "with idempotence on, 0 is refused by librdkafka")

    @model_validator(mode="after")
    def _what_the_mode_needs(self) -> "PublishArgs":
        if self.mode in ("poison", "resend", "source-duplicate"):
            return self
        if self.account_id is None:
            raise InvalidRequest("account_id", "choose an account")
        needed = TYPE_FIELD.get(self.type)
        if self.type == "credit":
            if self.amount_cents is None and self.amount is None:
                raise InvalidRequest("amount", "must be a positive amount like 100 or 12.50")
        elif needed and getattr(self, needed) is None:
            raise InvalidRequest(needed, f"is required for a {self.type} event")
        return self

    @property
    def cents(self) -> int | None:
        if self.amount_cents is not None:
            return self.amount_cents
        return int(Decimal(self.amount) * 100) if self.amount is not None else None

    def command(self) -> commands.Publish:
        """The agent's publish command: only what the mode uses."""
        args: dict[str, Any] = {"mode": self.mode, "idempotent": self.idempotent}
        if self.max_in_flight is not None:
            args["max_in_flight"] = self.max_in_flight
        if self.acks is not None:
            args["acks"] = self.acks
        if self.retries is not None:
            args["retries"] = self.retries
        if self.mode == "poison":
            args["poison_kind"] = self.poison_kind
            return commands.Publish(**args)
        if self.mode in ("resend", "source-duplicate"):
            if self.event_id:
                args["event_id"] = str(self.event_id)
            return commands.Publish(**args)
        args.update(type=self.type, account_id=self.account_id)
        if self.type == "credit":
            args["amount_cents"] = self.cents
        else:
            args[TYPE_FIELD[self.type]] = getattr(self, TYPE_FIELD[self.type])
        if self.mode == "burst":
            args["count"] = self.count
        if self.transaction_id:
            args["transaction_id"] = self.transaction_id
        if self.occurred_at:
            args["occurred_at"] = self.occurred_at.isoformat()
        return commands.Publish(**args)


@operation("publish", path="/publish", status=201, step="publish", tags=("events",),
           summary="Publish payment events through the agent's producer, and journal them")
def publish(ctx: Context, args: PublishArgs) -> dict:
    limits.check_burst(ctx, args.count if args.mode == "burst" else None)
    result = run_command(ctx, verbs.PUBLISH, args.command(), field="mode")
    _wait_mirrored(ctx, result.get("records") or [])
    return result


def _wait_mirrored(ctx: Context, records: list[dict]) -> None:
    """What the lab just wrote is on every panel when the request returns: wait (bounded) until the
    log reader has mirrored it. Here, in the request, not in the agent: the agent carries out one
    command at a time, and a class's publishes each waiting there for a reader that is behind
    queued up behind each other (bench/classroom.py at 30: a publish past 30 s). A reader that is
    behind only delays this; nothing is lost."""
    labdata.wait_mirrored(ctx.engine, ctx.lab.schema, records)


class ProduceRawArgs(Args):
    """A record exactly as typed, as any other Kafka client could write it: a malformed record, an
    external duplicate, an event from "another system"."""
    key: str | None = Field(None, max_length=1024, description="the record's key as typed (the lab's events "
                            "use the account id); empty: no key")
    value: str | None = Field(None, max_length=Limits.RAW_VALUE_CHARACTERS, description="the record's value exactly as typed: "
                              "JSON or any text; empty: no value (a tombstone)")
    headers: dict[str, str] | None = Field(None, description='headers, as a JSON object like {"source": "bank-b"} '
                                           f'or one `name: value` per line; at most {Limits.RAW_HEADERS} headers, '
                                           f'names of at most {Limits.RAW_HEADER_NAME_CHARACTERS} characters, '
                                           f'values of at most {Limits.RAW_HEADER_VALUE_CHARACTERS}')
    partition: Whole = within(Limits.PARTITION_INDEX, "the partition; empty: chosen from the key")
    idempotent: bool = Field(True, description="enable.idempotence on the producer")
    transaction: Literal["none", "abort"] = Field(
        "none", description="abort: write the record inside a Kafka transaction and abort it; the broker keeps "
                            "it in the log, and a read_committed consumer (the lab's, the log reader) skips it")

    def command(self) -> commands.ProduceRaw:
        """The agent's ``produce.raw`` for this record."""
        return self.as_command(commands.ProduceRaw)

    @field_validator("headers", mode="before")
    @classmethod
    def _headers_as_typed(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        text = value.strip()
        if text.startswith("{"):
            try:
                return json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"is not a JSON object: {error.msg}") from None
        pairs = [line.split(":", 1) for line in text.splitlines() if line.strip()]
        if any(len(pair) != 2 or not pair[0].strip() for pair in pairs):
            raise ValueError("give one `name: value` per line, or a JSON object")
        return {name.strip(): header.strip() for name, header in pairs}

    @field_validator("headers")
    @classmethod
    def _headers_within_bounds(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        """Bounded like the value: a record's headers travel to the broker and into every panel."""
        if not value:
            return value
        if len(value) > Limits.RAW_HEADERS:
            raise ValueError(f"at most {Limits.RAW_HEADERS} headers on one record ({len(value)} given)")
        for name, header in value.items():
            if not name:
                raise ValueError("a header needs a name")
            if len(name) > Limits.RAW_HEADER_NAME_CHARACTERS:
                raise ValueError(f"header name {name[:20]!r}… is longer than "
                                 f"{Limits.RAW_HEADER_NAME_CHARACTERS} characters")
            if len(header) > Limits.RAW_HEADER_VALUE_CHARACTERS:
                raise ValueError(f"header {name[:40]!r}: its value is longer than "
                                 f"{Limits.RAW_HEADER_VALUE_CHARACTERS} characters")
        return value


@operation("produce_raw", path="/produce-raw", status=201, step="produce_raw", tags=("events",),
           summary="Produce one record exactly as typed (key, value, headers, partition), like any Kafka client")
def produce_raw(ctx: Context, args: ProduceRawArgs) -> dict:
    limits.check_raw_record(ctx, args.value, args.headers)
    if args.partition is not None:
        with schema.connect_in(ctx.engine, ctx.lab.schema) as conn:
            partitions = int(labdata.settings(conn).get("partitions") or 1)
        if args.partition >= partitions:
            raise InvalidRequest("partition", f"{ctx.lab.topic} has {partitions} partition(s): 0 to {partitions - 1}")
    record = run_command(ctx, verbs.PRODUCE_RAW, args.command(), field="value")
    if not record.get("aborted"):
        # An aborted record is never mirrored: the log reader reads read_committed, as consumers do.
        _wait_mirrored(ctx, [record])
    return record


def template_event(account_id: str = "acc-1") -> dict[str, Any]:
    """A valid credit to start a raw record from: the form's "template" button fills it in."""
    event = events.credit(account_id, 10_000)
    return {"key": event.account_id, "value": json.dumps(events.to_dict(event), indent=1)}
