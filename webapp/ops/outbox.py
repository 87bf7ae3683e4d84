"""The transactional outbox: the payments service writes a payment and its outbox row in one
PostgreSQL transaction (here, in the web process: no Kafka); the lab's outbox relay (a process the
agent keeps running, webapp/outbox) publishes the row and marks it sent. Its crash points show
the relay's own at-least-once. The SQL is store/outbox.py's."""
from __future__ import annotations

import json
from datetime import datetime
from decimal import Decimal
from typing import Literal

from pydantic import Field, model_validator
from sqlalchemy.exc import IntegrityError

from ..domain import events
from ..domain.vocabulary import RELAY_CRASH_POINTS, Limits
from ..readmodel import outbox as read
from ..store import outbox as store
from ..store import schema
from ..store.labdata import say
from .fields import Amount, Whole, account, transaction, within
from .registry import Args, Context, InvalidRequest, NoArgs, operation


class OutboxPublishArgs(Args):
    """A credit the payments service records and hands to its outbox."""
    account_id: str = account()
    amount_cents: Whole = within(Limits.AMOUNT_CENTS, "the credit's amount in cents")
    amount: Amount = Field(None, description="the credit's amount in currency units, like 12.50 "
                               "(instead of amount_cents)")
    transaction_id: str = transaction()
    occurred_at: datetime | None = Field(None, description="the event's own time (default: now)")

    @model_validator(mode="after")
    def _what_a_payment_needs(self) -> "OutboxPublishArgs":
        if self.account_id is None:
            raise InvalidRequest("account_id", "choose an account")
        if self.amount_cents is None and self.amount is None:
            raise InvalidRequest("amount", "must be a positive amount like 100 or 12.50")
        return self

    @property
    def cents(self) -> int:
        return self.amount_cents if self.amount_cents is not None else int(Decimal(self.amount) * 100)


class ArmRelayArgs(Args):
    point: Literal[RELAY_CRASH_POINTS] | None = Field(
        None, description="where the relay kills itself (SIGKILL): before it produces the unsent rows, or after "
        "their delivery reports and before it marks them sent; empty: disarm")
    always: bool = Field(False, description="crash there every time (default: once)")


@operation("publish_via_outbox", path="/outbox/publish", status=201, step="publish_via_outbox", tags=("outbox",),
           summary="The payments service: a payment and its outbox row in one PostgreSQL transaction; "
                   "the lab's outbox relay publishes the row to Kafka and marks it sent")
def publish_via_outbox(ctx: Context, args: OutboxPublishArgs) -> dict:
    try:
        event = events.credit(args.account_id, args.cents, transaction_id=args.transaction_id,
                              occurred_at=args.occurred_at.isoformat() if args.occurred_at else None)
    except events.InvalidEvent as error:
        named = next((name for name in ("occurred_at", "transaction_id", "account_id") if name in error.reason), "amount")
        raise InvalidRequest(named, error.reason) from None
    payload = event.encode().decode()
    try:
        with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
            known = conn.exec_driver_sql("SELECT 1 FROM accounts WHERE id = %(id)s", {"id": event.account_id}).first()
            if known is None:
                raise InvalidRequest("account_id", f"no account {event.account_id!r}")
            payment_id, outbox_id = store.write_payment(
                conn, {"transaction_id": event.transaction_id, "event_id": event.event_id,
                       "account_id": event.account_id, "amount_cents": event.amount_cents},
                event.account_id, payload)
            say(conn, "outbox", f"payments service: payment #{payment_id} (credit {event.account_id} "
                f"+{event.amount_cents / 100:.2f}) and outbox row #{outbox_id} committed in one transaction",
                action="written", event_id=event.event_id, transaction_id=event.transaction_id)
    except IntegrityError as error:
        if store.PAYMENT_UNIQUE not in str(error.orig):
            raise
        raise InvalidRequest("transaction_id", f"the payments service has payment {event.transaction_id} already: "
                             "the transaction rolled back, and no outbox row was written") from None
    return {"payment_id": payment_id, "outbox_id": outbox_id, "event_id": event.event_id,
            "transaction_id": event.transaction_id, "key": event.account_id, "payload": json.loads(payload)}


@operation("arm_relay_fault", path="/outbox/relay/arm", step="arm_relay", tags=("outbox",),
           summary="Arm a crash point of the outbox relay (no point: disarm); it kills itself there (SIGKILL) "
                   "and the lab agent starts it again")
def arm_relay_fault(ctx: Context, args: ArmRelayArgs) -> dict:
    with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
        store.arm(conn, args.point, args.always)
        say(conn, "fault", f"outbox relay armed: crash at {args.point} ({'every time' if args.always else 'once'})"
            if args.point else "outbox relay disarmed", point=args.point, always=args.always, action="armed")
    return get_outbox(ctx, NoArgs())


@operation("get_outbox", method="GET", path="/outbox", tags=("outbox",),
           summary="The outbox (pending and sent rows, the newest ones, events published more than once) "
                   "and the relay's state")
def get_outbox(ctx: Context, args: NoArgs) -> dict:
    with schema.session_in(ctx.engine, ctx.lab.schema) as session:
        data = read.outbox(session)
    return {"pending": data["pending"], "sent": data["sent"], "payments": data["payments"], "relay": data["relay"],
            "newest": [{**row, "payload": json.loads(row["payload"])} for row in data["newest"]],
            "republished_events": data["republished_events"]}
