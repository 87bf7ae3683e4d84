"""``none``: apply every delivery. Redelivery doubles the effect."""
from __future__ import annotations

from ..events import PaymentEvent
from .base import (APPLIED, BEGIN, COMMIT, RECORD_STEP, Context, Strategy, apply_effect, effect_steps, point)


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


STRATEGY = Strategy(
    name="none",
    title="No deduplication",
    teaches="At-least-once delivery plus a non-idempotent effect: every redelivery applies the credit again.",
    plan=(point("before-effect"), BEGIN, *effect_steps(), RECORD_STEP, COMMIT,
          point("after-effect-before-commit", "the classic window: effect committed, offset not yet"),
          point("after-commit")),
    apply=apply,
)
