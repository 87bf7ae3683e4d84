"""``none``: apply every delivery. Redelivery doubles the effect."""
from __future__ import annotations

from ..domain.events import PaymentEvent
from .base import APPLIED, BEGIN, COMMIT, RECORD_STEP, Context, Strategy, apply_effect, effect_steps, point
from .batching import BatchContext, Item, apply_effects, plain_batch_plan


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


def apply_batch(ctx: BatchContext, items: list[Item]) -> None:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        apply_effects(ctx, items)
        ctx.record_batch(items)


STRATEGY = Strategy(
    name="none",
    title="No deduplication",
    teaches="At-least-once delivery plus a non-idempotent effect: every redelivery applies the credit again.",
    plan=(point("before-effect"), BEGIN, *effect_steps(), RECORD_STEP, COMMIT,
          point("after-effect-before-commit", "the classic window: effect committed, offset not yet"),
          point("after-commit")),
    apply=apply,
    batch_plan=plain_batch_plan(),
    apply_batch=apply_batch,
)
