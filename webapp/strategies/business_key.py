"""``business-key``: as eventid-atomic, keyed on the business transaction id (PIX endToEndId).

Absorbs source duplicates: the same transaction arriving as two events with two event ids.
"""
from __future__ import annotations

from ..domain.events import PaymentEvent
from .base import Context, Strategy
from .batching import BatchContext, Item
from .eventid_atomic import claim_batch_plan, claim_batch_then_apply, claim_plan, claim_then_apply

CLAIM = ("INSERT INTO processed_transactions (transaction_id, processed_at) VALUES (%(transaction_id)s, now())\n"
         "ON CONFLICT (transaction_id) DO NOTHING")
BATCH_CLAIM = ("INSERT INTO processed_transactions (transaction_id, processed_at)\n"
               "SELECT DISTINCT transaction_id, now() FROM unnest(%(keys)s::text[]) AS k(transaction_id)\n"
               "ON CONFLICT (transaction_id) DO NOTHING\n"
               "RETURNING transaction_id")


def apply(ctx: Context, event: PaymentEvent) -> str:
    return claim_then_apply(ctx, event, CLAIM)


def apply_batch(ctx: BatchContext, items: list[Item]) -> None:
    claim_batch_then_apply(ctx, items, BATCH_CLAIM, lambda item: item.event.transaction_id)


STRATEGY = Strategy(
    name="business-key",
    title="Business key (transaction id), one transaction",
    teaches="Dedup on the business id catches the same fact arriving under two event ids.",
    plan=claim_plan(CLAIM, "rowcount 0: this transaction was already applied, skip"),
    apply=apply,
    batch_plan=claim_batch_plan(BATCH_CLAIM, "the transaction ids RETURNING came back: applied; the others were "
                                             "applied before (or earlier in this batch): absorbed"),
    apply_batch=apply_batch,
)
