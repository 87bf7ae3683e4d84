"""Batch mode's shared SQL: one transaction per batch, set-based statements where that is honest.

A batch is the records one ``consume(n)`` returned, in log order. Its strategy claims the keys of
the whole batch with one statement, applies the credits with one UPDATE and one INSERT, and writes
the delivery ledger with one INSERT, all in one transaction; the consumer then commits the
offsets of the batch once. A crash or a rebalance between the database commit and the offset
commit redelivers the whole batch.

Set-based only where it changes nothing but the number of round trips:

- credits are deltas, so they commute: one UPDATE adds each account's sum. A batch that also
  holds a set (set_status, set_balance, set_score) applies its effects one by one in log order,
  with the per-message statements: a set and a delta on the same account do not commute.
- strategies whose lesson lives in the per-record statements (check-then-act's race, natural's
  event-time guard, payload-hash's key computed per record) run their per-message statements in
  a loop inside the batch's one transaction (:func:`looped`), and their plan says so.

Crash points are per batch: ``before-effect`` before the transaction, ``between-key-and-effect``
after the claim (key strategies), ``after-effect-before-commit`` after the database commit and
``after-commit`` after the offset commit.
"""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..domain.events import PaymentEvent
from .base import (
    ABSORBED,
    APPLIED,
    BEGIN,
    COMMIT,
    RECORD_STEP,
    Context,
    Step,
    apply_effect,
    effect_steps,
    note,
    point,
    sql,
)

CREDIT_BATCH = ("UPDATE accounts SET balance = accounts.balance + credits.total\n"
                "FROM (SELECT account_id, sum(amount_cents) AS total\n"
                "      FROM unnest(%(account_ids)s::text[], %(amounts_cents)s::bigint[]) AS c(account_id, amount_cents)\n"
                "      GROUP BY account_id) AS credits\n"
                "WHERE accounts.id = credits.account_id")
INSERT_PAYMENTS_BATCH = ("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents)\n"
                         "SELECT * FROM unnest(%(event_ids)s::uuid[], %(transaction_ids)s::text[],\n"
                         "                     %(account_ids)s::text[], %(amounts_cents)s::bigint[])")
RECORD_DELIVERIES_BATCH = (
    'INSERT INTO deliveries (group_id, consumer, partition, "offset", generation, attempt,\n'
    "                        event_id, transaction_id, strategy, outcome, reason)\n"
    'SELECT %(group_id)s::varchar, %(consumer)s, d.partition, d."offset", %(generation)s,\n'
    "       (SELECT count(*) FROM deliveries p\n"
    '        WHERE p.group_id = %(group_id)s::varchar AND p.partition = d.partition AND p."offset" = d."offset") + 1,\n'
    "       d.event_id, d.transaction_id, %(strategy)s, d.outcome, d.reason\n"
    "FROM unnest(%(partitions)s::int[], %(offsets)s::bigint[], %(event_ids)s::uuid[], %(transaction_ids)s::text[],\n"
    '            %(outcomes)s::text[], %(reasons)s::text[]) AS d(partition, "offset", event_id, transaction_id,\n'
    "                                                          outcome, reason)")
RECORD_BATCH_STEP = sql(RECORD_DELIVERIES_BATCH, "lab bookkeeping: the batch's ledger rows, one statement, in the "
                                                 "same transaction as the effects; attempt counted per offset")


@dataclass
class Item:
    """One record of a batch, and what the batch did with it."""
    event: PaymentEvent
    partition: int
    offset: int
    outcome: str | None = None
    reason: str | None = None


class BatchContext(Protocol):
    """What a strategy's ``apply_batch`` may do: run SQL, open a transaction, pass a crash point,
    write the ledger rows of the batch's items (their outcomes set)."""

    def execute(self, statement: str, params: dict[str, Any]) -> Any: ...
    def transaction(self) -> Any: ...
    def checkpoint(self, point: str) -> None: ...
    def record_batch(self, items: list[Item]) -> None: ...


class BatchRejected(Exception):
    """The batch cannot be applied as a whole (an unknown account): it is rolled back, and the
    consumer applies its records one by one, where each gets its own outcome."""


def columns(items: list[Item]) -> dict[str, list]:
    """The batch's events as parallel arrays, the shape ``unnest`` reads."""
    return {"event_ids": [i.event.event_id for i in items], "transaction_ids": [i.event.transaction_id for i in items],
            "account_ids": [i.event.account_id for i in items],
            "amounts_cents": [i.event.amount_cents for i in items]}


def apply_effects(ctx: BatchContext, items: list[Item]) -> None:
    """The business effect of ``items``: set-based when they are all credits, else one by one in
    log order with the per-message statements. Marks each item applied."""
    if not items:
        return
    if all(i.event.type == "credit" for i in items):
        arrays = columns(items)
        accounts = set(arrays["account_ids"])
        if ctx.execute(CREDIT_BATCH, arrays).rowcount != len(accounts):
            raise BatchRejected("a credit of the batch names an account this lab does not have")
        ctx.execute(INSERT_PAYMENTS_BATCH, arrays)
    else:
        for item in items:
            apply_effect(ctx, item.event)
    for item in items:
        item.outcome = APPLIED


def first_claims(items: list[Item], claimed: set[str], key: Callable[[Item], str]) -> list[Item]:
    """The items whose key this batch claimed, the first of each key only (a key twice in one batch,
    a resend, is absorbed the second time as it would be one message later). The rest are marked
    absorbed."""
    fresh = []
    for item in items:
        k = key(item)
        if k in claimed:
            claimed.discard(k)
            fresh.append(item)
        else:
            item.outcome = ABSORBED
    return fresh


def effect_batch_steps() -> tuple[Step, ...]:
    return (sql(CREDIT_BATCH, "credits of the batch: one UPDATE adds each account's sum (deltas commute)"),
            sql(INSERT_PAYMENTS_BATCH, "one payment row per applied credit, one statement"),
            note("A batch that holds a set (set_status, set_balance, set_score) applies its effects one by one in "
                 "log order with the per-message statements instead: a set and a delta do not commute."),
            *effect_steps())


def batch_ends() -> tuple[Step, ...]:
    return (RECORD_BATCH_STEP, COMMIT,
            point("after-effect-before-commit", "the batch's effects are committed, its offsets are not: a crash or "
                                                "a rebalance here redelivers the whole batch"),
            point("after-commit", "one offset commit for the batch: the highest offset + 1 of each partition"))


def plain_batch_plan() -> tuple[Step, ...]:
    """``none``'s batch: the effects set-based, nothing remembers what was applied."""
    return (point("before-effect"), BEGIN, *effect_batch_steps(), *batch_ends())


# --- strategies that batch as a loop of their per-message statements --------------------------------

class _ItemContext:
    """A strategy's per-message ``apply`` run for one item inside the batch's transaction: its
    statements run as they are; its transaction is the batch's (no savepoint: any error rolls the
    whole batch back); its crash points are the batch's, passed once around the loop; its ledger
    row is kept on the item and written with the batch's."""

    def __init__(self, ctx: BatchContext, item: Item):
        self._ctx = ctx
        self._item = item

    def execute(self, statement: str, params: dict[str, Any]) -> Any:
        return self._ctx.execute(statement, params)

    def transaction(self):
        return nullcontext()

    def checkpoint(self, point_name: str) -> None:
        pass

    def record_delivery(self, event: PaymentEvent | None, outcome: str, reason: str | None = None) -> None:
        self._item.outcome, self._item.reason = outcome, reason


def looped(apply: Callable[[Context, PaymentEvent], str],
           opening: str | None = None) -> Callable[[BatchContext, list[Item]], None]:
    """``apply_batch`` for a strategy that cannot be set-based honestly: its per-message ``apply``
    for each record in log order, inside one transaction per batch. ``opening``: a statement run
    once, first in the batch's transaction (a SET TRANSACTION)."""
    def apply_batch(ctx: BatchContext, items: list[Item]) -> None:
        ctx.checkpoint("before-effect")
        with ctx.transaction():
            if opening is not None:
                ctx.execute(opening, {})
            for item in items:
                apply(_ItemContext(ctx, item), item.event)
            ctx.record_batch(items)
    return apply_batch


def looped_plan(plan: tuple[Step, ...], why: str, opening: Step | None = None) -> tuple[Step, ...]:
    """The batch plan of a :func:`looped` strategy: its per-message statements, in a loop, in one
    transaction; the ledger written once for the batch. ``opening``: the step run once after BEGIN."""
    statements = tuple(step for step in plan if step.kind == "sql" and step is not RECORD_STEP and step is not opening)
    return (point("before-effect"), BEGIN, *((opening,) if opening is not None else ()),
            note(f"Not set-based: {why} For each record of the batch, in log order, the per-message statements:"),
            *statements, *batch_ends())

