"""``insert-first``: the 001 seed's Spring shape — insert the event id, then the effect, one transaction.

``INSERT INTO processed_events (event_id)`` with no ON CONFLICT, first: a duplicate raises
``unique_violation`` (SQLSTATE 23505, Spring's ``DataIntegrityViolationException``). PostgreSQL
then marks the whole transaction aborted: no effect ran and none can run in it. ``apply`` lets
the error propagate, the transaction rolls back, and the consumer catches that error class
specifically: with the group setting ``on_unique_violation = already-processed`` it records the
delivery as absorbed ("unique violation: already processed") in a new transaction and commits
the offset; with ``retry`` it treats it as a generic error (backoff, the partition stalls, DLQ).
"""
from __future__ import annotations

from ..domain.events import PaymentEvent
from .base import (
    APPLIED,
    BEGIN,
    COMMIT,
    RECORD_STEP,
    Context,
    Strategy,
    apply_effect,
    effect_steps,
    note,
    params,
    point,
    sql,
)
from .batching import BatchContext, Item, apply_effects, batch_ends, effect_batch_steps

CLAIM = "INSERT INTO processed_events (event_id, processed_at) VALUES (%(event_id)s, now())"
BATCH_CLAIM = ("INSERT INTO processed_events (event_id, processed_at)\n"
               "SELECT event_id, now() FROM unnest(%(keys)s::uuid[]) AS k(event_id)")


def apply(ctx: Context, event: PaymentEvent) -> str:
    return insert_then_apply(ctx, event, CLAIM)


def insert_then_apply(ctx: Context, event: PaymentEvent, claim: str) -> str:
    """A plain INSERT of the key, then the effect, in one transaction (the partitioned layout runs
    it with its own claim)."""
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        # A duplicate raises psycopg.errors.UniqueViolation here; leaving the block rolls back.
        ctx.execute(claim, params(event))
        ctx.checkpoint("between-key-and-effect")
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


def apply_batch(ctx: BatchContext, items: list[Item]) -> None:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        # One key seen before (or twice in the batch) raises UniqueViolation: the whole batch rolls
        # back and the consumer applies its records one by one, each with its own outcome.
        ctx.execute(BATCH_CLAIM, {"keys": [item.event.event_id for item in items]})
        ctx.checkpoint("between-key-and-effect")
        apply_effects(ctx, items)
        ctx.record_batch(items)


STRATEGY = Strategy(
    name="insert-first",
    title="Insert the event id first, catch the unique violation",
    teaches="The uniqueness constraint is the real guarantee: a duplicate's INSERT fails, its transaction "
            "rolls back with no effect, and the violation means 'already processed', not an error to retry.",
    plan=(point("before-effect"), BEGIN,
          sql(CLAIM, "no ON CONFLICT: a duplicate raises unique_violation (23505) and no effect runs"),
          point("between-key-and-effect", "the key row is locked, uncommitted: a second consumer inserting the "
                                          "same id waits here, then fails once this commits"),
          *effect_steps(), RECORD_STEP, COMMIT,
          point("after-effect-before-commit", "the redelivery's INSERT hits the key: absorbed"),
          point("after-commit"),
          note("On unique_violation PostgreSQL aborts the transaction: any further statement in it fails with "
               "\"current transaction is aborted, commands ignored until end of transaction block\" (25P02), "
               "so code that catches the error and carries on in the same transaction breaks. Here the "
               "consumer rolls back, then records the delivery as absorbed (\"unique violation: already "
               "processed\") in a new transaction and commits the offset. INSERT ... ON CONFLICT DO NOTHING "
               "(eventid-atomic) never raises, and a SAVEPOINT before the INSERT (ROLLBACK TO SAVEPOINT on "
               "the error) keeps the transaction usable."),
          note("Group setting on_unique_violation: already-processed (as above, the seed's way) or retry "
               "(a generic error: retried with backoff while the partition stalls, then the dead-letter topic).")),
    apply=apply,
    batch_plan=(point("before-effect"), BEGIN,
                sql(BATCH_CLAIM, "every key of the batch, no ON CONFLICT: one duplicate raises unique_violation and "
                                 "aborts the whole batch, which is rolled back and applied again one record at a "
                                 "time (the per-message plan), where the duplicate alone is absorbed"),
                point("between-key-and-effect"), *effect_batch_steps(), *batch_ends()),
    apply_batch=apply_batch,
)
