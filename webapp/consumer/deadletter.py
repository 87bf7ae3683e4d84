"""The dead-letter path: a record the consumer cannot apply goes to the lab's DLQ topic with its reason.

Never a silent skip: the raw record (its value and key as they were read) is produced to the
dead-letter topic with headers that say why and where it came from, acknowledged by the broker,
and only then is the delivery recorded as ``dead-lettered`` in the ledger; the caller then
commits its offset.
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from ..domain import events
from ..kafka.config import producer_config
from ..strategies.base import DEAD_LETTERED

# How long the dead-letter record may take to be acknowledged, and the producer to flush at the end.
ACKNOWLEDGE_TIMEOUT = 15.0
CLOSE_TIMEOUT = 5.0


def headers(message: Message, reason: str, group_id: str) -> list[tuple[str, bytes]]:
    """The dead-letter record's headers: the reason, the source partition and offset, the group."""
    return [("dlq.reason", reason.encode()), ("dlq.source.partition", str(message.partition()).encode()),
            ("dlq.source.offset", str(message.offset()).encode()), ("dlq.group", group_id.encode())]


class DeadLetters:
    """One consumer process's dead-letter producer, made at its first dead letter. ``process`` is
    the consumer (loop.ConsumerProcess): its lab, group, bootstrap servers and effects context."""

    def __init__(self, process: Any):
        self.process = process
        self.producer: Producer | None = None

    def send(self, message: Message, reason: str, event: events.PaymentEvent | None = None) -> None:
        """Produce the raw record to the DLQ with its reason, then record the delivery."""
        process = self.process
        if self.producer is None:
            self.producer = Producer(producer_config(process.bootstrap_servers, idempotent=True,
                                                     client_id=process.lab.producer_client_id))
        self.producer.produce(process.lab.dlq_topic, value=message.value(), key=message.key(),
                              headers=headers(message, reason, process.group_id))
        if self.producer.flush(ACKNOWLEDGE_TIMEOUT) != 0:
            raise KafkaException(KafkaError(KafkaError._MSG_TIMED_OUT, "dead-letter record not acknowledged"))
        with process.effects.transaction():
            process.effects.record_delivery(event, DEAD_LETTERED, reason)

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(CLOSE_TIMEOUT)
