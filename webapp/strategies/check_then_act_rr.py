"""``check-then-act-rr``: check-then-act's statements, unchanged, in a REPEATABLE READ transaction.

Still no unique constraint on ``seen_events``, still an upfront SELECT. What changes is the effect's
UPDATE: under REPEATABLE READ every statement reads the snapshot taken at the transaction's first
query, and PostgreSQL refuses to update a row that a transaction committed after that snapshot
changed (SQLSTATE 40001, "could not serialize access due to concurrent update"). So when a second
consumer passes the same check while the first is applying, one of the two fails on the account's
row and rolls back, and the consumer runs that delivery again in a new transaction, whose check now
finds the key. The guarantee is that serialization failure and the retry that follows it, not the
check: REPEATABLE READ sees a conflict only on a row both transactions write (here the account's);
an effect that only inserts rows would commit twice (write skew), which SERIALIZABLE or a unique
key would catch.
"""
from __future__ import annotations

from dataclasses import replace

from ..domain.events import PaymentEvent
from .base import BEGIN, COMMIT, RECORD_STEP, Context, Strategy, ddl, effect_steps, note, point, sql
from .batching import looped, looped_plan
from .check_then_act import CHECK, KEY_TABLE_DDL, REMEMBER, check_and_act

# Transaction control, not a query: the snapshot is taken by the first query after it (the check).
REPEATABLE_READ = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        ctx.execute(REPEATABLE_READ, {})
        return check_and_act(ctx, event)


ISOLATION_STEP = sql(REPEATABLE_READ, "before any query: the snapshot is taken at the first query (the SELECT "
                                      "below) and every statement of the transaction reads as of it")

STRATEGY = Strategy(
    name="check-then-act-rr",
    title="Check, then act, under REPEATABLE READ",
    teaches="A stricter isolation level does not make the check a guarantee: two consumers still both see "
            "'absent'. What stops the second credit is PostgreSQL refusing its update of a row changed since its "
            "snapshot (40001), and the consumer retrying the delivery.",
    plan=(ddl(KEY_TABLE_DDL, "the same key table as check-then-act: no unique constraint"),
          point("before-effect"), BEGIN, ISOLATION_STEP,
          sql(CHECK, "found: skip as duplicate. Not found in this snapshot: another consumer may still be "
                     "applying it"),
          point("between-check-and-act", "the race window is still open: another consumer can pass the same "
                                         "check here"),
          *effect_steps("the line that decides: if a transaction that committed after this snapshot changed the "
                        "account's row, PostgreSQL refuses this UPDATE with 40001 (could not serialize access due "
                        "to concurrent update) and the transaction rolls back, no credit; if that transaction is "
                        "still open, this UPDATE waits for it first"),
          sql(REMEMBER, "a plain INSERT, as in check-then-act: nothing here refuses a second row"),
          RECORD_STEP, COMMIT,
          point("after-effect-before-commit"), point("after-commit"),
          note("The consumer treats 40001 as transient, never as 'already processed' and never as a bad record: "
               "the delivery is recorded as failed, the partition waits, and the record is processed again in a "
               "new transaction with a new snapshot, whose SELECT finds the key: absorbed."),
          note("REPEATABLE READ in PostgreSQL detects a write to a row changed since the snapshot, nothing else. "
               "Both consumers update the account's row, so one fails. An effect that only inserted rows (a "
               "ledger line per credit) would commit twice with no error (write skew); SERIALIZABLE fails one of "
               "the two through its predicate locks, and a unique key on the event id (insert-first, "
               "eventid-atomic) fails it at any isolation level.")),
    apply=apply,
    apply_batch=looped(check_and_act, opening=REPEATABLE_READ),
)

# Batch mode: the isolation level once, first in the batch's transaction, then the per-message
# statements in a loop (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "the lesson is the race between one record's SELECT and its UPDATE; a set-based check would hide "
                   "it.", opening=ISOLATION_STEP))
