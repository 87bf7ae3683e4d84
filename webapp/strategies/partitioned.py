"""The event-id strategies on a ``processed_events`` partitioned by day of the event's own time
(webapp/strategies/dedup_layout.py): the same teaching, one more column in the key.

A partitioned table's unique key must hold its partition key, so the key is ``(event_id,
occurred_at)`` and the claim names both. ``occurred_at`` is part of the event, so every copy of it
(a redelivery, a resend, a producer retry) claims the same key in the same partition and is caught.
Partitioning by processing time would break that: a redelivery processed the next day would claim
in another partition, whose key index has never seen the event, and be applied twice.

The consumer reads the layout of its effects schema's table from the catalog with each message
and runs these variants while it is partitioned; the SQL view shows them then.
"""
from __future__ import annotations

from dataclasses import replace

from ..domain.events import PaymentEvent
from . import eventid_atomic, eventid_split, insert_first
from .base import Context, Step, Strategy, ddl, note, sql

CLAIM = ("INSERT INTO processed_events (event_id, occurred_at, processed_at)\n"
         "VALUES (%(event_id)s, %(occurred_at)s, now())\n"
         "ON CONFLICT (event_id, occurred_at) DO NOTHING")
INSERT_FIRST_CLAIM = ("INSERT INTO processed_events (event_id, occurred_at, processed_at)\n"
                      "VALUES (%(event_id)s, %(occurred_at)s, now())")
TABLE = ("CREATE TABLE processed_events (\n"
         "    event_id UUID NOT NULL,\n"
         "    occurred_at TIMESTAMPTZ NOT NULL,\n"
         "    processed_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n"
         "    PRIMARY KEY (event_id, occurred_at)\n"
         ") PARTITION BY RANGE (occurred_at);\n"
         "-- one partition per UTC day, created ahead; the TTL drops whole days:\n"
         "CREATE TABLE processed_events_p20261201 PARTITION OF processed_events\n"
         "    FOR VALUES FROM ('2026-12-01 00:00+00') TO ('2026-12-02 00:00+00');")
WHY_EVENT_TIME = note(
    "Partitioned by the event's own time (occurred_at), not processing time: every redelivery of an event "
    "carries the same occurred_at, so it claims the same key in the same partition and is absorbed. By "
    "processing time, a redelivery after midnight would claim in the next day's partition, whose index has "
    "never seen the event, and apply twice. The TTL drops a whole day's partition (DROP TABLE, a catalog "
    "change) instead of deleting its keys one by one — under an ACCESS EXCLUSIVE lock on the parent, which "
    "waits behind any open transaction on the table and holds up the key inserts queued behind it; and it "
    "counts from the event's time, so consumer lag eats into the window.")


def _swap(plan: tuple[Step, ...], old: str, new: str) -> tuple[Step, ...]:
    """The plan with the claim ``old`` replaced by ``new`` (its note kept), the table and the why first."""
    swapped = tuple(sql(new, step.note) if step.kind == "sql" and step.text == old else step for step in plan)
    return (ddl(TABLE, "processed_events in the partitioned-by-day layout"), *swapped, WHY_EVENT_TIME)


def apply_atomic(ctx: Context, event: PaymentEvent) -> str:
    return eventid_atomic.claim_then_apply(ctx, event, CLAIM)


def apply_split(ctx: Context, event: PaymentEvent) -> str:
    return eventid_split.claim_then_apply(ctx, event, CLAIM)


def apply_insert_first(ctx: Context, event: PaymentEvent) -> str:
    return insert_first.insert_then_apply(ctx, event, INSERT_FIRST_CLAIM)


def _variant(strategy: Strategy, old_claim: str, new_claim: str, apply) -> Strategy:
    plan = _swap(strategy.plan, old_claim, new_claim)
    fields = {"plan": plan, "apply": apply}
    if getattr(strategy, "apply_batch", None) is not None:
        # Batch mode in this layout: the per-message claim in a loop, one transaction per batch.
        from .batching import looped, looped_plan
        fields.update(batch_plan=looped_plan(plan, "in the partitioned layout each record claims (event_id, occurred_at) on its own."),
                      apply_batch=looped(apply))
    return replace(strategy, **fields)


STRATEGIES: dict[str, Strategy] = {
    "eventid-atomic": _variant(eventid_atomic.STRATEGY, eventid_atomic.CLAIM, CLAIM, apply_atomic),
    "eventid-split": _variant(eventid_split.STRATEGY, eventid_atomic.CLAIM, CLAIM, apply_split),
    "insert-first": _variant(insert_first.STRATEGY, insert_first.CLAIM, INSERT_FIRST_CLAIM, apply_insert_first),
}
