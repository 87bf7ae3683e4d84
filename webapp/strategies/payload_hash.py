"""``payload-hash``: as eventid-atomic, keyed on a hash of the event's content instead of an id.

The 000 seed lists "hash do payload" beside messageId and eventId as an idempotency key. The key
here is what a consumer builds when it does not trust the ids it receives: the content of the
event without ``event_id`` (new on every publish, so a hash over it would catch nothing a
redelivery does not already share) and without ``transaction_id`` (with it the hash would be the
business key in disguise). What is left is the content, with the event time cut to the minute:

    <type>|<account_id>|<amount_cents, or the set's status / balance_cents / score>|<YYYY-MM-DDTHH:MIZ>

"The same minute" is the window in which two events with equal content count as one: a
redelivery and a source duplicate (which carry the event's own time) fall in it, so they are
absorbed; a source channel that re-stamps its copy a few seconds later still falls in it (unless
a minute boundary lies between them). So do two real, identical payments — same account, same
amount, same minute, two transaction ids — and the second one is absorbed: a real credit lost.
The same content is not the same fact.

The canonical form and its sha256 are computed by PostgreSQL (``KEY``), in the transaction,
from the event's fields; the result is the key claimed (``CLAIM``) and, for a skipped event, the
reason recorded in the delivery ledger.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

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

KEY_TABLE_DDL = ("CREATE TABLE processed_payloads (\n"
                 "    payload_hash text PRIMARY KEY,   -- sha256 (hex) of the canonical content\n"
                 "    processed_at timestamptz NOT NULL DEFAULT now()\n"
                 ");")
# One of the four values is set, by the event's type (the others are NULL): coalesce picks it.
KEY = ("SELECT canonical, encode(sha256(convert_to(canonical, 'UTF8')), 'hex') AS payload_hash\n"
       "FROM (SELECT concat_ws('|', %(type)s::text, %(account_id)s::text,\n"
       "                       coalesce(%(amount_cents)s::bigint::text, %(status)s::text,\n"
       "                                %(balance_cents)s::bigint::text, %(score)s::int::text),\n"
       "                       to_char(date_trunc('minute', %(occurred_at)s::timestamptz AT TIME ZONE 'UTC'),\n"
       "                               'YYYY-MM-DD\"T\"HH24:MI\"Z\"')) AS canonical) content")
CLAIM = ("INSERT INTO processed_payloads (payload_hash, processed_at) VALUES (%(payload_hash)s, now())\n"
         "ON CONFLICT (payload_hash) DO NOTHING")


def key_params(event: PaymentEvent) -> dict[str, Any]:
    return {**params(event), "type": event.type}


def absorbed_reason(canonical: str, payload_hash: str) -> str:
    return (f"payload hash {payload_hash[:12]}… already processed: the same content ({canonical}) — a redelivery, "
            "a source duplicate, or another real payment that looks the same")


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        canonical, payload_hash = ctx.execute(KEY, key_params(event)).fetchone()
        if ctx.execute(CLAIM, {"payload_hash": payload_hash}).rowcount == 0:
            ctx.record_delivery(event, ABSORBED, absorbed_reason(canonical, payload_hash))
            return ABSORBED
        ctx.checkpoint("between-key-and-effect")
        apply_effect(ctx, event)
        ctx.record_delivery(event, APPLIED)
    return APPLIED


STRATEGY = Strategy(
    name="payload-hash",
    title="Payload hash (content without ids, to the minute), one transaction",
    teaches="A hash of the content catches a source duplicate with a new event id, but the same content is not the "
            "same fact: two real, identical payments in the same minute are merged and one is lost.",
    plan=(ddl(KEY_TABLE_DDL, "the key table: one row per distinct content"),
          point("before-effect"), BEGIN,
          sql(KEY, "the key, computed here from the event's fields: type|account|amount (or the set's value)|"
                   "the event time cut to the minute (UTC) — no event_id, no transaction_id — hashed with sha256"),
          sql(CLAIM, "rowcount 0: the same content was already processed — a redelivery, a source duplicate, or "
                     "another real payment that looks the same: skip, recorded with the canonical content"),
          point("between-key-and-effect", "inside the transaction: a crash here rolls the key back too"),
          *effect_steps(), RECORD_STEP, COMMIT,
          point("after-effect-before-commit", "redelivery finds the key and skips"), point("after-commit"),
          note("What each key identifies (001 seed): event_id, one publish — it misses a source duplicate; "
               "transaction_id, one business fact (the PIX's endToEndId) — it catches a source duplicate and keeps "
               "two real payments apart; the payload hash, the same content — it catches a source duplicate too, "
               "but two real payments of the same amount to the same account in the same minute are one key: "
               "the second is skipped and its credit lost. Cutting the time coarser merges more; keeping it to the "
               "millisecond lets a re-stamped source duplicate through.")),
    apply=apply,
    apply_batch=looped(apply),
)

# Batch mode: the per-message statements in a loop, one transaction per batch (batching.looped).
STRATEGY = replace(STRATEGY, batch_plan=looped_plan(
    STRATEGY.plan, "the key is computed from each record's content by its own statement."))
