"""``natural``: effects that are sets need no dedup table; a credit, a delta, is not one of them.

From the 000 seed's table: ``UPDATE order SET status = 'PAID'`` (yes), an upsert by primary key
(yes), ``SET saldo = 500`` (yes), ``balance = balance + 100`` (no: each run accumulates). So
``set_status``, ``set_balance`` and ``set_score`` are written as sets, with no key table at all,
and a credit is applied as the delta it is: a replayed credit is applied again, as the 001 seed
says ("operations that increment or accumulate state ... aren't naturally idempotent").

Idempotent is not commutative: a plain set re-sent late (an old PAID after CLOSED) overwrites the
newer value. Each set carries its event time (``occurred_at``); this strategy writes it beside the
value and refuses a strictly older one. ``<=``, not ``<``: the same event replayed rewrites the
same value, so the guard never does the dedup work; it only orders distinct events.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..domain.events import PaymentEvent
from .base import (
    ABSORBED,
    ACCOUNT_EXISTS,
    APPLIED,
    BEGIN,
    COMMIT,
    CREDIT_BALANCE,
    INSERT_PAYMENT,
    RECORD_STEP,
    Context,
    Strategy,
    no_account,
    note,
    params,
    point,
    sql,
)
from .batching import looped, looped_plan

GUARDED_SET_STATUS = ("UPDATE accounts SET status = %(status)s, status_at = %(occurred_at)s\n"
                      "WHERE id = %(account_id)s AND (status_at IS NULL OR status_at <= %(occurred_at)s)")
GUARDED_SET_BALANCE = ("UPDATE accounts SET balance = %(balance_cents)s, balance_at = %(occurred_at)s\n"
                       "WHERE id = %(account_id)s AND (balance_at IS NULL OR balance_at <= %(occurred_at)s)")
GUARDED_UPSERT_SCORE = ("INSERT INTO scores (account_id, score, score_at)\n"
                        "SELECT id, %(score)s::int, %(occurred_at)s::timestamptz FROM accounts WHERE id = %(account_id)s\n"
                        "ON CONFLICT (account_id) DO UPDATE SET score = EXCLUDED.score, score_at = EXCLUDED.score_at\n"
                        "WHERE scores.score_at <= EXCLUDED.score_at")
GUARDED_SETS = {"set_status": GUARDED_SET_STATUS, "set_balance": GUARDED_SET_BALANCE,
                "set_score": GUARDED_UPSERT_SCORE}
WHAT = {"set_status": "status", "set_balance": "balance", "set_score": "score"}


def applying(sets: dict[str, str], after_set: Callable[[Context, PaymentEvent], None] | None = None,
             ) -> Callable[[Context, PaymentEvent], str]:
    """The natural ``apply`` with ``sets``' statement for each kind of set (natural_clock.py writes
    the status's time from the clock), and ``after_set`` run in the same transaction after each set
    that wrote its row (natural_audit.py writes its audit row there)."""
    def apply(ctx: Context, event: PaymentEvent) -> str:
        ctx.checkpoint("before-effect")
        with ctx.transaction():
            if event.type == "credit":
                # A delta: applied on every delivery, replays included. Nothing here can tell them apart.
                if ctx.execute(CREDIT_BALANCE, params(event)).rowcount != 1:
                    raise no_account(event)
                ctx.execute(INSERT_PAYMENT, params(event))
                outcome, reason = APPLIED, None
            elif ctx.execute(sets[event.type], params(event)).rowcount == 1:
                if after_set is not None:
                    after_set(ctx, event)
                outcome, reason = APPLIED, None
            else:
                # 0 rows: no such account, or the account holds a value set by a newer event.
                if ctx.execute(ACCOUNT_EXISTS, params(event)).fetchone() is None:
                    raise no_account(event)
                outcome = ABSORBED
                reason = (f"older {event.type}: the account's {WHAT[event.type]} was set by a newer event "
                          f"(occurred_at {event.occurred_at} is earlier); not applied")
            ctx.record_delivery(event, outcome, reason)
        return outcome
    return apply


apply = applying(GUARDED_SETS)


STRATEGY = Strategy(
    name="natural",
    title="Natural idempotency (sets as sets, a credit as the delta it is)",
    teaches="A set (status = X, balance = 500, an upsert by key) rewrites the same state however often it runs: "
            "no dedup table. A delta is not naturally idempotent: a replayed credit is applied again.",
    plan=(point("before-effect"), BEGIN,
          sql(CREDIT_BALANCE, "credit: a delta is not naturally idempotent — a redelivered credit is "
                              "applied again (no key table here to stop it)"),
          sql(INSERT_PAYMENT, "credit: one payment row per application"),
          sql(GUARDED_SET_STATUS, "set_status: an absolute value, the same however often it runs; the event-time "
                                  "guard refuses an older status re-sent after a newer one (idempotent is not "
                                  "commutative)"),
          sql(GUARDED_SET_BALANCE, "set_balance: SET saldo = 500, an absolute value, with the same guard"),
          sql(GUARDED_UPSERT_SCORE, "set_score: the credit-score upsert by primary key; the second time it is an "
                                    "update of the same row"),
          sql(ACCOUNT_EXISTS, "a set that changed 0 rows: no such account (dead letter), or a newer value is "
                              "there (recorded as absorbed, with the reason)"),
          RECORD_STEP, COMMIT, point("after-effect-before-commit"), point("after-commit"),
          note("`<=` and not `<`: the same event replayed rewrites the same value — the set is idempotent by "
               "itself; the guard only keeps distinct events in event-time order. No processed_events, no "
               "processed_transactions, no ledger.")),
    apply=apply,
    apply_batch=looped(apply),
)

# Batch mode: the per-message statements in a loop, one transaction per batch (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "each set's event-time guard orders it against the value before it, and a credit is a plain delta."))
