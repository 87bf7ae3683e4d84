"""The log reader: a mirror of every record of every lab topic, whoever produced it.

One confluent-kafka Consumer with no group: it is *assigned* every partition of every lab's
``<lab>.payments`` topic (no subscribe, no rebalance, no offset commits) and reads from where
the mirror ends (``max(offset) + 1`` per partition of ``log_records``; the start of the log for
a new lab). Records arrive in batches (``consume(n)``); each batch is decoded with the same
decoder the consumers use (``events.decode``) and written, one row per record, in one
``INSERT ... SELECT FROM unnest(...) ON CONFLICT DO NOTHING`` per lab: (partition, offset) is
the primary key, so a reader that re-reads after a crash or a restart writes nothing twice.

An event the lab's producer stamped (``producer_id``, ``producer_seq``) gets
``out_of_order_after``: the highest number the same producer had already written to that
partition, when above its own (webapp/readmodel/ordering.py says what that means).

The reader never trusts the broker's high watermark (wrong on Tansu for multi-record batches,
docs/concepts/broker.md): the log end is the last offset it actually fetched.

A lab that is reset (its schema dropped and created again, its topic deleted and created
again) gets a new schema oid: the reader notices, forgets its positions for that lab and reads
the new topic from the table's (empty) end, i.e. from the start. Every write checks the oid
in its own transaction, so a record fetched from the old topic never lands in the new schema.
"""
from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Iterator

import psycopg
from confluent_kafka import (
    OFFSET_BEGINNING,
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from ..domain import events
from ..domain.lab import Lab
from ..domain.waits import WaitTimeout, wait_until
from ..store.connection import connect
from ..store.schema import quoted

log = logging.getLogger("idempotency_lab.logreader")

BATCH = 1000
POLL_TIMEOUT = 0.2
REFRESH_EVERY = 1.0  # seconds between looks for new, reset or removed labs
METADATA_TIMEOUT = 5.0

# A shallow, fair prefetch. The reader is one consumer for every lab, and librdkafka fills one local
# queue for all its partitions: with the defaults (up to 100,000 records or 64 MB queued, 1 MB per
# partition per Fetch) a quiet lab's new record lands behind everything already prefetched of a
# busy lab's backlog, up to 100,000 records. Here the fetcher stops once a batch is queued, and a
# Fetch asks 64 KB of each partition: the first partition of a Fetch still answers a whole
# producer batch (Tansu, like Kafka; up to ~1.9 MB of the lab's events), others about 64 KB, and
# librdkafka starts each Fetch one partition further round, so a quiet lab's new record comes in
# one of the next Fetches, not after the prefetched backlog. fetch.max.bytes stays large: a small
# one fills each Fetch with the first partition's batch, and a quiet partition waits its turn
# round every assigned partition (measured: docs/concepts/broker.md, "How much a Fetch returns").
FETCH_CONFIG = {
    "queued.min.messages": BATCH,
    "queued.max.messages.kbytes": 1024,
    "max.partition.fetch.bytes": 64 * 1024,
}

# Labs the reader serves by default: every lab schema (lanes are copies of the accounts, not labs).
KNOWN_LABS_SQL = """
SELECT n.nspname, n.oid::bigint FROM pg_namespace n
WHERE n.nspname LIKE 'lab\\_%' AND n.nspname NOT LIKE '%\\_\\_%'
  AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'log_records')
"""

SCHEMA_OID_SQL = "SELECT oid::bigint FROM pg_namespace WHERE nspname = %s"

# The highest producer_seq each (partition, producer) of a batch already has in the mirror: one
# index lookup per pair (a batch holds a few), not per record.
PRODUCER_HIGHS_SQL = """
SELECT p.partition, p.producer_id, (SELECT max(x.producer_seq) FROM {schema}.log_records x
                                    WHERE x.partition = p.partition AND x.producer_id = p.producer_id)
FROM unnest(%s::int[], %s::text[]) AS p(partition, producer_id)
"""

# Where the mirror of each partition ends: the primary key answers per partition.
POSITIONS_SQL = 'SELECT partition, max("offset") + 1 FROM {schema}.log_records GROUP BY partition'

# One statement per lab and batch; arrays in (binary: no text escaping), one row per record out. Headers and the event are
# JSON texts cast to jsonb; the record's identity makes a re-read harmless. A valid record is the
# first of its transaction when it is the first of the batch (in log order: ``first_in_batch``,
# from the reader) and no earlier batch held one: the reader reads each partition in offset
# order, so this is log order.
INSERT_SQL = """
INSERT INTO {schema}.log_records (partition, "offset", "timestamp", key, headers, value, event_id, transaction_id,
                                  type, account_id, amount_cents, status, balance_cents, score, occurred_at,
                                  invalid_reason, first_of_transaction, producer_id, producer_seq, out_of_order_after)
SELECT partition, "offset", ts, key, headers::jsonb, value, event_id::uuid, transaction_id, type, account_id,
       amount_cents, status, balance_cents, score, occurred_at, invalid_reason,
       first_in_batch AND NOT EXISTS (SELECT 1 FROM {schema}.log_records x WHERE x.transaction_id = r.transaction_id
                                      AND x.invalid_reason IS NULL AND x.first_of_transaction),
       producer_id, producer_seq,
       -- the producer's highest number so far in this partition (from the reader), kept only when
       -- above this record's own: the record landed out of order
       CASE WHEN batch_high > producer_seq THEN batch_high END
FROM unnest(%(partition)b::int[], %(offset)b::bigint[], %(ts)b::timestamptz[], %(key)b::text[],
            %(headers)b::text[], %(value)b::text[], %(event_id)b::text[], %(transaction_id)b::text[],
            %(type)b::text[], %(account_id)b::text[], %(amount_cents)b::bigint[], %(status)b::text[],
            %(balance_cents)b::bigint[], %(score)b::bigint[], %(occurred_at)b::text[], %(invalid_reason)b::text[],
            %(first_in_batch)b::bool[], %(producer_id)b::text[], %(producer_seq)b::bigint[], %(batch_high)b::bigint[])
     AS r(partition, "offset", ts, key, headers, value, event_id, transaction_id, type, account_id, amount_cents,
          status, balance_cents, score, occurred_at, invalid_reason, first_in_batch, producer_id, producer_seq,
          batch_high)
ON CONFLICT (partition, "offset") DO NOTHING
"""

COLUMNS = ("partition", "offset", "ts", "key", "headers", "value", "event_id", "transaction_id", "type",
           "account_id", "amount_cents", "status", "balance_cents", "score", "occurred_at", "invalid_reason",
           "first_in_batch", "producer_id", "producer_seq", "batch_high")
EVENT_FIELDS = ("event_id", "transaction_id", "type", "account_id", "amount_cents", "status", "balance_cents",
                "score", "occurred_at", "producer_id", "producer_seq")
MAX_TEXT = 64_000  # a record's value kept as text up to this many characters (the lab's events are ~250)


def as_text(data: bytes | str | None, limit: int | None = None) -> str | None:
    """Bytes as PostgreSQL text: UTF-8, undecodable bytes and NUL as ``\\xNN``."""
    if data is None:
        return None
    text = data if isinstance(data, str) else data.decode("utf-8", errors="backslashreplace")
    text = text.replace("\x00", "\\x00")
    return text if limit is None or len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more)"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def record_row(message: Message) -> dict[str, Any]:
    """One record as the columns of ``log_records``: its envelope, and its event or why it is invalid."""
    kind, millis = message.timestamp()
    headers = message.headers()
    row: dict[str, Any] = {
        "partition": message.partition(), "offset": message.offset(),
        "ts": None if kind == TIMESTAMP_NOT_AVAILABLE or millis is None or millis < 0
        else datetime.fromtimestamp(millis / 1000, tz=timezone.utc),
        "key": as_text(message.key(), 1024),
        "headers": json.dumps([[name, as_text(value, 1024)] for name, value in headers]) if headers else "[]",
        "value": as_text(message.value(), MAX_TEXT),
        **{name: None for name in EVENT_FIELDS}, "invalid_reason": None,
    }
    try:
        event = events.decode(message.value())
    except events.InvalidEvent as invalid:
        row["invalid_reason"] = as_text(invalid.reason, 2000)
        return row
    fields = vars(event)  # the dataclass's fields, as events.to_dict gives them (without its deep copy)
    # Whatever types events.py decodes: the known fields get columns, the whole event its JSON.
    for name in EVENT_FIELDS:
        value = fields.get(name)
        if name in ("amount_cents", "balance_cents", "score", "producer_seq"):
            value = _int(value)
        elif value is not None:
            value = str(value)
        row[name] = value
    # The whole event (any type events.py decodes, whatever its fields) is the value itself: a
    # JSON object the decoder accepted (``value::jsonb`` reads it whole).
    return row


def default_labs(conn: psycopg.Connection) -> list[Lab]:
    return [Lab.of_schema(schema) for schema, _ in conn.execute(KNOWN_LABS_SQL).fetchall()]


@dataclass
class _Mirror:
    """What the reader knows of one lab: its schema's identity and where each partition's mirror ends."""
    lab: Lab
    oid: int
    partitions: list[int] = field(default_factory=list)
    positions: dict[int, int] = field(default_factory=dict)  # next offset to mirror per partition
    failed: bool = False  # a write failed: later batches of this mirror are not written


@dataclass
class Stats:
    records: int = 0
    batches: int = 0
    errors: int = 0
    last_error: str | None = None
    labs: int = 0


# Not "lab-...": the reader serves every lab, and no lab's faults may match it (Lab.of_client_id).
LOG_READER_CLIENT_ID = "idempotency-lab-log-reader"


class LogReader:
    """Mirror every lab topic into its lab's ``log_records``.

    ``LogReader(database_url, bootstrap_servers).run(stop_event)`` on its own thread (or
    ``python -m webapp.logreader``); or call ``poll_once()`` from an existing loop. ``labs``
    chooses the labs to mirror (a callable given a psycopg connection, returning Labs); by
    default every lab schema in the database.
    """

    def __init__(self, database_url: str, bootstrap_servers: str,
                 labs: Callable[[psycopg.Connection], Iterable[Lab]] | None = None,
                 batch: int = BATCH, poll_timeout: float = POLL_TIMEOUT, client_id: str = LOG_READER_CLIENT_ID):
        self.database_url = database_url
        self.bootstrap_servers = bootstrap_servers
        self.labs_provider = labs or default_labs
        self.batch = batch
        self.poll_timeout = poll_timeout
        self.client_id = client_id
        self.stats = Stats()
        self._mirrors: dict[str, _Mirror] = {}  # topic -> mirror
        self._last_refresh = 0.0
        self._conn: psycopg.Connection | None = None
        self._consumer: Consumer | None = None
        # Pausing (around a lab reset): requested by any thread, carried out by the reading thread.
        self._pause_requests = 0
        self._pause_lock = threading.Lock()
        self._paused = threading.Event()
        self._reading_thread: threading.Thread | None = None
        # Holding (the agent's signal, around a lab drop or reset in the sidecar process): see hold().
        self._held = False
        self._holds = 0  # holds asked so far: each one is acknowledged once (on_held)
        self.on_held: Callable[[], None] | None = None
        self._turned_at = time.monotonic()  # the reading loop's last round (turning())

    # --- clients ---------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        conn = connect(self.database_url, autocommit=True)
        try:
            # The mirror is a copy of the log: a crash that loses its last commits loses nothing (the
            # reader resumes from the table and reads those records again), so no flush per batch.
            conn.execute("SET synchronous_commit = off")
        except BaseException:
            conn.close()  # a session lost between the two: not left open for the garbage collector
            raise
        return conn

    def _db(self) -> psycopg.Connection:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _kafka(self) -> Consumer:
        if self._consumer is None:
            self._consumer = Consumer({
                "bootstrap.servers": self.bootstrap_servers,
                # Assigned, never subscribed: no group membership, no rebalance, nothing committed.
                "group.id": f"{self.client_id}-unused",
                "client.id": self.client_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": False,
                "fetch.wait.max.ms": 100,
                **FETCH_CONFIG,
                "log_level": 3,
            })
        return self._consumer

    # --- which labs, which partitions ------------------------------------------------------

    def refresh(self) -> None:
        """Start mirroring new labs, restart reset ones, drop removed ones."""
        conn = self._db()
        wanted = {lab.topic: lab for lab in self.labs_provider(conn)}
        oids = {}
        for topic, lab in wanted.items():
            row = conn.execute(SCHEMA_OID_SQL, [lab.schema]).fetchone()
            if row is not None:
                oids[topic] = row[0]
        if any(oids.get(topic) != mirror.oid for topic, mirror in self._mirrors.items()):
            # A lab was reset or removed: its topic was (or is being) deleted and made again.
            # librdkafka 2.16 crashes (SIGSEGV in its metadata cache) when a consumer that knew
            # the old topic meets the new one, so start over with a new consumer: every lab
            # resumes from its table.
            self._recycle()
        missing = [topic for topic in oids if topic not in self._mirrors]
        if missing:
            metadata = self._kafka().list_topics(timeout=METADATA_TIMEOUT).topics
            for topic in missing:
                info = metadata.get(topic)
                if info is None or info.error is not None or not info.partitions:
                    continue  # the lab's topic is not created yet: next round
                self._start(wanted[topic], oids[topic], sorted(info.partitions))
        self.stats.labs = len(self._mirrors)
        self._last_refresh = time.monotonic()

    def _start(self, lab: Lab, oid: int, partitions: list[int]) -> None:
        positions = dict(self._db().execute(POSITIONS_SQL.format(schema=quoted(lab.schema))).fetchall())
        mirror = _Mirror(lab, oid, partitions, {p: int(positions.get(p, 0)) for p in partitions})
        self._kafka().incremental_assign([
            TopicPartition(lab.topic, p, mirror.positions[p] if p in positions else OFFSET_BEGINNING)
            for p in partitions])
        self._mirrors[lab.topic] = mirror
        log.info("mirroring %s (%d partitions) from %s", lab.topic, len(partitions), mirror.positions)

    def _forget(self, topic: str) -> None:
        mirror = self._mirrors.pop(topic)
        try:
            self._kafka().incremental_unassign([TopicPartition(topic, p) for p in mirror.partitions])
        except KafkaException as error:
            log.warning("unassigning %s: %s", topic, error)

    def _recycle(self) -> None:
        """Close the consumer and forget every lab: the next refresh starts a new consumer and
        resumes each lab from its table."""
        self._mirrors.clear()
        if self._consumer is not None:
            try:
                self._consumer.close()
            except (KafkaException, RuntimeError) as error:
                log.warning("closing the log reader's consumer: %s", error)
            self._consumer = None
        self._last_refresh = 0.0

    @contextlib.contextmanager
    def paused(self, timeout: float = 15.0) -> Iterator[None]:
        """Hold the reader off Kafka while a lab's topics are deleted and made again (a lab
        reset): its consumer is closed before this block runs and a new one starts after it.

        librdkafka 2.16 crashes the whole process (SIGSEGV in its metadata cache) when a topic
        is deleted while a consumer has it assigned, or when a consumer that knew a deleted topic
        meets the topic made again under the same name (measured on the embedded broker). Call
        from any thread; when the reader runs on a thread of its own, this waits (up to
        ``timeout`` seconds) until that thread has closed its consumer.
        """
        with self._pause_lock:
            self._pause_requests += 1
        try:
            reading = self._reading_thread
            if reading is not None and reading.is_alive() and reading is not threading.current_thread():
                if not self._paused.wait(timeout):
                    raise TimeoutError(f"the log reader did not pause within {timeout:.0f}s")
            else:
                self._recycle()  # the caller is the reading thread (poll_once): close it here
            yield
        finally:
            with self._pause_lock:
                self._pause_requests -= 1

    def hold(self) -> None:
        """Ask the reading thread to close its consumer, call ``on_held``, and read nothing until
        :meth:`release`: :meth:`paused` for a caller in another process (the agent signals the log
        reader's process). Safe in a signal handler: it only sets a flag."""
        self._held = True
        self._holds += 1

    def release(self) -> None:
        """End a :meth:`hold`: the next round starts a new consumer, each lab from its table."""
        self._held = False

    def _pause_point(self) -> bool:
        """On the reading thread: while a pause or a hold is requested, close the consumer and
        wait. True when it paused (the round reads nothing)."""
        if not (self._pause_requests or self._held):
            return False
        self._recycle()
        self._paused.set()
        acknowledged = 0
        while self._pause_requests or self._held:
            # Each hold answered once, including one asked again just after a release, before
            # this loop saw the release (two lab resets in a row).
            if self._held and self._holds != acknowledged and self.on_held is not None:
                acknowledged = self._holds
                self.on_held()
            self._turned_at = time.monotonic()  # held on purpose, not stuck: it keeps beating
            time.sleep(0.05)  # a signal (release) interrupts it; the flags are looked at again
        self._paused.clear()
        return True

    def _restart(self, topic: str) -> None:
        """Forget a lab's positions: the next refresh re-reads them from its table."""
        if topic in self._mirrors:
            self._forget(topic)
        self._last_refresh = 0.0

    # --- reading ---------------------------------------------------------------------------

    def _read(self, timeout: float | None) -> list[tuple[_Mirror, list[dict[str, Any]]]]:
        """Look for labs when due, consume up to ``batch`` records, decode them: rows per lab."""
        if self._pause_point():
            return []
        try:
            if time.monotonic() - self._last_refresh >= REFRESH_EVERY:
                self.refresh()
            if not self._mirrors:
                time.sleep(self.poll_timeout if timeout is None else timeout)
                return []
            messages = self._kafka().consume(self.batch, self.poll_timeout if timeout is None else timeout)
        except (psycopg.Error, KafkaException) as error:
            self._failed(error)
            return []
        by_topic: dict[str, list[Message]] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    self.stats.last_error = error.str()
                    log.warning("log reader: %s", error.str())
                    if error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC,
                                        KafkaError._UNKNOWN_PARTITION):
                        self._recycle()  # a topic went away under us: a new consumer, from the tables
                        return []
                continue
            by_topic.setdefault(message.topic(), []).append(message)
        return [(self._mirrors[topic], [record_row(m) for m in batch])
                for topic, batch in by_topic.items() if topic in self._mirrors]

    def _write(self, conn: psycopg.Connection, mirror: _Mirror, rows: list[dict[str, Any]]) -> int | None:
        """One INSERT for one lab's batch. None when the lab's schema changed since it was
        assigned (a reset): the batch belongs to the old topic and is not written."""
        rows = sorted(rows, key=lambda row: (row["partition"], row["offset"]))
        seen: set[str] = set()
        for row in rows:
            transaction_id = row["transaction_id"] if row["invalid_reason"] is None else None
            row["first_in_batch"] = transaction_id is not None and transaction_id not in seen
            if transaction_id is not None:
                seen.add(transaction_id)
        with conn.transaction():
            oid = conn.execute(SCHEMA_OID_SQL, [mirror.lab.schema]).fetchone()
            if oid is None or oid[0] != mirror.oid:
                return None
            self._mark_producer_highs(conn, mirror, rows)
            params = {column: [row[column] for row in rows] for column in COLUMNS}
            written = conn.execute(INSERT_SQL.format(schema=quoted(mirror.lab.schema)), params).rowcount
        for row in rows:
            mirror.positions[row["partition"]] = max(mirror.positions.get(row["partition"], 0), row["offset"] + 1)
        self.stats.records += written
        self.stats.batches += 1
        return written

    @staticmethod
    def _mark_producer_highs(conn: psycopg.Connection, mirror: _Mirror, rows: list[dict[str, Any]]) -> None:
        """Set each row's ``batch_high``: the highest producer_seq its producer had written to its
        partition before it (the mirror so far, then this batch in offset order), or None."""
        pairs = sorted({(row["partition"], row["producer_id"]) for row in rows if row["producer_id"] is not None})
        highest: dict[tuple[int, str], int | None] = {}
        if pairs:
            sql = PRODUCER_HIGHS_SQL.format(schema=quoted(mirror.lab.schema))
            for partition, producer_id, high in conn.execute(sql, [[p for p, _ in pairs], [i for _, i in pairs]]):
                highest[(partition, producer_id)] = high
        for row in rows:
            producer = (row["partition"], row["producer_id"])
            row["batch_high"] = highest.get(producer)
            if row["producer_id"] is not None:
                highest[producer] = max(row["producer_seq"], row["batch_high"] if row["batch_high"] is not None
                                        else row["producer_seq"])

    def poll_once(self, timeout: float | None = None) -> int:
        """One batch, read and written on the caller's thread. Returns the records written."""
        written = 0
        for mirror, rows in self._read(timeout):
            if self._mirrors.get(mirror.lab.topic) is not mirror:
                continue  # restarted by an earlier failure of this round: it reads these again
            try:
                done = self._write(self._db(), mirror, rows)
            except psycopg.Error as error:
                self._failed(error)  # nothing of this batch was written: every lab reads again
                continue
            if done is None:
                self._restart(mirror.lab.topic)
            else:
                written += done
        return written

    def _failed(self, error: Exception) -> None:
        self.stats.errors += 1
        self.stats.last_error = str(error)
        log.warning("log reader: %s", error)
        if isinstance(error, psycopg.OperationalError) and self._conn is not None:
            self._conn.close()  # PostgreSQL restarted or the session was ended: reconnect next round
            self._conn = None
        for topic in list(self._mirrors):
            self._restart(topic)
        time.sleep(0.5)

    def positions(self) -> dict[str, dict[int, int]]:
        """Where the mirror of each topic's partitions ends (the next offset it expects)."""
        return {topic: dict(mirror.positions) for topic, mirror in list(self._mirrors.items())}

    # A round of the reading loop lasts at most a poll (0.2 s) or a wait for the writer (0.2 s); a
    # loop that has not turned for this long is stuck, and the process stops beating (__main__.py).
    STUCK_AFTER = 2.0

    def turning(self) -> bool:
        """Whether the reading loop went round lately (its heartbeat's condition)."""
        return time.monotonic() - self._turned_at < self.STUCK_AFTER

    def run(self, stop: threading.Event) -> None:
        """Mirror until ``stop`` is set; then close the clients.

        Two threads, so that decoding a batch overlaps writing the previous one: this one reads
        and decodes (and alone touches the Kafka consumer and the lab list); a writer thread
        inserts, on its own connection, in order. A batch whose write fails marks its lab's
        mirror failed: the writer skips that mirror's later batches (no gap can follow a failed
        batch), and this thread restarts the lab from its table.
        """
        batches: queue.Queue = queue.Queue(maxsize=2)
        failures: queue.SimpleQueue = queue.SimpleQueue()  # (mirror, error or None for a reset)
        writer = threading.Thread(target=self._writer, args=(batches, failures), name="log reader writer",
                                  daemon=True)
        writer.start()
        self._reading_thread = threading.current_thread()
        try:
            while not stop.is_set():
                self._turned_at = time.monotonic()
                try:
                    self._handle_failures(failures)
                    for mirror, rows in self._read(None):
                        while not stop.is_set():
                            self._turned_at = time.monotonic()
                            try:
                                batches.put((mirror, rows), timeout=0.2)
                                break
                            except queue.Full:
                                self._handle_failures(failures)
                except Exception as error:  # noqa: BLE001 - the mirror must outlive any surprise
                    log.exception("log reader: unexpected error; every lab resumes from its table")
                    self.stats.errors += 1
                    self.stats.last_error = repr(error)
                    self._recycle()
                    time.sleep(0.5)
        finally:
            self._reading_thread = None
            batches.put(None)
            writer.join(timeout=30)
            self.close()

    def _handle_failures(self, failures: queue.SimpleQueue) -> None:
        errors = []
        while True:
            try:
                mirror, error = failures.get_nowait()
            except queue.Empty:
                break
            if self._mirrors.get(mirror.lab.topic) is mirror:
                self._restart(mirror.lab.topic)
            if error is not None:
                errors.append(error)
        if errors:
            self._failed(errors[-1])

    def _writer(self, batches: queue.Queue, failures: queue.SimpleQueue) -> None:
        conn: psycopg.Connection | None = None
        try:
            while (item := batches.get()) is not None:
                mirror, rows = item
                if mirror.failed or self._mirrors.get(mirror.lab.topic) is not mirror:
                    continue  # its lab restarts from the table: these records are read again
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    if self._write(conn, mirror, rows) is None:
                        mirror.failed = True
                        failures.put((mirror, None))
                except Exception as error:  # noqa: BLE001 - any failure: this lab reads again
                    mirror.failed = True
                    failures.put((mirror, error))
                    if isinstance(error, psycopg.OperationalError) and conn is not None:
                        conn.close()
                        conn = None
        finally:
            if conn is not None:
                conn.close()

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()  # no group: commits nothing, leaves nothing
            self._consumer = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def wait_mirrored(conn: psycopg.Connection, lab: Lab, positions: Iterable[tuple[int, int]],
                  timeout: float = 5.0, interval: float = 0.02) -> bool:
    """Wait until the reader has mirrored every ``(partition, offset)`` of ``lab``: for a caller
    that just produced them (publish) and wants its next read of the lab to include them.
    Returns False after ``timeout`` seconds (the reader is behind or stopped): never raises for it."""
    wanted = sorted({(int(p), int(o)) for p, o in positions if p is not None and o is not None})
    if not wanted:
        return True
    sql = (f"SELECT count(*) FROM {quoted(lab.schema)}.log_records "
           'WHERE (partition, "offset") IN (SELECT * FROM unnest(%s::int[], %s::bigint[]))')
    params = [[p for p, _ in wanted], [o for _, o in wanted]]
    try:
        return wait_until(lambda: conn.execute(sql, params).fetchone()[0] >= len(wanted), timeout=timeout,
                          message="", interval=interval)
    except WaitTimeout:
        return False
