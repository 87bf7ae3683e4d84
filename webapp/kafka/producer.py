"""Publishing payment events, with every record journaled from its delivery report.

Lives in the lab agent (never in a web process). Modes:
- ``normal``: one new event; ``burst``: N new events;
- ``resend``: the same event again, same event id (an application-level retry: no producer
  setting prevents it);
- ``source-duplicate``: the same transaction id under a new event id (the business fact
  arriving twice at the source);
- ``poison``: malformed bytes, for the dead-letter topic.
"""
from __future__ import annotations

import collections
import itertools
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from ..domain import commands, events
from ..domain.lab import Lab
from ..domain.vocabulary import Limits
from ..store import timeline
from .config import producer_config

MAX_BURST = 10_000
# The agent's producers kept at once (each a librdkafka instance with its threads and connections).
MAX_PRODUCERS = 16
FLUSH_TIMEOUT = 30.0


class PublishError(ValueError):
    """The publish request cannot be carried out; the message names the field."""


@dataclass
class Report:
    """What the broker said about one produced record."""
    partition: int | None
    offset: int | None
    error: str | None


@dataclass
class SequencedProducer:
    """A producer with a name and a running number for the events it sends (``producer_seq``)."""
    producer: Producer
    producer_id: str
    numbers: itertools.count = field(default_factory=itertools.count)

    def stamp(self, built: list[tuple[events.PaymentEvent | None, bytes]]) -> list[tuple[events.PaymentEvent | None, bytes]]:
        """Each event stamped with this producer's id and its next number, in send order (poison as is)."""
        stamped = []
        for event, value in built:
            if event is not None:
                event = event.sequenced(self.producer_id, next(self.numbers))
                value = event.encode()
            stamped.append((event, value))
        return stamped


class Publisher:
    """One producer per lab and setting (idempotence, requests in flight), created on first use and
    kept: each lab's producers carry its client id, so the fault proxy's faults armed by one lab
    act on that lab's publishes only. At most ``max_producers`` are kept; the least recently used
    is flushed and closed first (a class's scenario runs are a lab each)."""

    def __init__(self, bootstrap_servers: str, max_producers: int = MAX_PRODUCERS):
        self.bootstrap_servers = bootstrap_servers
        self.max_producers = max_producers
        # The agent's command workers publish for several labs at once: the map of producers is
        # read and changed under this lock (each confluent-kafka Producer is thread-safe itself).
        self._lock = threading.RLock()
        # Least recently used first.
        self._producers: collections.OrderedDict[tuple[str, bool, int | None, str, int | None], SequencedProducer] = \
            collections.OrderedDict()

    def producer(self, lab: Lab, idempotent: bool, max_in_flight: int | None = None, acks: str = "all",
                 retries: int | None = None) -> SequencedProducer:
        """The lab's producer with these settings; PublishError naming the field when librdkafka
        refuses them (an idempotent producer without its terms: acks=all, retries >= 1, at most 5
        requests in flight)."""
        with self._lock:
            return self._producer(lab, idempotent, max_in_flight, acks, retries)

    def _producer(self, lab: Lab, idempotent: bool, max_in_flight: int | None, acks: str,
                  retries: int | None) -> SequencedProducer:
        setting = (lab.name, idempotent, max_in_flight, acks, retries)
        if setting in self._producers:
            self._producers.move_to_end(setting)
            return self._producers[setting]
        while len(self._producers) >= self.max_producers:
            _, oldest = self._producers.popitem(last=False)
            oldest.producer.flush(5)
        # The id names the setting, so the strip can say which producer wrote a record.
        name = (("idempotent" if idempotent else "plain") + (f"-inflight{max_in_flight}" if max_in_flight else "")
                + (f"-acks{acks}" if acks != "all" else "") + (f"-retries{retries}" if retries is not None else ""))
        try:
            created = Producer(producer_config(self.bootstrap_servers, idempotent, max_in_flight,
                                               client_id=lab.producer_client_id, acks=acks, retries=retries))
        except KafkaException as error:
            raise PublishError(refusal(error)) from None
        self._producers[setting] = SequencedProducer(created, f"{name}-{uuid.uuid4().hex[:8]}")
        return self._producers[setting]

    def forget(self, lab: Lab) -> None:
        """Flush and close the lab's producers (the lab is being reset or dropped)."""
        with self._lock:
            forgotten = [self._producers.pop(setting) for setting in list(self._producers) if setting[0] == lab.name]
        for sequenced in forgotten:
            sequenced.producer.flush(5)

    def send(self, lab: Lab, topic: str, records: list[tuple[bytes | None, bytes]], idempotent: bool,
             max_in_flight: int | None = None, acks: str = "all", retries: int | None = None) -> list[Report]:
        """Produce ``(key, value)`` records with the lab's producer and wait for every delivery
        report, in order."""
        producer = self.producer(lab, idempotent, max_in_flight, acks, retries).producer
        reports: list[Report | None] = [None] * len(records)

        def on_delivery(index: int):
            def callback(error: KafkaError | None, message) -> None:
                offset = message.offset() if message is not None else None
                reports[index] = Report(
                    partition=message.partition() if message is not None else None,
                    # A record the broker kept but whose ack was lost can arrive with no offset.
                    offset=offset if offset is not None and offset >= 0 else None,
                    error=error.str() if error is not None else None)
            return callback

        for index, (key, value) in enumerate(records):
            while True:
                try:
                    producer.produce(topic, value=value, key=key, on_delivery=on_delivery(index))
                    break
                except BufferError:
                    producer.poll(0.1)  # local queue full: serve delivery reports, then retry
        remaining = producer.flush(FLUSH_TIMEOUT)
        if remaining:
            raise PublishError(f"{remaining} record(s) not acknowledged by Kafka within {FLUSH_TIMEOUT:.0f}s")
        return [report or Report(None, None, "no delivery report") for report in reports]

    def close(self) -> None:
        with self._lock:
            closing = list(self._producers.values())
            self._producers.clear()
        for sequenced in closing:
            sequenced.producer.flush(5)


RAW_MAX_BYTES = Limits.RAW_VALUE_BYTES


def _raw_bytes(name: str, value: str | bytes | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise PublishError(f"{name} must be text")


def produce_raw(producer_config: dict[str, Any], topic: str, key: str | bytes | None, value: str | bytes | None,
                headers: dict[str, str] | list[tuple[str, str | bytes]] | None = None,
                partition: int | None = None, timeout: float = FLUSH_TIMEOUT,
                aborted_transaction: bool = False) -> dict[str, Any]:
    """Produce one record exactly as typed (any text, JSON or not) and wait for its delivery report.

    ``producer_config`` is a confluent-kafka config (``kafka.config.producer_config(...)``); ``partition``
    None lets the partitioner choose from the key. Nothing is journaled: the log reader sees this
    record like any other producer's. Returns ``{"partition", "offset"}`` (offset None when the
    broker kept it but the report carried none); raises PublishError naming the field.

    ``aborted_transaction``: the record is written inside a Kafka transaction that is then aborted
    (``transactional.id`` ``<client.id>.aborting``): the broker has appended it, and the abort
    marker after it tells a ``read_committed`` consumer to skip it; a ``read_uncommitted`` one
    still reads it. Its offset is in the delivery report, which comes before the abort.
    """
    key_bytes, value_bytes = _raw_bytes("key", key), _raw_bytes("value", value)
    if value_bytes is not None and len(value_bytes) > RAW_MAX_BYTES:
        raise PublishError(f"value must be at most {RAW_MAX_BYTES} bytes")
    if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
        raise PublishError("partition must be a whole number from 0, or empty")
    pairs = list(headers.items()) if isinstance(headers, dict) else list(headers or [])
    encoded = []
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not isinstance(pair[0], str) or not pair[0]:
            raise PublishError("headers must be name/value pairs with a non-empty name")
        encoded.append((pair[0], _raw_bytes(f"header {pair[0]}", pair[1])))
    outcome: dict[str, Any] = {}

    def on_delivery(error: KafkaError | None, message) -> None:
        outcome["error"] = error.str() if error is not None else None
        offset = message.offset() if message is not None else None
        outcome["partition"] = message.partition() if message is not None else None
        outcome["offset"] = offset if offset is not None and offset >= 0 else None

    if aborted_transaction:
        producer_config = {**producer_config, "enable.idempotence": True,
                           "transactional.id": f"{producer_config.get('client.id', 'lab')}.aborting"}
    producer = Producer(producer_config)
    try:
        extra = {"partition": partition} if partition is not None else {}
        try:
            if aborted_transaction:
                producer.init_transactions(timeout)
                producer.begin_transaction()
            producer.produce(topic, value=value_bytes, key=key_bytes, headers=encoded or None,
                             on_delivery=on_delivery, **extra)
            if producer.flush(timeout):
                raise PublishError(f"the record was not acknowledged by Kafka within {timeout:.0f}s")
            if aborted_transaction:
                producer.abort_transaction(timeout)
        except KafkaException as error:
            raise PublishError(str(error.args[0].str() if error.args else error)) from None
    finally:
        producer.flush(0)
    if outcome.get("error"):
        raise PublishError(f"Kafka refused the record: {outcome['error']}")
    return {"partition": outcome.get("partition"), "offset": outcome.get("offset"),
            **({"aborted": True} if aborted_transaction else {})}


# librdkafka's refusals of an idempotent producer without its terms, by the setting each names.
REFUSED_SETTING = {"`acks`": "acks", "`retries`": "retries", "`max.in.flight`": "max_in_flight"}


def refusal(error: KafkaException) -> str:
    """librdkafka's refusal to create a producer, as a message naming the publish field."""
    reason = error.args[0].str() if error.args and isinstance(error.args[0], KafkaError) else str(error)
    named = next((name for setting, name in REFUSED_SETTING.items() if setting in reason), "idempotent")
    return f"{named}: librdkafka refuses to create this producer: {reason.removeprefix('Failed to create producer: ')}"


def _within(name: str, value: int, low: int, high: int) -> int:
    if not low <= value <= high:
        raise PublishError(f"{name} must be a whole number from {low} to {high}")
    return value


def _journal_event(conn: psycopg.Connection, event_id: str | None) -> events.PaymentEvent:
    """The journaled event to resend or duplicate: the one named, or the newest valid one."""
    where, params = ("event_id = %s", [event_id]) if event_id else ("event_id IS NOT NULL", [])
    row = conn.execute(f"SELECT payload FROM published_events WHERE {where} ORDER BY id DESC LIMIT 1",
                       params).fetchone()
    if row is None:
        raise PublishError(f"event_id: no published event {event_id}" if event_id
                           else "event_id: nothing published yet to resend")
    return events.decode(row[0].encode())


def build_records(conn: psycopg.Connection,
                  command: commands.Publish) -> tuple[str, list[tuple[events.PaymentEvent | None, bytes]]]:
    """Turn a publish command into (mode, [(event or None for poison, bytes)]). Raises PublishError."""
    mode = command.mode
    if mode == "poison":
        try:
            return mode, [(None, events.poison_pill(command.poison_kind))]
        except ValueError as error:
            raise PublishError(f"poison_kind: {error}") from None
    if mode in ("resend", "source-duplicate"):
        original = _journal_event(conn, command.event_id)
        event = original if mode == "resend" else original.as_source_duplicate()
        return mode, [(event, event.encode())]

    account_id = command.account_id
    exists = conn.execute("SELECT 1 FROM accounts WHERE id = %s", [account_id]).fetchone()
    if exists is None:
        raise PublishError(f"account_id: no account {account_id!r}")
    count = _within("count", command.count, 1, MAX_BURST) if mode == "burst" else 1
    event_type = command.type
    if event_type not in events.TYPE_FIELDS:
        raise PublishError(f"type must be one of {', '.join(events.EVENT_TYPES)}")
    field = events.TYPE_FIELDS[event_type]
    built = []
    for _ in range(count):
        try:
            event = events.new_event(event_type, account_id, transaction_id=command.transaction_id or None,
                                     occurred_at=command.occurred_at or None, **{field: getattr(command, field)})
        except events.InvalidEvent as error:
            raise PublishError(error.reason) from None
        built.append((event, event.encode()))
    return mode, built


JOURNAL_INSERT = """
INSERT INTO published_events (event_id, transaction_id, type, account_id, amount_cents, status, mode,
                              idempotent_producer, partition, "offset", error, payload)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)
"""


def publish(conn: psycopg.Connection, publisher: Publisher, lab: Lab, command: commands.Publish) -> dict[str, Any]:
    """Validate, produce, journal. ``conn`` works in the lab's schema. Returns what was written."""
    idempotent = command.idempotent
    max_in_flight = (_within("max_in_flight", command.max_in_flight, *Limits.MAX_IN_FLIGHT)
                     if command.max_in_flight is not None else None)
    retries = (_within("retries", command.retries, *Limits.PRODUCER_RETRIES)
               if command.retries is not None else None)
    acks = command.acks or "all"
    mode, built = build_records(conn, command)
    built = publisher.producer(lab, idempotent, max_in_flight, acks, retries).stamp(built)
    reports = publisher.send(lab, lab.topic, [(e.key if e else None, value) for e, value in built], idempotent,
                             max_in_flight, acks, retries)
    rows = []
    with conn.transaction():
        for (event, value), report in zip(built, reports):
            conn.execute(JOURNAL_INSERT, [
                event.event_id if event else None, event.transaction_id if event else None,
                event.type if event else None, event.account_id if event else None,
                event.amount_cents if event else None, event.status if event else None,
                mode, idempotent, report.partition, report.offset, report.error,
                value.decode("utf-8", errors="backslashreplace")])
            rows.append({"event_id": event.event_id if event else None, "partition": report.partition,
                         "offset": report.offset, "error": report.error,
                         "producer_seq": event.producer_seq if event else None})
        first = built[0][0]
        summary = (f"{len(built)} {mode} event(s)" if len(built) > 1 else
                   f"{mode} {first.type} {first.account_id} {getattr(first, events.TYPE_FIELDS[first.type])}" if first else
                   f"poison pill ({command.poison_kind})")
        producer_kind = ("idempotent producer" if idempotent else "plain producer") + (
            f", {max_in_flight} request(s) in flight" if max_in_flight else "") + (
            f", acks={acks}" if acks != "all" else "") + (f", retries={retries}" if retries is not None else "")
        timeline.record(conn.execute, "published", f"{summary} via {producer_kind}",
                        mode=mode, records=rows[:20])
    return {"mode": mode, "idempotent": idempotent, "max_in_flight": max_in_flight, "records": rows}
