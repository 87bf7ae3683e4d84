"""``eventid-atomic``: claim the event id with a unique key, in the effect's own transaction.

``INSERT ... ON CONFLICT DO NOTHING`` affecting 0 rows means the event was processed: skip.
Key and effect commit together or not at all; a concurrent claim of the same key waits on
the first transaction and then sees the conflict. The correct pattern.
"""
from __future__ import annotations

from ..events import PaymentEvent
from .base import (ABSORBED, APPLIED, BEGIN, COMMIT, RECORD_STEP, Context, Strategy, apply_effect,
                   effect_steps, params, point, sql)

CLAIM = ("INSERT INTO processed_events (event_id, processed_at) VALUES (%(event_id)s, now())\n"
         "ON CONFLICT (event_id) DO NOTHING")


def claim_then_apply(ctx: Context, event: PaymentEvent, claim: str) -> str:
    """Shared by eventid-atomic and business-key: they differ only in the key they claim."""
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        if ctx.execute(claim, params(event)).rowcount == 0:
            ctx.record_delivery(event, ABSORBED)
            return ABSORBED
        ctx.checkpoint("between-key-and-effect")
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


def claim_plan(claim: str, key_note: str):
    return (point("before-effect"), BEGIN, sql(claim, key_note),
            point("between-key-and-effect", "inside the transaction: a crash here rolls the key back too"),
            *effect_steps(), RECORD_STEP, COMMIT,
            point("after-effect-before-commit", "redelivery finds the key and skips"), point("after-commit"))


def apply(ctx: Context, event: PaymentEvent) -> str:
    return claim_then_apply(ctx, event, CLAIM)


STRATEGY = Strategy(
    name="eventid-atomic",
    title="Event id + unique key, one transaction",
    teaches="The uniqueness constraint, in the same transaction as the effect, absorbs every redelivery.",
    plan=claim_plan(CLAIM, "rowcount 0: already processed, skip"),
    apply=apply,
)
