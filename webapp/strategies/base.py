"""What every strategy shares: the effect SQL, the plan shown on screen, the apply context.

A strategy knows SQL and nothing of Flask or Kafka. Its ``apply`` runs statements through
``ctx.execute`` and stops at named crash points through ``ctx.checkpoint``; its ``plan`` lists
the same statements (the same string objects) with the transaction boundaries, so the SQL a
person reads on screen is the SQL the consumer runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..events import InvalidEvent, PaymentEvent

# Crash points in the order a message passes them.
POINTS = ("before-effect", "between-check-and-act", "between-key-and-effect",
          "after-effect-before-commit", "after-commit")

CREDIT_BALANCE = "UPDATE accounts SET balance = balance + %(amount_cents)s WHERE id = %(account_id)s"
INSERT_PAYMENT = ("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents)\n"
                  "VALUES (%(event_id)s, %(transaction_id)s, %(account_id)s, %(amount_cents)s)")
SET_STATUS = "UPDATE accounts SET status = %(status)s WHERE id = %(account_id)s"
RECORD_DELIVERY = (
    'INSERT INTO deliveries (group_id, consumer, partition, "offset", generation, attempt,\n'
    "                        event_id, transaction_id, strategy, outcome, reason)\n"
    "SELECT %(group_id)s::varchar, %(consumer)s, %(partition)s::int, %(offset)s::bigint, %(generation)s,\n"
    "       count(*) + 1, %(event_id)s::uuid, %(transaction_id)s, %(strategy)s, %(outcome)s, %(reason)s\n"
    'FROM deliveries\n'
    'WHERE group_id = %(group_id)s::varchar AND partition = %(partition)s::int AND "offset" = %(offset)s::bigint')

APPLIED = "applied"
ABSORBED = "absorbed"
DEAD_LETTERED = "dead-lettered"


@dataclass(frozen=True)
class Step:
    """One line of a strategy's plan: ``begin``, ``commit``, ``sql`` (with text), ``point`` or ``note``."""
    kind: str
    text: str = ""
    note: str = ""


BEGIN = Step("begin", "BEGIN")
COMMIT = Step("commit", "COMMIT")


def sql(text: str, note: str = "") -> Step:
    return Step("sql", text, note)


def point(name: str, note: str = "") -> Step:
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name}")
    return Step("point", name, note)


def note(text: str) -> Step:
    return Step("note", text)


class Context(Protocol):
    """What a strategy may do: run SQL, open a transaction, pass a crash point, log a delivery."""

    def execute(self, statement: str, params: dict[str, Any]) -> Any: ...
    def transaction(self) -> Any: ...
    def checkpoint(self, point: str) -> None: ...
    def record_delivery(self, event: PaymentEvent | None, outcome: str, reason: str | None = None) -> None: ...


@dataclass(frozen=True)
class Strategy:
    name: str
    title: str
    teaches: str
    plan: tuple[Step, ...]
    apply: Callable[[Context, PaymentEvent], str]

    @property
    def points(self) -> tuple[str, ...]:
        """The crash points this strategy passes; arming another one has no effect."""
        names = [step.text for step in self.plan if step.kind == "point"]
        return tuple(p for p in POINTS if p in names)

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(step.text for step in self.plan if step.kind == "sql")


def params(event: PaymentEvent) -> dict[str, Any]:
    return {"event_id": event.event_id, "transaction_id": event.transaction_id, "account_id": event.account_id,
            "amount_cents": event.amount_cents, "status": event.status}


def apply_effect(ctx: Context, event: PaymentEvent) -> None:
    """The business effect, not idempotent for credits: a delta and a new payment row."""
    if event.type == "set_status":
        cursor = ctx.execute(SET_STATUS, params(event))
    else:
        cursor = ctx.execute(CREDIT_BALANCE, params(event))
        if cursor.rowcount == 1:
            ctx.execute(INSERT_PAYMENT, params(event))
    if cursor.rowcount != 1:
        # Rolls the transaction back; the consumer dead-letters the record with this reason.
        raise InvalidEvent(f"no account {event.account_id!r} in this lab")


def effect_steps(note_text: str = "") -> tuple[Step, ...]:
    return (sql(CREDIT_BALANCE, note_text or "the effect: a delta, not idempotent"),
            sql(INSERT_PAYMENT, "one payment row per applied credit"))


RECORD_STEP = sql(RECORD_DELIVERY, "lab bookkeeping: the delivery ledger, in the same transaction as the effect")
