"""How a retried record's error is told (webapp/consumer/retry.py); the retries themselves, with a
real consumer, broker and database, are tests/test_consumer.py's."""
from __future__ import annotations

import psycopg

from webapp.consumer.retry import describe


def test_a_timeout_the_consumer_set_says_why_it_is_there():
    told = describe(psycopg.errors.LockNotAvailable("canceling statement due to lock timeout\nCONTEXT: x"), 300_000)
    assert told == ("LockNotAvailable: canceling statement due to lock timeout (the consumer gives a statement up "
                    "before max.poll.interval.ms, 300 s, so it stays in its group)")


def test_any_other_error_is_its_class_and_first_line():
    assert describe(psycopg.errors.CheckViolation("new row violates check constraint\nDETAIL: y"), 300_000) == (
        "CheckViolation: new row violates check constraint")
    assert describe(psycopg.OperationalError(), 300_000) == "OperationalError: OperationalError()"

