"""``check-then-act``: look the event id up first, apply if absent, then remember it.

The check is an upfront SELECT in application code. Under concurrency (a frozen zombie and
the partition's new owner) both see "absent" and both apply: the key insert at the end
cannot undo an effect that already happened, so it quietly does nothing.
"""
from __future__ import annotations

from ..events import PaymentEvent
from .base import (ABSORBED, APPLIED, BEGIN, COMMIT, RECORD_STEP, Context, Strategy, apply_effect,
                   effect_steps, note, params, point, sql)

CHECK = "SELECT 1 FROM processed_events WHERE event_id = %(event_id)s"
REMEMBER = ("INSERT INTO processed_events (event_id, processed_at) VALUES (%(event_id)s, now())\n"
            "ON CONFLICT (event_id) DO NOTHING")


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        seen = ctx.execute(CHECK, params(event)).fetchone() is not None
        if seen:
            ctx.record_delivery(event, ABSORBED)
            return ABSORBED
        ctx.checkpoint("between-check-and-act")
        apply_effect(ctx, event)
        ctx.execute(REMEMBER, params(event))
        ctx.record_delivery(event, APPLIED)
    return APPLIED


STRATEGY = Strategy(
    name="check-then-act",
    title="Check, then act",
    teaches="An upfront check in code is not a guarantee: two consumers can both see 'absent' and both apply.",
    plan=(point("before-effect"), BEGIN, sql(CHECK, "found: skip as duplicate"),
          point("between-check-and-act", "the race window: another consumer can pass the same check here"),
          *effect_steps(), sql(REMEMBER, "too late to stop a second effect"), RECORD_STEP, COMMIT,
          point("after-effect-before-commit"), point("after-commit"),
          note("READ COMMITTED: the SELECT sees only committed keys, so a concurrent apply is invisible to it")),
    apply=apply,
)
