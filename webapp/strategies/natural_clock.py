"""``natural-clock``: natural's statements, but the status's time comes from the clock, not the event.

Source text 000 gives ``UPDATE orders SET status = 'PAID', paid_at = ? WHERE id = ?`` as naturally
idempotent: re-running it rewrites the same row. That holds because ``?`` is the event's time. Write
``paid_at = now()`` instead and each run writes the time it ran: the status is the same, the row is
not, so a redelivery changes state, which is what idempotent means it must not do. Here the status's
time is ``status_at``; this strategy writes ``now()`` there, where ``natural`` (and every other
strategy) writes the event's ``occurred_at``.

It cannot keep natural's event-time guard either: ``now()`` is always newer than any event's time,
so ``status_at <= occurred_at`` would refuse every later status. An older status re-sent after a
newer one overwrites it, as a plain set does.
"""
from __future__ import annotations

from dataclasses import replace

from .base import ACCOUNT_EXISTS, BEGIN, COMMIT, CREDIT_BALANCE, INSERT_PAYMENT, RECORD_STEP, Strategy, note, point, sql
from .batching import looped, looped_plan
from .natural import GUARDED_SET_BALANCE, GUARDED_SETS, GUARDED_UPSERT_SCORE, applying

CLOCK_SET_STATUS = "UPDATE accounts SET status = %(status)s, status_at = now()\nWHERE id = %(account_id)s"

apply = applying({**GUARDED_SETS, "set_status": CLOCK_SET_STATUS})

STRATEGY = Strategy(
    name="natural-clock",
    title="Natural idempotency, the status's time from the clock (paid_at = now())",
    teaches="A set is idempotent only if every value it writes comes from the event: with status_at = now(), "
            "each delivery writes the time it ran, so a redelivery changes the row though the status is the same.",
    plan=(point("before-effect"), BEGIN,
          sql(CREDIT_BALANCE, "credit: a delta, applied again on a redelivery, as in natural"),
          sql(INSERT_PAYMENT, "credit: one payment row per application — like an audit row, each execution "
                              "creates a new one"),
          sql(CLOCK_SET_STATUS, "the line that decides: now() is when this delivery runs, not when the event "
                                "happened — a redelivery writes the same status with a new status_at, so the row "
                                "changes: not idempotent. The event's occurred_at, as natural writes, would rewrite "
                                "the same row. No event-time guard is possible: now() is newer than every event"),
          sql(GUARDED_SET_BALANCE, "set_balance: as natural, the event's time"),
          sql(GUARDED_UPSERT_SCORE, "set_score: as natural, the event's time"),
          sql(ACCOUNT_EXISTS, "a set that changed 0 rows: no such account (dead letter), or a newer balance or "
                              "score is there (absorbed)"),
          RECORD_STEP, COMMIT, point("after-effect-before-commit"), point("after-commit"),
          note("The verdict compares each account's status_at with the occurred_at of the status event that set "
               "it: a status set again by a redelivery with another time is counted as a set the redelivery "
               "changed.")),
    apply=apply,
    apply_batch=looped(apply),
)

# Batch mode: the per-message statements in a loop, one transaction per batch (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "now() is the batch transaction's start time: every status of the batch gets that same time."))
