"""``eventid-split``: the same unique key, but committed in its own transaction before the effect.

A crash between the two commits leaves the event marked as processed with no effect: the
redelivery is skipped and the credit is lost.
"""
from __future__ import annotations

from ..domain.events import PaymentEvent
from .base import (
    ABSORBED,
    APPLIED,
    BEGIN,
    COMMIT,
    RECORD_STEP,
    Context,
    Strategy,
    apply_effect,
    effect_steps,
    params,
    point,
    sql,
)
from .batching import RECORD_BATCH_STEP, BatchContext, Item, apply_effects, batch_ends, effect_batch_steps, first_claims
from .eventid_atomic import BATCH_CLAIM, CLAIM, event_key


def apply(ctx: Context, event: PaymentEvent) -> str:
    return claim_then_apply(ctx, event, CLAIM)


def claim_then_apply(ctx: Context, event: PaymentEvent, claim: str) -> str:
    """The key committed in a transaction of its own, then the effect in another (the partitioned
    layout runs it with its own claim)."""
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        if ctx.execute(claim, params(event)).rowcount == 0:
            ctx.record_delivery(event, ABSORBED)
            return ABSORBED
    ctx.checkpoint("between-key-and-effect")
    with ctx.transaction():
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


def apply_batch(ctx: BatchContext, items: list[Item]) -> None:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        claimed = {str(row[0]) for row in ctx.execute(BATCH_CLAIM, {"keys": [event_key(i) for i in items]}).fetchall()}
        fresh = first_claims(items, claimed, event_key)
        ctx.record_batch([item for item in items if item.outcome == ABSORBED])
    ctx.checkpoint("between-key-and-effect")
    with ctx.transaction():
        apply_effects(ctx, fresh)
        ctx.record_batch(fresh)


STRATEGY = Strategy(
    name="eventid-split",
    title="Event id key, split over two transactions",
    teaches="Key and effect must commit together: a crash between them marks the event done and loses the effect.",
    plan=(point("before-effect"), BEGIN, sql(CLAIM, "rowcount 0: already processed, skip"), COMMIT,
          point("between-key-and-effect", "the key is committed, the effect is not: a crash here loses it"),
          BEGIN, *effect_steps(), RECORD_STEP, COMMIT,
          point("after-effect-before-commit"), point("after-commit")),
    apply=apply,
    batch_plan=(point("before-effect"), BEGIN, sql(BATCH_CLAIM, "the batch's keys, committed on their own"),
                RECORD_BATCH_STEP, COMMIT,
                point("between-key-and-effect", "the batch's keys are committed, its effects are not: a crash here "
                                                "loses every effect of the batch"),
                BEGIN, *effect_batch_steps(), *batch_ends()),
    apply_batch=apply_batch,
)
