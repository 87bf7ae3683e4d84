"""The notification step in a strategy's plan: where a group's consumer calls the notification
service (webapp/notify) for an applied credit, with or without ``Idempotency-Key: <event_id>``.

Not a strategy: a group setting (``notify``: off, before-commit, after-commit) that adds the call
and two crash points around it to whatever strategy the group uses. The request shown is built
from the same constants the consumer sends (webapp/notify/protocol.py).

- before-commit: inside the effect's transaction, after the effect and the ledger row. A crash
  after the call rolls the credit (and its key) back, but the customer has the message: the
  redelivery applies the credit once and sends the message again. The database cannot take back
  what another system was told; only that system can recognise the repeat (the key).
- after-commit: after the transaction committed, before the offset commit. A crash before the
  call loses the message (the redelivery finds the credit done and skips it, and its message);
  a crash after it, before the offset commit, sends it again only where the credit is applied again.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..domain.vocabulary import NOTIFY_MODES
from ..notify.protocol import KEY_HEADER, PATH
from .base import COMMIT, RECORD_STEP, Step, Strategy, note, point

OFF, BEFORE_COMMIT, AFTER_COMMIT = NOTIFY_MODES
REQUEST_LINE = f"POST $LAB_NOTIFY_URL{PATH}"
KEY_LINE = f"{KEY_HEADER}: <event_id>"
BODY = ('{"lab": "<lab>", "account_id": "<account_id>", "event_id": "<event_id>",\n'
        ' "amount_cents": <amount_cents>, "text": "payment received: R$ <amount>"}')


@dataclass(frozen=True)
class NotifySettings:
    """A group's notification setting."""
    mode: str = OFF
    idempotency_key: bool = False

    @property
    def on(self) -> bool:
        return self.mode != OFF


def request_text(idempotency_key: bool) -> str:
    """The HTTP request as the plan shows it (placeholders in angle brackets)."""
    headers = ["Content-Type: application/json"] + ([KEY_LINE] if idempotency_key else [])
    return "\n".join([REQUEST_LINE, *headers, "", BODY])


def call(settings: NotifySettings) -> Step:
    key_note = (f"{KEY_HEADER}: the event id. A repeat with the same key gets the first response back "
                "(Idempotent-Replayed: true) and the customer gets nothing new"
                if settings.idempotency_key else
                f"no {KEY_HEADER}: the service cannot tell a repeat from a new payment, and delivers every call")
    return Step("http", request_text(settings.idempotency_key), f"credits only; {key_note}")


def steps(settings: NotifySettings) -> tuple[Step, ...]:
    """The crash point before the call, the call, the crash point after it."""
    if settings.mode == BEFORE_COMMIT:
        after = ("inside the transaction: a crash here rolls back the credit and its key, not the message. "
                 + ("The redelivery applies the credit once and sends the same key: the service replays, "
                    "one notification." if settings.idempotency_key else
                    "The redelivery applies the credit once and calls again: two notifications."))
        return (point("before-notify", "the effect is written, not committed; nobody was told yet"),
                call(settings), point("after-notify-before-commit", after))
    return (point("before-notify", "the credit is committed; a crash here loses the message when the redelivery "
                                   "is absorbed (at most once)"),
            call(settings),
            point("after-notify-before-commit", "the offset is not committed: the message goes again only if the "
                                                "redelivery applies the credit again"))


def with_notification(plan: tuple[Step, ...], settings: NotifySettings) -> tuple[Step, ...]:
    """``plan`` with the call at its position: before the commit of the effect's transaction (after
    the ledger row), or after that commit, before the offset commit."""
    if not settings.on:
        return plan
    added = steps(settings)
    if settings.mode == BEFORE_COMMIT:
        at = _index_after(plan, RECORD_STEP) or _last_commit(plan)
    else:
        at = next((i for i, step in enumerate(plan) if step == point("after-effect-before-commit")), len(plan))
    return plan[:at] + added + plan[at:] + (note("Only an applied credit notifies: an absorbed delivery, a set "
                                                 "and a dead letter tell the customer nothing."),)


def _index_after(plan: tuple[Step, ...], wanted: Step) -> int | None:
    found = [i for i, step in enumerate(plan) if step == wanted]
    return found[-1] + 1 if found else None


def _last_commit(plan: tuple[Step, ...]) -> int:
    commits = [i for i, step in enumerate(plan) if step == COMMIT]
    return commits[-1] if commits else len(plan)


def strategy_with(strategy: Strategy, settings: NotifySettings) -> Strategy:
    """The strategy as a group with this setting runs it: its plan and its crash points."""
    return strategy if not settings.on else replace(strategy, plan=with_notification(strategy.plan, settings))
