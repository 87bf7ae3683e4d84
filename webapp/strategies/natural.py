"""``natural``: effects that are sets, not deltas, need no dedup table.

``set_status`` is an absolute UPDATE: running it twice writes the same value. A credit is
recorded as a ledger fact keyed by its event id; the balance is derived from the ledger
(``accounts.balance`` + the ledger's sum), so a replayed credit rewrites nothing.
"""
from __future__ import annotations

from ..events import InvalidEvent, PaymentEvent
from .base import (ABSORBED, APPLIED, BEGIN, COMMIT, RECORD_STEP, SET_STATUS, Context, Strategy, params,
                   point, sql)

RECORD_CREDIT = ("INSERT INTO ledger (event_id, account_id, amount_cents)\n"
                 "VALUES (%(event_id)s, %(account_id)s, %(amount_cents)s)\n"
                 "ON CONFLICT (event_id) DO NOTHING")
ACCOUNT_EXISTS = "SELECT 1 FROM accounts WHERE id = %(account_id)s"


def apply(ctx: Context, event: PaymentEvent) -> str:
    ctx.checkpoint("before-effect")
    with ctx.transaction():
        if event.type == "set_status":
            if ctx.execute(SET_STATUS, params(event)).rowcount != 1:
                raise InvalidEvent(f"no account {event.account_id!r} in this lab")
            outcome = APPLIED
        else:
            if ctx.execute(ACCOUNT_EXISTS, params(event)).fetchone() is None:
                raise InvalidEvent(f"no account {event.account_id!r} in this lab")
            outcome = APPLIED if ctx.execute(RECORD_CREDIT, params(event)).rowcount == 1 else ABSORBED
        ctx.record_delivery(event, outcome)
    return outcome


STRATEGY = Strategy(
    name="natural",
    title="Natural idempotency (set, not delta)",
    teaches="When the effect is a set (status = X, a fact keyed by its id), a replay rewrites the same state.",
    plan=(point("before-effect"), BEGIN,
          sql(SET_STATUS, "set_status: an absolute value, the same however often it runs"),
          sql(ACCOUNT_EXISTS, "credit: the account must exist"),
          sql(RECORD_CREDIT, "credit: a fact keyed by event id; balance = SUM(ledger)"),
          RECORD_STEP, COMMIT, point("after-effect-before-commit"), point("after-commit")),
    apply=apply,
)
