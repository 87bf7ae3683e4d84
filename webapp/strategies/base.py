"""What every strategy shares: the effect SQL, the plan shown on screen, the apply context.

A strategy knows SQL and nothing of Flask or Kafka. Its ``apply`` runs statements through
``ctx.execute`` and stops at named crash points through ``ctx.checkpoint``; its ``plan`` lists
the same statements (the same string objects) with the transaction boundaries, so the SQL a
person reads on screen is the SQL the consumer runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..domain.events import InvalidEvent, PaymentEvent
from ..domain.vocabulary import CRASH_POINTS as POINTS  # noqa: F401  (re-exported: the strategies' name)
from ..domain.vocabulary import Outcome

CREDIT_BALANCE = "UPDATE accounts SET balance = balance + %(amount_cents)s WHERE id = %(account_id)s"
INSERT_PAYMENT = ("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents)\n"
                  "VALUES (%(event_id)s, %(transaction_id)s, %(account_id)s, %(amount_cents)s)")
# The sets, plain: idempotent (a replay writes the same value) but not commutative (an older set
# applied after a newer one wins). Each records the event time it wrote; `natural` reads it (its guard), and
# the verdict compares the status's with its event's (readmodel/regressions.py, CHANGED_SETS).
SET_STATUS = "UPDATE accounts SET status = %(status)s, status_at = %(occurred_at)s WHERE id = %(account_id)s"
SET_BALANCE = ("UPDATE accounts SET balance = %(balance_cents)s, balance_at = %(occurred_at)s "
               "WHERE id = %(account_id)s")
# The seed's upsert by primary key, fed from accounts so an unknown account inserts nothing.
UPSERT_SCORE = ("INSERT INTO scores (account_id, score, score_at)\n"
                "SELECT id, %(score)s::int, %(occurred_at)s::timestamptz FROM accounts WHERE id = %(account_id)s\n"
                "ON CONFLICT (account_id) DO UPDATE SET score = EXCLUDED.score, score_at = EXCLUDED.score_at")
# The lab's database settings for the effects connection: how long a statement waits for a lock
# held by another session (a frozen zombie), and how long a session may sit idle inside an open
# transaction before PostgreSQL terminates it (the zombie's transaction rolled back, its locks
# released, the successor goes on). 0 means no limit. Run when the consumer connects and when the
# lab changes them; shown in the SQL view. Whatever the lab's settings, lock_timeout and
# statement_timeout stay below max.poll.interval.ms (domain/group_health.py): a consumer stuck in a
# statement past it would hold its group's rebalances hostage.
SESSION_SETTINGS = ("SELECT set_config('lock_timeout', %(lock_timeout)s, false),\n"
                    "       set_config('statement_timeout', %(statement_timeout)s, false),\n"
                    "       set_config('idle_in_transaction_session_timeout', %(idle_in_transaction_session_timeout)s, false)")
ACCOUNT_EXISTS = "SELECT 1 FROM accounts WHERE id = %(account_id)s"
RECORD_DELIVERY = (
    'INSERT INTO deliveries (group_id, consumer, partition, "offset", generation, attempt,\n'
    "                        event_id, transaction_id, strategy, outcome, reason)\n"
    "SELECT %(group_id)s::varchar, %(consumer)s, %(partition)s::int, %(offset)s::bigint, %(generation)s,\n"
    "       count(*) + 1, %(event_id)s::uuid, %(transaction_id)s, %(strategy)s, %(outcome)s, %(reason)s\n"
    'FROM deliveries\n'
    'WHERE group_id = %(group_id)s::varchar AND partition = %(partition)s::int AND "offset" = %(offset)s::bigint')

# Delivery outcomes as the ledger stores them (one vocabulary: webapp/domain/vocabulary.py).
APPLIED = Outcome.APPLIED.value
ABSORBED = Outcome.ABSORBED.value
DEAD_LETTERED = Outcome.DEAD_LETTERED.value
# A delivery whose transaction failed with a database error and was rolled back; the consumer
# retries it after a backoff (the partition waits), then dead-letters it. Not an effect.
FAILED = Outcome.FAILED.value

UNIQUE_VIOLATION_REASON = "unique violation: already processed"


@dataclass(frozen=True)
class Step:
    """One line of a strategy's plan: ``begin``, ``commit``, ``sql`` (with text), ``point``, ``note``
    or ``ddl`` (a table definition the strategy relies on, shown, never run by it)."""
    kind: str
    text: str = ""
    note: str = ""


BEGIN = Step("begin", "BEGIN")
COMMIT = Step("commit", "COMMIT")


def sql(text: str, note: str = "") -> Step:
    return Step("sql", text, note)


def point(name: str, note: str = "") -> Step:
    if name not in POINTS:
        raise ValueError(f"unknown crash point {name}")
    return Step("point", name, note)


def note(text: str) -> Step:
    return Step("note", text)


def ddl(text: str, note_text: str = "") -> Step:
    return Step("ddl", text, note_text)


class Context(Protocol):
    """What a strategy may do: run SQL, open a transaction, pass a crash point, log a delivery."""

    def execute(self, statement: str, params: dict[str, Any]) -> Any: ...
    def transaction(self) -> Any: ...
    def checkpoint(self, point: str) -> None: ...
    def record_delivery(self, event: PaymentEvent | None, outcome: str, reason: str | None = None) -> None: ...


@dataclass(frozen=True)
class Strategy:
    name: str
    title: str
    teaches: str
    plan: tuple[Step, ...]
    apply: Callable[[Context, PaymentEvent], str]
    # Batch mode (webapp/strategies/batching.py): one transaction per batch; its plan shows the
    # statements apply_batch runs, the same string objects.
    batch_plan: tuple[Step, ...] = ()
    apply_batch: Callable[[Any, list], None] | None = None

    @property
    def points(self) -> tuple[str, ...]:
        """The crash points this strategy passes; arming another one has no effect."""
        names = [step.text for step in self.plan if step.kind == "point"]
        return tuple(p for p in POINTS if p in names)

    @property
    def batch_points(self) -> tuple[str, ...]:
        """The crash points a batch passes (once per batch)."""
        names = [step.text for step in self.batch_plan if step.kind == "point"]
        return tuple(p for p in POINTS if p in names)

    @property
    def batch_statements(self) -> tuple[str, ...]:
        return tuple(step.text for step in self.batch_plan if step.kind == "sql")

    @property
    def statements(self) -> tuple[str, ...]:
        return tuple(step.text for step in self.plan if step.kind == "sql")


def params(event: PaymentEvent) -> dict[str, Any]:
    return {"event_id": event.event_id, "transaction_id": event.transaction_id, "account_id": event.account_id,
            "amount_cents": event.amount_cents, "status": event.status, "balance_cents": event.balance_cents,
            "score": event.score, "occurred_at": event.occurred_at}


def no_account(event: PaymentEvent) -> InvalidEvent:
    # Raised inside the transaction: it rolls back; the consumer dead-letters the record with this reason.
    return InvalidEvent(f"no account {event.account_id!r} in this lab")


PLAIN_SETS = {"set_status": SET_STATUS, "set_balance": SET_BALANCE, "set_score": UPSERT_SCORE}


def apply_effect(ctx: Context, event: PaymentEvent) -> None:
    """The business effect: a credit is a delta and a new payment row (not idempotent); a set is
    written plainly, whatever its event time (idempotent, not commutative)."""
    if event.type == "credit":
        cursor = ctx.execute(CREDIT_BALANCE, params(event))
        if cursor.rowcount == 1:
            ctx.execute(INSERT_PAYMENT, params(event))
    else:
        cursor = ctx.execute(PLAIN_SETS[event.type], params(event))
    if cursor.rowcount != 1:
        raise no_account(event)


def effect_steps(note_text: str = "") -> tuple[Step, ...]:
    return (sql(CREDIT_BALANCE, note_text or "credit: a delta, not idempotent"),
            sql(INSERT_PAYMENT, "credit: one payment row per applied credit"),
            sql(SET_STATUS, "set_status: a plain set — idempotent, not commutative: an older status "
                            "re-sent after a newer one overwrites it"),
            sql(SET_BALANCE, "set_balance: an absolute value (SET saldo = 500), plain like set_status"),
            sql(UPSERT_SCORE, "set_score: an upsert by primary key, plain: the last one applied wins"))


RECORD_STEP = sql(RECORD_DELIVERY, "lab bookkeeping: the delivery ledger, in the same transaction as the effect")
