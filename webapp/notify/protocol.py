"""What a caller and the service agree on: the path, the headers, the text of the message.

Pure constants and one formatter, shared by the service (webapp/notify/service.py), the
consumer's call (webapp/consumer/notify.py) and the plan shown on screen
(webapp/strategies/notification.py), so the request a person reads is the request sent.
"""
from __future__ import annotations

PATH = "/notifications"
KEY_HEADER = "Idempotency-Key"
# Set on a response that repeats the first response to its key (the Stripe convention).
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_LENGTH = (1, 255)
TEXT_LENGTH = (1, 500)
DEFAULT_LISTEN = "127.0.0.1:8025"
# Seconds a consumer waits for one answer before it counts the call as failed and tries again.
CALL_TIMEOUT = 5.0


def message_text(amount_cents: int) -> str:
    """The customer's message: "payment received: R$ 100.00"."""
    return f"payment received: R$ {amount_cents / 100:,.2f}"
