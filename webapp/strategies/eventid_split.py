"""``eventid-split``: the same unique key, but committed in its own transaction before the effect.

A crash between the two commits leaves the event marked as processed with no effect: the
redelivery is skipped and the credit is lost.
"""
from __future__ import annotations

from ..events import PaymentEvent
from .base import (ABSORBED, APPLIED, BEGIN, COMMIT, RECORD_STEP, Context, Strategy, apply_effect,
                   effect_steps, params, point, sql)
from .eventid_atomic import CLAIM


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        if ctx.execute(CLAIM, params(event)).rowcount == 0:
            ctx.record_delivery(event, ABSORBED)
            return ABSORBED
    ctx.checkpoint("between-key-and-effect")
    with ctx.transaction():
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


STRATEGY = Strategy(
    name="eventid-split",
    title="Event id key, split over two transactions",
    teaches="Key and effect must commit together: a crash between them marks the event done and loses the effect.",
    plan=(point("before-effect"), BEGIN, sql(CLAIM, "rowcount 0: already processed, skip"), COMMIT,
          point("between-key-and-effect", "the key is committed, the effect is not: a crash here loses it"),
          BEGIN, *effect_steps(), RECORD_STEP, COMMIT,
          point("after-effect-before-commit"), point("after-commit")),
    apply=apply,
)
