"""``business-key``: as eventid-atomic, keyed on the business transaction id (PIX endToEndId).

Absorbs source duplicates: the same transaction arriving as two events with two event ids.
"""
from __future__ import annotations

from ..events import PaymentEvent
from .base import Context, Strategy
from .eventid_atomic import claim_plan, claim_then_apply

CLAIM = ("INSERT INTO processed_transactions (transaction_id, processed_at) VALUES (%(transaction_id)s, now())\n"
         "ON CONFLICT (transaction_id) DO NOTHING")


def apply(ctx: Context, event: PaymentEvent) -> str:
    return claim_then_apply(ctx, event, CLAIM)


STRATEGY = Strategy(
    name="business-key",
    title="Business key (transaction id), one transaction",
    teaches="Dedup on the business id catches the same fact arriving under two event ids.",
    plan=claim_plan(CLAIM, "rowcount 0: this transaction was already applied, skip"),
    apply=apply,
)
