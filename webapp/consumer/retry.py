"""The consumer's retries: a failing record's partition waits, then the record comes again.

A record whose transaction failed is attempted again after a backoff: its partition is paused
and sought back to it (the partition stalls, its lag grows; other partitions flow), and resumed
when the backoff is over. A counted retry (a database error the record may be at fault for) is
dead-lettered after MAX_ATTEMPTS attempts; a transient one (a lost session, a transaction rolled
back by a concurrent one) is retried as long as it takes. A revoked partition's attempts are
forgotten: its next owner counts from one.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import KafkaException, Message, TopicPartition

from ..domain import events
from ..strategies.base import DEAD_LETTERED, FAILED

log = logging.getLogger("idempotency_lab.consumer")

# A failing record is attempted this many times in all, then dead-lettered; between attempts its
# partition waits BACKOFF_SECONDS[attempt - 1] (the last value for every later transient retry).
MAX_ATTEMPTS = 3
BACKOFF_SECONDS = (1.0, 2.0, 4.0, 5.0)


@dataclass
class Retry:
    """A record of one partition that failed: how often, and when its partition resumes."""
    offset: int
    attempts: int = 0
    resume_at: float = 0.0
    paused: bool = False


def describe(error: psycopg.Error, max_poll_interval_ms: int) -> str:
    """The error's class and first line; a timeout the consumer sets says why it is there."""
    first_line = str(error).strip().splitlines()[0] if str(error).strip() else repr(error)
    what = f"{type(error).__name__}: {first_line}"
    if isinstance(error, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
        # The bound set by EffectsContext.apply_session_settings.
        what += (f" (the consumer gives a statement up before max.poll.interval.ms, "
                 f"{max_poll_interval_ms // 1000} s, so it stays in its group)")
    return what


class Retries:
    """One consumer process's retried records, one per partition. ``process`` is the consumer
    (loop.ConsumerProcess): its Kafka consumer, effects context, reporter and dead letters."""

    def __init__(self, process: Any):
        self.process = process
        self.by_partition: dict[tuple[str, int], Retry] = {}

    def later(self, message: Message, event: events.PaymentEvent | None, error: psycopg.Error,
              limit: int | None, record: bool = False) -> str | None:
        """Count an attempt; under the limit, pause the partition for a backoff and seek back to the
        record (the partition stalls, its lag grows), and return None; at the limit, dead-letter it
        and return DEAD_LETTERED. A counted attempt (``limit``) or a ``record``-ed one is written to
        the ledger as a failed delivery."""
        process = self.process
        key = (message.topic(), message.partition())
        retry = self.by_partition.get(key)
        if retry is None or retry.offset != message.offset():
            retry = self.by_partition[key] = Retry(message.offset())
        retry.attempts += 1
        what = describe(error, process.group.max_poll_interval_ms)
        if limit is not None and retry.attempts >= limit:
            del self.by_partition[key]
            process.dead_letters.send(message, f"gave up after {retry.attempts} attempts: {what}", event)
            return DEAD_LETTERED
        delay = BACKOFF_SECONDS[min(retry.attempts, len(BACKOFF_SECONDS)) - 1]
        of = f" of {limit}" if limit is not None else ""
        reason = f"attempt {retry.attempts}{of} failed: {what}; partition {message.partition()} waits {delay:g} s"
        process.report.last_error = reason
        if limit is not None or record:
            try:
                with process.effects.transaction():
                    process.effects.record_delivery(event, FAILED, reason)
            except psycopg.Error:
                log.warning("could not record the failed delivery: %s", reason)
        process.reporter.say("error", f"{process.name}: {reason}", partition=message.partition(),
                             offset=message.offset())
        retry.resume_at = time.monotonic() + delay
        try:
            process.consumer.pause([TopicPartition(message.topic(), message.partition())])
            retry.paused = True
            process.consumer.seek(TopicPartition(message.topic(), message.partition(), message.offset()))
        except KafkaException:
            pass  # the partition moved to another member, which will deliver it again
        process.current = None
        return None

    def resume_due(self) -> None:
        """Resume every partition whose backoff is over."""
        now = time.monotonic()
        for (topic, partition), retry in self.by_partition.items():
            if retry.paused and retry.resume_at <= now:
                retry.paused = False
                try:
                    self.process.consumer.resume([TopicPartition(topic, partition)])
                except KafkaException:
                    pass

    def done(self, topic: str, partition: int) -> None:
        """The partition's record is settled (applied, absorbed or dead-lettered): no retry left."""
        self.by_partition.pop((topic, partition), None)

    def waiting(self, topic: str, partition: int) -> bool:
        """Whether the partition is paused for a retry's backoff."""
        retry = self.by_partition.get((topic, partition))
        return retry is not None and retry.paused

    def waiting_partitions(self) -> set[tuple[str, int]]:
        return {key for key, retry in self.by_partition.items() if retry.paused}

    def forget(self, partitions: list[TopicPartition]) -> None:
        """A revoked partition is resumed (its next owner, maybe us again, starts it unpaused) and its
        attempts are forgotten: the next owner counts from one."""
        for tp in partitions:
            retry = self.by_partition.pop((tp.topic, tp.partition), None)
            if retry is not None and retry.paused:
                try:
                    self.process.consumer.resume([TopicPartition(tp.topic, tp.partition)])
                except KafkaException:
                    pass
