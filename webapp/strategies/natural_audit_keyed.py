"""``natural-audit-keyed``: natural-audit's fix: the audit row keyed on the event.

The audit row's id is the event's ``event_id``, and the insert is ``ON CONFLICT (id) DO NOTHING``:
the first delivery of an event writes its row, a redelivery (or a producer's resend of the same
record, or the outbox relay's) finds it and writes nothing. Keyed by primary key like source text
000's upsert, the second time it meets the same row (and leaves it as it is), so the insert is
idempotent and so is the whole transaction, with no dedup table. What it does not
absorb: a source duplicate, the same payment published again under a new ``event_id``; keyed on
the event, its audit row is a new one (exercise 5's lesson: only a business key absorbs that).

The other fix, for a consumer that already keeps a dedup key table: claim the event's key
(``INSERT INTO processed_events ... ON CONFLICT DO NOTHING``) in the same transaction and write
the set and the audit row only when the claim inserted a row (eventid-atomic).
"""
from __future__ import annotations

from dataclasses import replace

from .base import ACCOUNT_EXISTS, BEGIN, COMMIT, CREDIT_BALANCE, INSERT_PAYMENT, RECORD_STEP, Strategy, note, point, sql
from .batching import looped, looped_plan
from .natural_audit import AUDIT_COLUMNS, auditing, sets_steps

INSERT_AUDIT_ROW_ONCE = (AUDIT_COLUMNS +
                         "VALUES (%(event_id)s, %(event_id)s, %(transaction_id)s, %(account_id)s, %(action)s)\n"
                         "ON CONFLICT (id) DO NOTHING")

apply = auditing(INSERT_AUDIT_ROW_ONCE)

STRATEGY = Strategy(
    name="natural-audit-keyed",
    title="Natural idempotency with an audit row per set, keyed on the event",
    teaches="An audit row whose primary key is the event's id, inserted ON CONFLICT DO NOTHING, is written once "
            "per event: a redelivery rewrites the same account row and adds no audit row.",
    plan=(point("before-effect"), BEGIN,
          sql(CREDIT_BALANCE, "credit: a delta, applied again on a redelivery, as in natural (not audited)"),
          sql(INSERT_PAYMENT, "credit: one payment row per application"),
          *sets_steps("a redelivery rewrites the same row"),
          sql(INSERT_AUDIT_ROW_ONCE, "the line that decides: the audit row's primary key is the event's id, so a "
                                     "redelivery of the event conflicts and inserts nothing: one row per event, "
                                     "however often it is delivered. A source duplicate (a new event_id) still "
                                     "gets a row of its own"),
          sql(ACCOUNT_EXISTS, "a set that changed 0 rows: no such account (dead letter), or a newer value is "
                              "there (absorbed, not audited)"),
          RECORD_STEP, COMMIT, point("after-effect-before-commit"), point("after-commit"),
          note("The audit row and the set commit together or not at all; a crash before the COMMIT leaves "
               "neither, and the redelivery writes both.")),
    apply=apply,
    apply_batch=looped(apply),
)

# Batch mode: the per-message statements in a loop, one transaction per batch (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "each set's audit row is keyed on its event: a redelivered batch conflicts on every one."))
