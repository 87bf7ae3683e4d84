"""The committer: a consumer's offsets, committed in its group's commit mode after the effect.

Offsets are committed in the group's commit mode: ``sync``, ``async``, or ``transactional``.

sync waits for the broker's answer, and when the commit did not get there
(RETRIABLE_COMMIT_ERRORS) commits again before the next record, like the Java client's
commitSync: at most this one record is done and uncommitted. async returns at once (the answer
comes to ``on_commit`` during a later poll, and a failed one is not retried), so the consumer
moves on while its commits may never arrive: a crash then brings back every record since the last
commit that did.

transactional: a Kafka transaction of the consumer's own (``transactional.id`` per consumer,
stable across its restarts) carries the offsets (``send_offsets_to_transaction``, then
``commit_transaction``), the consume-transform-produce half that Kafka's exactly-once is made of.
The PostgreSQL effect is committed before that transaction begins and is never part of it; a crash
inside it leaves it open until the next process with the same ``transactional.id`` fences it and
aborts it at ``init_transactions`` (or ``transaction.timeout.ms`` passes), so the offset is not
committed and the record comes back.

A commit that fails for good (a zombie's, whose generation is gone; an asynchronous one, which is
not retried) is counted, kept as the consumer's last error and said on the timeline.
"""
from __future__ import annotations

from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer, TopicPartition

from ..kafka.config import producer_config

# A synchronous commit that failed on its way to the group coordinator (the path is down, the
# coordinator moved) is tried again before the next record: the offsets are still ours to commit.
# A failure that fences us (a new generation) is not retried.
RETRIABLE_COMMIT_ERRORS = frozenset({
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD, KafkaError._ALL_BROKERS_DOWN,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS})
COMMIT_RETRY_PAUSE = 0.2
# How long each call of a Kafka transaction waits (init, send_offsets_to_transaction, commit, abort).
TRANSACTION_TIMEOUT = 15.0


def kafka_reason(error: KafkaException) -> tuple[KafkaError | None, str]:
    """The KafkaError a KafkaException carries (None if it carries none), and its name and text."""
    kafka_error = error.args[0] if error.args else None
    if not isinstance(kafka_error, KafkaError):
        return None, str(error)
    return kafka_error, f"{kafka_error.name()}: {kafka_error.str()}"


def describe_offsets(offsets: list[TopicPartition]) -> str:
    return ", ".join(f"offset {tp.offset} on partition {tp.partition}" for tp in offsets)


def where_on_the_timeline(offsets: list[TopicPartition]) -> dict[str, int | None]:
    """The timeline's partition and offset of a commit: its first partition's last record."""
    first = offsets[0] if offsets else None
    return {"partition": first.partition if first else None, "offset": first.offset - 1 if first else None}


class Committer:
    """One consumer process's offset commits. ``process`` is the consumer (loop.ConsumerProcess):
    its Kafka consumer, group settings, effects context (crash points), report and reporter."""

    def __init__(self, process: Any):
        self.process = process
        self.producer: Producer | None = None  # commit mode transactional: its own producer

    def commit(self, message: Message, before_commit: str | None = None) -> None:
        """Commit the offset after ``message``."""
        self.commit_offsets([TopicPartition(message.topic(), message.partition(), message.offset() + 1)],
                            before_commit)

    def commit_offsets(self, offsets: list[TopicPartition], before_commit: str | None = None) -> None:
        """Commit ``offsets`` (the next offset to read, per partition) in the group's commit mode,
        passing the crash point ``before_commit`` last before the commit itself. The report follows
        (Reporter.report_effects): at once after a quiet spell, else on the heartbeat's cadence, not
        after every commit."""
        process = self.process
        if process.group.transactional_commits:
            self._commit_in_kafka_transaction(offsets, before_commit)
        else:
            if before_commit is not None:
                process.effects.checkpoint(before_commit)
            self._commit_to_the_group(offsets)
        process.reporter.report_effects()

    def _commit_to_the_group(self, offsets: list[TopicPartition]) -> None:
        """sync or async; a synchronous commit that did not reach the coordinator is tried again."""
        process = self.process
        attempts = 0
        while True:
            try:
                process.consumer.commit(offsets=offsets, asynchronous=process.group.asynchronous_commits)
                return
            except KafkaException as error:
                kafka_error, reason = kafka_reason(error)
                if kafka_error is None or kafka_error.code() not in RETRIABLE_COMMIT_ERRORS or process.stopping:
                    self._failed(offsets, reason)
                    return
                attempts += 1
                self._retried(offsets, reason, attempts)

    # --- commit mode transactional ----------------------------------------------------------

    def start_transactions(self) -> Producer:
        """The consumer's transactional producer, initialized: its ``transactional.id`` is the
        consumer's client id, so a restarted process fences the one before it. Initializing it
        aborts a transaction the previous process under this transactional.id left open (a crash
        inside it)."""
        if self.producer is None:
            process = self.process
            client_id = process.lab.client_id(process.name)
            transactional_id = f"{client_id}.offsets"
            producer = Producer({**producer_config(process.bootstrap_servers, idempotent=True, client_id=client_id),
                                 "transactional.id": transactional_id})
            producer.init_transactions(TRANSACTION_TIMEOUT)
            self.producer = producer
            process.reporter.say("transactions", f"{process.name} commits its offsets in Kafka transactions as "
                                 f"transactional.id {transactional_id}; initializing it aborted any transaction a "
                                 "previous process under that id left open", transactional_id=transactional_id)
        return self.producer

    def _commit_in_kafka_transaction(self, offsets: list[TopicPartition], before_commit: str | None) -> None:
        """Begin a Kafka transaction, send it the offsets with the group's metadata (generation and
        member id: the coordinator refuses a zombie's), pass ``before_commit``, commit it.

        The effect is already committed in PostgreSQL: a crash at ``before_commit`` leaves the
        transaction open until the restart's ``init_transactions`` (or ``transaction.timeout.ms``)
        aborts it, and the offsets go with it. A failure aborts the transaction and is reported like
        any failed commit: the record comes back to whoever owns its partition next."""
        process = self.process
        try:
            producer = self.start_transactions()
            producer.begin_transaction()
            producer.send_offsets_to_transaction(offsets, process.consumer.consumer_group_metadata(),
                                                 TRANSACTION_TIMEOUT)
            if before_commit is not None:
                process.effects.checkpoint(before_commit)
            producer.commit_transaction(TRANSACTION_TIMEOUT)
        except KafkaException as error:
            self.abort_open_transaction()
            self._failed(offsets, kafka_reason(error)[1])

    def abort_open_transaction(self) -> None:
        """Abort the transaction in progress, if any; a producer that cannot (a fatal error: fenced)
        is dropped, and the next commit starts a new one."""
        producer = self.producer
        if producer is None:
            return
        try:
            producer.abort_transaction(TRANSACTION_TIMEOUT)
        except KafkaException as error:
            kafka_error, _ = kafka_reason(error)
            if kafka_error is not None and kafka_error.code() == KafkaError._STATE:
                return  # no transaction in progress: nothing to abort
            self.producer = None

    # --- failures ---------------------------------------------------------------------------

    def on_commit(self, error: KafkaError | None, offsets: list[TopicPartition]) -> None:
        """librdkafka's answer to a commit; an asynchronous commit's failure is only seen here."""
        if error is not None and self.process.group.asynchronous_commits and error.code() != KafkaError._NO_OFFSET:
            self._failed(offsets, f"{error.name()}: {error.str()}")

    def _retried(self, offsets: list[TopicPartition], reason: str, attempts: int) -> None:
        """A synchronous commit that did not reach the coordinator: say so (once), keep reporting
        (the heartbeat also notices a stop or a lab reset), and pause before trying again."""
        process = self.process
        what = describe_offsets(offsets)
        process.report.last_error = (f"commit of {what} failed ({reason}), attempt {attempts}: "
                                     "it commits again before its next record")
        # The effect is committed: a lost control connection here must not send the record back to
        # processing (it would apply it again). It is noted; the loop reconnects after the commit.
        with process.reporter.from_callback():
            if attempts == 1:
                process.reporter.say("commit-failed", f"{process.name} could not commit {what}: {reason}; a "
                                     "synchronous commit is tried again, and no further record is processed until "
                                     "it lands", **where_on_the_timeline(offsets))
            process.reporter.heartbeat(force=True)
        process.keep_alive(COMMIT_RETRY_PAUSE)  # librdkafka's own retries took a second or more before this

    def _failed(self, offsets: list[TopicPartition], reason: str) -> None:
        # A zombie's commit: its generation is gone (UNKNOWN_MEMBER_ID / ILLEGAL_GENERATION).
        process = self.process
        process.report.counts.commit_failures += 1
        process.report.last_error = reason
        process.reporter.say("commit-failed", f"{process.name} could not commit {describe_offsets(offsets)}: {reason}",
                             **where_on_the_timeline(offsets))
