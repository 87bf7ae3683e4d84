"""``eventid-atomic``: claim the event id with a unique key, in the effect's own transaction.

``INSERT ... ON CONFLICT DO NOTHING`` affecting 0 rows means the event was processed: skip.
Key and effect commit together or not at all; a concurrent claim of the same key waits on
the first transaction and then sees the conflict. The correct pattern.
"""
from __future__ import annotations

import uuid
from typing import Callable

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
from .batching import BatchContext, Item, apply_effects, batch_ends, effect_batch_steps, first_claims

CLAIM = ("INSERT INTO processed_events (event_id, processed_at) VALUES (%(event_id)s, now())\n"
         "ON CONFLICT (event_id) DO NOTHING")
# Batch mode: the keys of the whole batch in one statement; RETURNING names the ones this batch claimed.
BATCH_CLAIM = ("INSERT INTO processed_events (event_id, processed_at)\n"
               "SELECT DISTINCT event_id, now() FROM unnest(%(keys)s::uuid[]) AS k(event_id)\n"
               "ON CONFLICT (event_id) DO NOTHING\n"
               "RETURNING event_id")


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


def event_key(item: Item) -> str:
    return str(uuid.UUID(item.event.event_id))  # as PostgreSQL returns a uuid: lowercase, hyphenated


def claim_batch_then_apply(ctx: BatchContext, items: list[Item], claim: str, key: Callable[[Item], str]) -> None:
    """Batch mode of eventid-atomic and business-key: claim every key of the batch at once, apply
    the effects of the records it claimed, in one transaction."""
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        claimed = {str(row[0]) for row in ctx.execute(claim, {"keys": [key(i) for i in items]}).fetchall()}
        fresh = first_claims(items, claimed, key)
        ctx.checkpoint("between-key-and-effect")
        apply_effects(ctx, fresh)
        ctx.record_batch(items)


def claim_batch_plan(claim: str, key_note: str):
    return (point("before-effect"), BEGIN, sql(claim, key_note),
            point("between-key-and-effect", "inside the transaction: a crash here rolls the batch's keys back too"),
            *effect_batch_steps(), *batch_ends())


def apply(ctx: Context, event: PaymentEvent) -> str:
    return claim_then_apply(ctx, event, CLAIM)


def apply_batch(ctx: BatchContext, items: list[Item]) -> None:
    claim_batch_then_apply(ctx, items, BATCH_CLAIM, event_key)


STRATEGY = Strategy(
    name="eventid-atomic",
    title="Event id + unique key, one transaction",
    teaches="The uniqueness constraint, in the same transaction as the effect, absorbs every redelivery.",
    plan=claim_plan(CLAIM, "rowcount 0: already processed, skip"),
    apply=apply,
    batch_plan=claim_batch_plan(BATCH_CLAIM, "the keys RETURNING came back: applied; the others (and a key's second "
                                             "record in the same batch) were processed: absorbed"),
    apply_batch=apply_batch,
)
