"""The consumer's call to the notification service (the external side effect).

The group's setting (``consumer_groups.notify``, ``notify_idempotency_key``) is read with the
group's other per-message settings. For an applied credit the consumer calls the service at the
position the plan shows (webapp/strategies/notification.py): ``before-commit`` from inside the
effect's transaction (the consumer's ``record_delivery`` of an applied delivery, the last statement
before the commit), ``after-commit`` after the transaction committed, before the offset commit.
Around the call, the crash points ``before-notify`` and ``after-notify-before-commit``.

Every call the service answered is written to ``notifications_sent`` on the consumer's control
connection (autocommit, outside the effect's transaction): a rolled-back credit keeps its call, as
the customer keeps the message. A service that does not answer (or answers 5xx) is retried in
place with a growing backoff, as long as it takes, the partition stalled and the consumer's card
saying why; a 4xx answer (a request the service refuses) is recorded with its status, not retried.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from ..domain import events
from ..notify.protocol import CALL_TIMEOUT, KEY_HEADER, PATH, REPLAYED_HEADER, message_text
from ..store import schema
from ..strategies.base import APPLIED
from ..strategies.notification import AFTER_COMMIT, BEFORE_COMMIT, NotifySettings

URL_VARIABLE = "LAB_NOTIFY_URL"
BACKOFF_SECONDS = (0.2, 0.5, 1.0, 2.0, 5.0)
RECORD_SENT = ("INSERT INTO notifications_sent (group_id, consumer, generation, event_id, account_id, mode,\n"
               "                                idempotency_key, status, replayed)\n"
               "VALUES (%(group_id)s, %(consumer)s, %(generation)s, %(event_id)s, %(account_id)s, %(mode)s,\n"
               "        %(idempotency_key)s, %(status)s, %(replayed)s)")


class NotificationStopped(Exception):
    """The consumer was asked to stop while the notification service did not answer."""


class Unanswered(Exception):
    """No answer to use: connection refused, timeout, a 5xx, or no service configured."""


def post(url: str, body: dict[str, Any], key: str | None, timeout: float = CALL_TIMEOUT) -> tuple[int, bool]:
    """One ``POST /notifications``: (status, replayed). Raises Unanswered when there is no answer
    to act on (the caller tries again)."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers[KEY_HEADER] = key
    request = urllib.request.Request(url.rstrip("/") + PATH, data=json.dumps(body).encode(), headers=headers,
                                     method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.headers.get(REPLAYED_HEADER) == "true"
    except urllib.error.HTTPError as error:
        with error:
            if error.code >= 500:
                raise Unanswered(f"the notification service answered {error.code}") from None
            return error.code, False
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise Unanswered(f"the notification service at {url} does not answer: {reason}") from None


class Notifier:
    """One consumer's notifications. ``process`` is the consumer (loop.ConsumerProcess): its crash
    points (``effects``), reporter, control connection, names and report."""

    def __init__(self, process: Any, url: str | None = None):
        self.process = process
        # The agent puts the setting in the consumer's environment, resolved by the settings model:
        # read as it is, since loading the model (pydantic) would be paid again at every consumer start.
        self.url = url if url is not None else os.environ.get(URL_VARIABLE) or None
        self.settings = NotifySettings()

    def use(self, mode: str, idempotency_key: bool) -> NotifySettings:
        """The group's setting, as the consumer read it with its other per-message settings (consumer/settings.py)."""
        self.settings = NotifySettings(mode, bool(idempotency_key))
        return self.settings

    def before_commit(self, event: events.PaymentEvent | None, outcome: str) -> None:
        """From inside the effect's transaction, as its last statement before the commit."""
        if self.settings.mode == BEFORE_COMMIT and self._notifies(event, outcome):
            self._notify(event)

    def after_commit(self, event: events.PaymentEvent | None, outcome: str) -> None:
        """After the effect's transaction committed, before the offset commit."""
        if self.settings.mode == AFTER_COMMIT and self._notifies(event, outcome):
            try:
                self._notify(event)
            except NotificationStopped as stopped:
                # The credit is committed: its offset is committed too, and the message is lost. Said so.
                self.process.reporter.say("error", f"{self.process.name} stopped before the notification service "
                                          f"answered: the message for {event.event_id} was not sent ({stopped})",
                                          event_id=event.event_id)

    @staticmethod
    def _notifies(event: events.PaymentEvent | None, outcome: str) -> bool:
        return event is not None and outcome == APPLIED and event.type == "credit"

    def _notify(self, event: events.PaymentEvent) -> None:
        process = self.process
        process.effects.checkpoint("before-notify")
        key = event.event_id if self.settings.idempotency_key else None
        body = {"lab": process.lab.name, "account_id": event.account_id, "event_id": event.event_id,
                "amount_cents": event.amount_cents, "text": message_text(event.amount_cents)}
        status, replayed = self._until_answered(body, key)
        self._record_sent(event, key, status, replayed)
        process.effects.checkpoint("after-notify-before-commit")

    def _until_answered(self, body: dict[str, Any], key: str | None) -> tuple[int, bool]:
        """Call until the service answers; a backoff between attempts, the consumer's card says why."""
        process = self.process
        attempt = 0
        while True:
            try:
                if self.url is None:
                    raise Unanswered(f"no notification service: {URL_VARIABLE} is not set for this consumer")
                return post(self.url, body, key)
            except Unanswered as error:
                attempt += 1
                delay = BACKOFF_SECONDS[min(attempt, len(BACKOFF_SECONDS)) - 1]
                process.report.last_error = f"{error}; attempt {attempt}, again in {delay:g} s"
                if attempt == 1:
                    process.reporter.say("error", f"{process.name}: {error}; retrying until it answers",
                                         event_id=body["event_id"])
                process.reporter.heartbeat(force=True)
                if process.stopping:
                    raise NotificationStopped(str(error)) from None
                process.keep_alive(delay)  # polls meanwhile: the consumer stays in its group

    def _record_sent(self, event: events.PaymentEvent, key: str | None, status: int, replayed: bool) -> None:
        process = self.process
        with process.control_conn.transaction():
            schema.enter_psycopg(process.control_conn, process.lab.schema)
            process.control_conn.execute(RECORD_SENT, {
                "group_id": process.group_id, "consumer": process.name, "generation": process.report.generation,
                "event_id": event.event_id, "account_id": event.account_id, "mode": self.settings.mode,
                "idempotency_key": key, "status": status, "replayed": replayed})
