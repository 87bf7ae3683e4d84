"""Batch mode: ``consume(n)``, one database transaction per batch, then one offset commit.

A group whose ``batch_size`` is more than 1 runs this instead of the per-message step. The
strategy's ``apply_batch`` (webapp/strategies/batching.py) runs its set-based statements in one
transaction and writes the batch's ledger rows; then the batch's offsets are committed at once
(the highest offset + 1 of each partition). The crash points are passed once per batch, so a
crash or a rebalance between the database commit and the offset commit redelivers the whole
batch: under ``none`` every credit of it is applied again, under ``eventid-atomic`` every one is
absorbed.

What cannot be applied as a whole is applied one by one: an invalid record is dead-lettered
before the batch's transaction (as in per-message mode); a batch that fails (a database error,
an unknown account, insert-first's unique violation) is rolled back and its records go through
the per-message path, where each gets its own outcome (absorbed, retried, dead-lettered).
"""
from __future__ import annotations

from typing import Any, Protocol

import psycopg
from confluent_kafka import Message, TopicPartition

from ..domain import events
from ..strategies.base import ABSORBED, APPLIED, DEAD_LETTERED
from ..strategies.batching import RECORD_DELIVERIES_BATCH, BatchRejected, Item
from .commit import Committer
from .context import EffectsContext
from .deadletter import DeadLetters
from .report import Reporter
from .retry import Retries


class ConsumerProcess(Protocol):
    """What the batch step uses of its consumer process (loop.ConsumerProcess is the one): the
    loop imports this module, never the other way round."""
    name: str
    group_id: str
    group: Any                   # the group's settings (batch size, wait)
    consumer: Any                # confluent_kafka.Consumer
    current: Message | None
    report: Any                  # control.Report
    strategy_name: str
    batch_span: str | None
    effects: EffectsContext      # the effects connection, the ledger, the crash points
    retries: Retries
    dead_letters: DeadLetters
    committer: Committer
    reporter: Reporter

    def refresh_settings(self) -> None: ...
    def current_strategy(self) -> Any: ...
    def on_error(self, error: Any) -> None: ...
    def process(self, message: Message) -> None: ...


def span(messages: list[Message]) -> str:
    """Where a batch is, for the timeline: ``(batch of 50: partition 0 offsets 3-27, partition 1 ...)``."""
    ranges: dict[int, list[int]] = {}
    for message in messages:
        low_high = ranges.setdefault(message.partition(), [message.offset(), message.offset()])
        low_high[0], low_high[1] = min(low_high[0], message.offset()), max(low_high[1], message.offset())
    parts = ", ".join(f"partition {p} offset{'s' if lo != hi else ''} {lo}{f'-{hi}' if lo != hi else ''}"
                      for p, (lo, hi) in sorted(ranges.items()))
    return f"(batch of {len(messages)}: {parts})"


def next_offsets(messages: list[Message]) -> list[TopicPartition]:
    """What committing ``messages`` means: per partition, the highest offset + 1."""
    highest: dict[tuple[str, int], int] = {}
    for message in messages:
        key = (message.topic(), message.partition())
        highest[key] = max(highest.get(key, -1), message.offset())
    return [TopicPartition(topic, partition, offset + 1) for (topic, partition), offset in sorted(highest.items())]


class BatchLoop:
    """The batch step of one consumer process; the strategy's batch context."""

    def __init__(self, process: "ConsumerProcess"):
        self.process = process

    # --- the strategy's batch context -------------------------------------------------------

    def execute(self, statement: str, params: dict[str, Any]) -> psycopg.Cursor:
        return self.process.effects.execute(statement, params)

    def transaction(self):
        return self.process.effects.transaction()

    def checkpoint(self, point: str) -> None:
        self.process.effects.checkpoint(point)

    def record_batch(self, items: list[Item]) -> None:
        if not items:
            return
        p = self.process
        self.execute(RECORD_DELIVERIES_BATCH, {
            "group_id": p.group_id, "consumer": p.name, "generation": p.report.generation,
            "strategy": p.strategy_name, "partitions": [i.partition for i in items],
            "offsets": [i.offset for i in items], "event_ids": [i.event.event_id for i in items],
            "transaction_ids": [i.event.transaction_id for i in items], "outcomes": [i.outcome for i in items],
            "reasons": [i.reason for i in items]})

    # --- the step ---------------------------------------------------------------------------

    def step(self) -> None:
        """Consume up to batch_size records (waiting at most batch_max_wait_ms) and apply them."""
        p = self.process
        messages = p.consumer.consume(p.group.batch_size, timeout=p.group.batch_max_wait_ms / 1000)
        records = []
        for message in messages:
            if message.error():
                p.on_error(message.error())
            else:
                records.append(message)
        if records:
            self.apply(records)

    def apply(self, records: list[Message]) -> None:
        p = self.process
        # Faults armed and settings changed before the batch was consumed apply to it.
        p.refresh_settings()
        items, valid = [], []
        for message in records:
            try:
                items.append(Item(events.decode(message.value()), message.partition(), message.offset()))
                valid.append(message)
            except events.InvalidEvent as invalid:
                p.current = message
                p.dead_letters.send(message, invalid.reason)
                p.reporter.count(DEAD_LETTERED)
                p.current = None
        p.batch_span = span(records)
        try:
            if items:
                p.effects.ensure_connected()
                strategy = p.current_strategy()
                strategy.apply_batch(self, items)
        except (BatchRejected, events.InvalidEvent, psycopg.Error) as error:
            # The strategy's transaction was rolled back when the error left it.
            p.batch_span = None
            self._one_by_one(valid, error)
            return
        for outcome in (APPLIED, ABSORBED):
            p.reporter.count(outcome, sum(1 for i in items if i.outcome == outcome))
        offsets = next_offsets(records)
        for tp in offsets:
            p.retries.done(tp.topic, tp.partition)
            p.report.applied_positions[str(tp.partition)] = tp.offset
        p.committer.commit_offsets(offsets, before_commit="after-effect-before-commit")
        p.effects.checkpoint("after-commit")
        p.batch_span = None

    def _one_by_one(self, records: list[Message], error: Exception) -> None:
        """A batch that could not be applied as a whole: its records through the per-message path."""
        p = self.process
        text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        p.reporter.say("error", f"{p.name}: a batch of {len(records)} was rolled back "
                                f"({type(error).__name__}: {text}); its records are applied one by one")
        for message in records:
            if p.retries.waiting(message.topic(), message.partition()):
                continue  # its partition waits for a retry and was sought back: the rest of it comes again
            p.process(message)
