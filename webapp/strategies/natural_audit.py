"""``natural-audit``: natural's sets, each with an audit row beside it, a new row per execution.

The set is idempotent: a redelivery rewrites the same row. The audit row written beside it is an
``INSERT`` of an audit event, which source text 000's table marks "Não" (no): "Cada execução cria
uma linha nova", each execution creates a new row. Its id comes from ``gen_random_uuid()``, new on
every run, so nothing conflicts: a redelivered status leaves the account as it was and the trail
with one row more. One non-idempotent statement makes the transaction not idempotent, however
idempotent the rest of it is. ``natural-audit-keyed`` (natural_audit_keyed.py) is the fix.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..domain.events import PaymentEvent
from .base import (
    ACCOUNT_EXISTS,
    BEGIN,
    COMMIT,
    CREDIT_BALANCE,
    INSERT_PAYMENT,
    RECORD_STEP,
    Context,
    Strategy,
    note,
    params,
    point,
    sql,
)
from .batching import looped, looped_plan
from .natural import GUARDED_SET_BALANCE, GUARDED_SET_STATUS, GUARDED_SETS, GUARDED_UPSERT_SCORE, WHAT, applying

AUDIT_COLUMNS = "INSERT INTO audit_events (id, event_id, transaction_id, account_id, action)\n"
INSERT_AUDIT_ROW = (AUDIT_COLUMNS +
                    "VALUES (gen_random_uuid(), %(event_id)s, %(transaction_id)s, %(account_id)s, %(action)s)")


def action(event: PaymentEvent) -> str:
    """What the audit row says the set did: ``status PAID``, ``balance 50000``, ``score 700``."""
    value = {"set_status": event.status, "set_balance": event.balance_cents, "set_score": event.score}[event.type]
    return f"{WHAT[event.type]} {value}"


def auditing(audit: str) -> Callable[[Context, PaymentEvent], str]:
    """natural's ``apply`` with ``audit`` run after each set that changed its row (credits, deltas as
    in natural, are not audited)."""
    return applying(GUARDED_SETS, after_set=lambda ctx, event: ctx.execute(audit, {**params(event),
                                                                                   "action": action(event)}))


def sets_steps(why: str) -> tuple:
    """natural's guarded sets, as its plan shows them (the audit row follows each that changed a row)."""
    return (sql(GUARDED_SET_STATUS, f"set_status: an absolute value with the event's time, as natural: {why}"),
            sql(GUARDED_SET_BALANCE, "set_balance: as natural, the event's time"),
            sql(GUARDED_UPSERT_SCORE, "set_score: as natural, the event's time"))


apply = auditing(INSERT_AUDIT_ROW)

STRATEGY = Strategy(
    name="natural-audit",
    title="Natural idempotency with an audit row per set, a new row per execution",
    teaches="An idempotent set with an INSERT of an audit event beside it is not idempotent: a redelivery rewrites "
            "the same account row and adds a second audit row.",
    plan=(point("before-effect"), BEGIN,
          sql(CREDIT_BALANCE, "credit: a delta, applied again on a redelivery, as in natural (not audited)"),
          sql(INSERT_PAYMENT, "credit: one payment row per application"),
          *sets_steps("a redelivery rewrites the same row"),
          sql(INSERT_AUDIT_ROW, "the line that decides: after a set that wrote its row, one audit row with an id "
                                "from gen_random_uuid(), new on every execution: nothing conflicts, so a "
                                "redelivery adds a second row for the same event (source text 000: \"INSERT de "
                                "um evento de auditoria\", Não). The set beside it stays idempotent; the "
                                "transaction does not"),
          sql(ACCOUNT_EXISTS, "a set that changed 0 rows: no such account (dead letter), or a newer value is "
                              "there (absorbed, not audited)"),
          RECORD_STEP, COMMIT, point("after-effect-before-commit"), point("after-commit"),
          note("The verdict counts audit rows beyond one per transaction: each is a redelivery (or a resend, or a "
               "source duplicate) the trail recorded as a second event.")),
    apply=apply,
    apply_batch=looped(apply),
)

# Batch mode: the per-message statements in a loop, one transaction per batch (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "each set that wrote its row adds an audit row with a new id; a redelivered batch adds them again."))
