"""``check-then-act``: look the event id up first, apply if absent, then remember it.

The developer trusted the SELECT: the key table ``seen_events`` has no primary key and no unique
constraint (an index, for speed, guarantees nothing). Under concurrency (a frozen zombie and the
partition's new owner) both SELECTs answer "absent", both apply the effect, and both insert the
key: two rows for one event id and a double credit. With a unique key inserted plainly in the same
transaction, the late one would have hit the constraint and rolled back — that is ``insert-first``:
"the uniqueness constraint as the real guarantee — not an upfront check in application code".
"""
from __future__ import annotations

from dataclasses import replace

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
    ddl,
    effect_steps,
    note,
    params,
    point,
    sql,
)
from .batching import looped, looped_plan

KEY_TABLE = "seen_events"
# What webapp/store/tables.py defines (tests/test_strategies.py checks the live table has no unique index).
KEY_TABLE_DDL = ("CREATE TABLE seen_events (\n"
                 "    event_id     uuid NOT NULL,   -- no PRIMARY KEY, no UNIQUE\n"
                 "    processed_at timestamptz NOT NULL DEFAULT now()\n"
                 ");\n"
                 "CREATE INDEX ix_seen_events_event_id ON seen_events (event_id);  -- fast, not unique")
CHECK = "SELECT 1 FROM seen_events WHERE event_id = %(event_id)s"
REMEMBER = "INSERT INTO seen_events (event_id, processed_at) VALUES (%(event_id)s, now())"


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        return check_and_act(ctx, event)


def check_and_act(ctx: Context, event: PaymentEvent) -> str:
    """The statements inside the transaction (check-then-act-rr runs them after its SET TRANSACTION)."""
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
    title="Check, then act (no unique constraint)",
    teaches="An upfront check in code is not a guarantee: two consumers can both see 'absent' and both apply; "
            "with no unique constraint nothing stops the second.",
    plan=(ddl(KEY_TABLE_DDL, "the key table: the developer trusted the SELECT"),
          point("before-effect"), BEGIN, sql(CHECK, "found: skip as duplicate"),
          point("between-check-and-act", "the race window: another consumer can pass the same check here"),
          *effect_steps(), sql(REMEMBER, "a plain INSERT: with no constraint a second row goes in, nothing fails"),
          RECORD_STEP, COMMIT,
          point("after-effect-before-commit"), point("after-commit"),
          note("READ COMMITTED (PostgreSQL's default): the SELECT sees only committed keys, so a concurrent apply "
               "is invisible to it; and an UPDATE of an account row another transaction changed meanwhile waits for "
               "it, then adds to the row's newest version, with no error. A unique key here would make the late "
               "transaction fail and roll back its effect: see insert-first. The same code under REPEATABLE READ: "
               "see check-then-act-rr.")),
    apply=apply,
    apply_batch=looped(apply),
)

# Batch mode: the per-message statements in a loop, one transaction per batch (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "the lesson is the race between one record's SELECT and its INSERT; a set-based check would hide it."))
