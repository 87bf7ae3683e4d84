"""The lost-ack fault proxy: a Kafka-aware TCP proxy between Kafka clients and the broker.
May import store and domain (its control rows and migrations); ops imports its constants.

``python -m webapp.faultproxy --listen 127.0.0.1:P --upstream host:port``, its own process
(never inside gunicorn). It forwards every byte unchanged in both directions and reads only
frame headers: the 4-byte length, then api_key, api_version and correlation_id of each
request; responses are matched to their request by correlation id, per connection.

Faults on Produce responses (api_key 0):
- drop the next N: the Produce request reaches the broker (which writes the records), and
  when its response comes back the proxy holds back every answer on that connection for
  ``DROP_HOLD_SECONDS`` (the client's later requests still reach the broker), then closes it.
  librdkafka sees lost acknowledgements and retries every request in flight; the log holds those
  records twice, the first behind later ones, unless ``enable.idempotence`` lets the broker
  recognise the retries.
- delay by T ms: hold each Produce response for T ms before returning it.
One fault on OffsetCommit requests (api_key 8), per Kafka client id, for a while: the proxy
closes a connection of that client that carries an OffsetCommit, without forwarding the request
(the path to the group coordinator is broken, as a network fault would break it). The broker
never sees the commit; fetches, on the client's other connection, flow. Commit mode's lesson:
a synchronous commit says so and the consumer waits; an asynchronous one has already returned.
Disarmed, it is a plain pass-through.

Control goes through PostgreSQL so it works across containers: the lab writes a row in
``lab_control.fault_proxies`` (operations.arm_fault_proxy) and NOTIFYs; the proxy LISTENs (and
polls, in case a notification is missed), acknowledges each setting by its version, reports
counters with a heartbeat, and writes every injected fault to the timeline of the lab that
armed it.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import logging
import os
import signal
import socket
import struct
import sys
import time
from dataclasses import dataclass
from typing import Callable

import psycopg
from psycopg.types.json import Jsonb

from ..store import timeline
from ..store.connection import CONTROL_SCHEMA, psycopg_conninfo
from ..domain.lab import InvalidLabName, Lab
from ..domain.vocabulary import FAULT_PROXY_CHANNEL
from ..store.schema import enter_psycopg

log = logging.getLogger("idempotency_lab.faultproxy")

PRODUCE = 0
OFFSET_COMMIT = 8
DEFAULT_NAME = "default"
CHANNEL = FAULT_PROXY_CHANNEL
TABLE = f"{CONTROL_SCHEMA}.fault_proxies"
# A frame bigger than this is not Kafka (the broker's default socket.request.max.bytes is 100 MiB).
MAX_FRAME_BYTES = 256 * 1024 * 1024
HEARTBEAT_EVERY = 1.0
# After a dropped Produce response, how long the connection stays open with its answers held
# back. Closing at once made the lesson depend on the machine's pace: on a busy machine a burst's
# first request was often alone in flight when its answer was lost, so its retry landed before
# the burst's later records and nothing came out of order (one guided run in a full test suite).
# Held, what the producer sends meanwhile (up to its max.in.flight) is written first.
DROP_HOLD_SECONDS = 0.5
POLL_EVERY = 0.5

LENGTH = struct.Struct(">i")
REQUEST_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id
CLIENT_ID_LENGTH = struct.Struct(">h")
CORRELATION_ID = struct.Struct(">i")


class ProtocolError(Exception):
    """Bytes that cannot be a Kafka frame: the connection is closed rather than guessed at."""


@dataclass(frozen=True)
class RequestHeader:
    """The fixed start of a request frame (request header v1 and v2 alike)."""
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


def parse_request_header(frame: bytes) -> RequestHeader:
    """Read api_key, api_version, correlation_id and client_id from a request frame's body.

    client_id is a plain nullable string (int16 length) in every header version that has one,
    flexible versions included: their tagged fields come after it.
    """
    if len(frame) < REQUEST_HEADER.size:
        raise ProtocolError(f"a request of {len(frame)} bytes has no header")
    api_key, api_version, correlation_id = REQUEST_HEADER.unpack_from(frame)
    client_id = None
    start = REQUEST_HEADER.size
    if len(frame) >= start + CLIENT_ID_LENGTH.size:
        (length,) = CLIENT_ID_LENGTH.unpack_from(frame, start)
        if 0 <= length <= len(frame) - start - CLIENT_ID_LENGTH.size:
            client_id = frame[start + CLIENT_ID_LENGTH.size:start + CLIENT_ID_LENGTH.size + length].decode(
                "utf-8", errors="replace")
    return RequestHeader(api_key, api_version, correlation_id, client_id)


def parse_response_correlation_id(frame: bytes) -> int:
    """Every response header (v0 and v1) starts with the correlation id."""
    if len(frame) < CORRELATION_ID.size:
        raise ProtocolError(f"a response of {len(frame)} bytes has no correlation id")
    return CORRELATION_ID.unpack_from(frame)[0]


async def read_frame(reader: asyncio.StreamReader) -> tuple[bytes, bytes] | None:
    """One frame as (length prefix, body), or None at a clean end of stream."""
    try:
        prefix = await reader.readexactly(LENGTH.size)
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise ProtocolError("the stream ended inside a frame's length") from None
        return None
    (length,) = LENGTH.unpack(prefix)
    if not 0 <= length <= MAX_FRAME_BYTES:
        raise ProtocolError(f"frame length {length} is not Kafka")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError("the stream ended inside a frame") from None
    return prefix, body


# --- faults ----------------------------------------------------------------------------------

class Faults:
    """What the proxy does to Produce responses, kept in memory.

    The proxy asks it once per Produce response. The PostgreSQL-backed subclass makes the same
    decisions from the lab's control row.
    """

    def __init__(self) -> None:
        self.drop_produce_responses = 0
        self.delay_ms = 0
        self.produce_requests = 0
        self.responses_dropped = 0
        self.responses_delayed = 0
        self.connections = 0  # client connections open now
        self.connections_cut = 0
        # Kafka client ids whose OffsetCommit requests never reach the broker; how many were stopped.
        self.blocked_commit_clients: frozenset[str] = frozenset()
        self.commits_blocked = 0
        # Chaos (issue 15): set by the proxy, closes the connections of the given client ids; the count.
        self.cut_clients: Callable[[list[str]], int] | None = None
        # Set by the proxy: the client ids of the connections it carries now.
        self.connected_clients: Callable[[], set[str]] = set

    def arm(self, drop_produce_responses: int = 0, delay_ms: int = 0) -> None:
        self.drop_produce_responses = drop_produce_responses
        self.delay_ms = delay_ms

    @property
    def armed(self) -> bool:
        return self.drop_produce_responses > 0 or self.delay_ms > 0

    def saw_produce_request(self, request: RequestHeader) -> None:
        self.produce_requests += 1

    async def take_drop(self, request: RequestHeader) -> bool:
        """True when this Produce response must be dropped (and one drop is used up)."""
        if self.drop_produce_responses <= 0:
            return False
        self.drop_produce_responses -= 1
        self.responses_dropped += 1
        return True

    def delay_for(self, request: RequestHeader) -> float:
        """Seconds to hold this Produce response; counts it as delayed when above zero."""
        if self.delay_ms <= 0:
            return 0.0
        self.responses_delayed += 1
        return self.delay_ms / 1000

    async def dropped(self, request: RequestHeader, peer: str) -> None:
        """Called for a dropped response, just before the client's connection is closed."""
        log.info("dropped the response to Produce v%s correlation id %s from %s (%s)",
                 request.api_version, request.correlation_id, request.client_id, peer)

    def blocks_commit(self, request: RequestHeader) -> bool:
        """True when this OffsetCommit request must not reach the broker (and counts it)."""
        if request.client_id not in self.blocked_commit_clients:
            return False
        self.commits_blocked += 1
        return True

    async def commit_blocked(self, request: RequestHeader, peer: str) -> None:
        """Called for a blocked OffsetCommit, just before the client's connection is closed."""
        log.info("blocked OffsetCommit v%s correlation id %s from %s (%s)",
                 request.api_version, request.correlation_id, request.client_id, peer)


class ControlledFaults(Faults):
    """Faults armed through ``lab_control.fault_proxies``, reported back there and to the timeline."""

    def __init__(self, database_url: str, name: str, listen: str, upstream: str):
        super().__init__()
        self.conninfo = psycopg_conninfo(database_url)
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.lab: str | None = None
        self.seen_version = 0
        self.seen_cut_version = 0
        self._control: psycopg.AsyncConnection | None = None
        self._faults: psycopg.AsyncConnection | None = None
        # Drop claims and timeline writes share one connection; one transaction at a time.
        self._faults_lock = asyncio.Lock()
        self._delayed_unreported = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Register this proxy, disarmed, and start following its control row."""
        self._control = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        self._faults = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        # A proxy starts disarmed: a fault armed for a previous run must not fire on a fresh one.
        await self._control.execute(
            f"INSERT INTO {TABLE} (name, listen, upstream, host, pid, started_at, heartbeat_at) "
            "VALUES (%(name)s, %(listen)s, %(upstream)s, %(host)s, %(pid)s, now(), now()) "
            "ON CONFLICT (name) DO UPDATE SET listen = EXCLUDED.listen, upstream = EXCLUDED.upstream, "
            "host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = now(), heartbeat_at = now(), "
            "drop_produce_responses = 0, delay_ms = 0, seen_version = fault_proxies.version, connections = 0, "
            "seen_cut_version = fault_proxies.cut_version, connections_cut = 0, "
            "produce_requests = 0, responses_dropped = 0, responses_delayed = 0, "
            "blocked_commits = '{}', commits_blocked = 0, blocked_seen = '[]'",
            {"name": self.name, "listen": self.listen, "upstream": self.upstream,
             "host": socket.gethostname(), "pid": os.getpid()})
        await self._control.execute(f"LISTEN {CHANNEL}")
        await self.refresh()
        self._task = asyncio.create_task(self._follow(), name="fault-proxy-control")

    async def refresh(self) -> None:
        """Read the control row; acknowledge a new setting by its version."""
        row = await (await self._control.execute(
            f"SELECT lab, drop_produce_responses, delay_ms, version, cut_version, cut_client_ids, seen_cut_version, "
            # a block ends at its time on the database's clock, the same clock that set it
            "ARRAY(SELECT key FROM jsonb_each_text(blocked_commits) WHERE value::float8 > extract(epoch FROM now())) "
            f"FROM {TABLE} WHERE name = %s", [self.name])).fetchone()
        if row is None:
            return
        lab, drop, delay, version, cut_version, cut_client_ids, seen_cut_version, blocked = row
        self.blocked_commit_clients = frozenset(blocked)
        if not self.seen_cut_version:
            self.seen_cut_version = seen_cut_version  # a cut asked for before this proxy started is not ours
        if cut_version != self.seen_cut_version:
            await self._cut(cut_version, list(cut_client_ids or []))
        self.lab, self.drop_produce_responses, self.delay_ms = lab, drop, delay
        if version != self.seen_version:
            self.seen_version = version
            # Which blocked clients pass through here: one that goes straight to the broker cannot be blocked.
            seen = sorted(self.blocked_commit_clients & self.connected_clients())
            await self._control.execute(f"UPDATE {TABLE} SET seen_version = %s, blocked_seen = %s WHERE name = %s",
                                        [version, Jsonb(seen), self.name])
            log.info("armed by lab %s: drop the next %s Produce response(s), delay %s ms; block the offset "
                     "commits of %s", lab, drop, delay, ", ".join(sorted(blocked)) or "no client")

    async def _cut(self, cut_version: int, client_ids: list[str]) -> None:
        """Close every client connection of ``client_ids`` (chaos: a broken network path), once per version."""
        count = self.cut_clients(client_ids) if self.cut_clients is not None else 0
        self.seen_cut_version = cut_version
        self.connections_cut += count
        await self._control.execute(
            f"UPDATE {TABLE} SET seen_cut_version = %s, connections_cut = connections_cut + %s WHERE name = %s",
            [cut_version, count, self.name])
        log.info("cut %s connection(s) of %s", count, ", ".join(client_ids))

    async def _follow(self) -> None:
        last_heartbeat = 0.0
        while True:
            try:
                # A notification wakes us at once; the timeout is the poll, in case one was missed.
                async for _ in self._control.notifies(timeout=POLL_EVERY, stop_after=1):
                    pass
                await self.refresh()
                if time.monotonic() - last_heartbeat >= HEARTBEAT_EVERY:
                    last_heartbeat = time.monotonic()
                    await self._heartbeat()
                    await self._report_delays()
            except psycopg.Error as error:
                # The database may restart under us: keep forwarding traffic, reconnect and carry on.
                log.warning("control connection: %s; reconnecting", error)
                await asyncio.sleep(1)
                await self._reconnect_control()

    async def _reconnect_control(self) -> None:
        try:
            await self._control.close()
            self._control = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
            await self._control.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as error:
            log.warning("still no database: %s", error)

    async def _heartbeat(self) -> None:
        await self._control.execute(
            f"UPDATE {TABLE} SET heartbeat_at = now(), connections = %s, produce_requests = %s, "
            "responses_delayed = %s, commits_blocked = %s WHERE name = %s",
            [self.connections, self.produce_requests, self.responses_delayed, self.commits_blocked, self.name])

    async def _report_delays(self) -> None:
        """One timeline entry per second for delayed responses, not one per response."""
        if not self._delayed_unreported:
            return
        count, self._delayed_unreported = self._delayed_unreported, 0
        await self._record(f"fault proxy delayed {count} Produce response(s) by {self.delay_ms} ms",
                           responses=count, delay_ms=self.delay_ms)

    def delay_for(self, request: RequestHeader) -> float:
        seconds = super().delay_for(request)
        if seconds:
            self._delayed_unreported += 1
        return seconds

    async def take_drop(self, request: RequestHeader) -> bool:
        if self.drop_produce_responses <= 0:
            return False  # the common, disarmed case never touches the database
        try:
            async with self._faults_lock:
                # The row is the truth: exactly N drops however many connections race for them.
                row = await (await self._faults.execute(
                    f"UPDATE {TABLE} SET drop_produce_responses = drop_produce_responses - 1, "
                    "responses_dropped = responses_dropped + 1 "
                    "WHERE name = %s AND drop_produce_responses > 0 RETURNING lab, drop_produce_responses",
                    [self.name])).fetchone()
        except psycopg.Error as error:
            # Without the database no drop can be accounted for: pass the response on.
            log.warning("cannot claim a drop: %s", error)
            await self._reconnect_faults()
            return False
        if row is None:
            self.drop_produce_responses = 0
            return False
        self.lab, self.drop_produce_responses = row
        self.responses_dropped += 1
        return True

    async def dropped(self, request: RequestHeader, peer: str) -> None:
        await super().dropped(request, peer)
        left = self.drop_produce_responses
        await self._record(
            f"fault proxy dropped the response to a Produce request (correlation id {request.correlation_id}) "
            f"and closed the producer's connection: the broker wrote the record, the producer never heard; "
            f"librdkafka will retry ({left} more to drop)",
            correlation_id=request.correlation_id, api_version=request.api_version,
            client_id=request.client_id, drops_left=left)

    async def commit_blocked(self, request: RequestHeader, peer: str) -> None:
        await super().commit_blocked(request, peer)
        await self._record(
            f"fault proxy closed {request.client_id}'s connection carrying an OffsetCommit (correlation id "
            f"{request.correlation_id}): the broker never saw the commit, the group's committed offset did not move",
            correlation_id=request.correlation_id, client_id=request.client_id)

    async def _record(self, summary: str, **detail) -> None:
        """Append a 'fault' entry to the timeline of the lab that armed the proxy."""
        if not self.lab:
            return
        try:
            schema = Lab(self.lab).schema
        except InvalidLabName:
            return
        statements: list[tuple[str, dict]] = []
        timeline.record(lambda sql, params: statements.append((sql, params)), "fault", summary,
                        proxy=self.name, **detail)
        try:
            async with self._faults_lock:
                async with self._faults.transaction():
                    await enter_psycopg(self._faults, schema)
                    for sql, params in statements:
                        await self._faults.execute(sql, params)
        except psycopg.Error as error:
            # The lab may have been reset meanwhile; the fault happened all the same.
            log.warning("could not write to lab %s's timeline: %s", self.lab, error)
            if self._faults.broken:
                await self._reconnect_faults()

    async def _reconnect_faults(self) -> None:
        try:
            await self._faults.close()
            self._faults = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        except psycopg.Error as error:
            log.warning("still no database: %s", error)

    async def close(self) -> None:
        """Report the proxy gone, so arming it fails fast instead of waiting for a heartbeat."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        try:
            await self._report_delays()
            await self._faults.execute(
                f"UPDATE {TABLE} SET heartbeat_at = NULL, pid = NULL, connections = 0 WHERE name = %s AND pid = %s",
                [self.name, os.getpid()])
        except psycopg.Error as error:
            log.warning("could not report the proxy stopped: %s", error)
        for conn in (self._control, self._faults):
            if conn is not None:
                await conn.close()


# --- the proxy -------------------------------------------------------------------------------

# Told of every frame: ("request", its header, correlation id) or ("response", the request it
# answers or None, correlation id). For tests and tracing; it must not block.
FrameObserver = Callable[[str, "RequestHeader | None", int], None]


class FaultProxy:
    """Accepts Kafka clients on ``listen`` and connects each one to the broker at ``upstream``."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], faults: Faults | None = None,
                 observer: FrameObserver | None = None):
        self.listen = listen
        self.upstream = upstream
        self.faults = faults or Faults()
        self.observer = observer
        self.server: asyncio.Server | None = None
        self.clients: dict[asyncio.Task, asyncio.StreamWriter] = {}  # serving task -> client's writer
        self.client_ids: dict[asyncio.Task, str] = {}  # serving task -> the client id its requests carry
        self.faults.cut_clients = self.cut
        self.faults.connected_clients = lambda: set(self.client_ids.values())

    def cut(self, client_ids: list[str]) -> int:
        """Abort the connections whose requests carry one of ``client_ids``; how many."""
        doomed = [writer for task, writer in self.clients.items() if self.client_ids.get(task) in client_ids]
        for writer in doomed:
            writer.transport.abort()
        return len(doomed)

    async def start(self) -> "FaultProxy":
        self.server = await asyncio.start_server(self._serve_client, *self.listen)
        return self

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
        # Aborting the clients' sockets ends their pumps the way a peer's disconnect would.
        for writer in list(self.clients.values()):
            writer.transport.abort()
        await asyncio.gather(*self.clients, return_exceptions=True)

    async def _serve_client(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self.clients[task] = client_writer
        self.faults.connections += 1
        peer = "%s:%s" % client_writer.get_extra_info("peername")[:2]
        upstream_writer = None
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            except OSError as error:
                log.warning("cannot reach the broker at %s:%s for %s: %s", *self.upstream, peer, error)
                return
            # Requests in flight on this connection, oldest first: Kafka answers them in order.
            in_flight: collections.deque[RequestHeader] = collections.deque()
            requests = asyncio.create_task(self._forward_requests(client_reader, upstream_writer, in_flight, task,
                                                                   peer))
            responses = asyncio.create_task(
                self._forward_responses(upstream_reader, client_writer, in_flight, peer))
            try:
                done, _ = await asyncio.wait({requests, responses}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in (requests, responses):
                    pump.cancel()
                await asyncio.gather(requests, responses, return_exceptions=True)
            for pump in done:
                if not pump.cancelled() and isinstance(pump.exception(), ProtocolError):
                    log.warning("closing %s: %s", peer, pump.exception())
        finally:
            for writer in (client_writer, upstream_writer):
                if writer is not None:
                    writer.close()
                    try:
                        await writer.wait_closed()
                    except OSError:
                        pass  # the other side may already have reset the connection
            self.faults.connections -= 1
            self.clients.pop(task, None)
            self.client_ids.pop(task, None)

    async def _forward_requests(self, client: asyncio.StreamReader, broker: asyncio.StreamWriter,
                                in_flight: collections.deque, owner: asyncio.Task | None = None,
                                peer: str = "") -> None:
        while (frame := await read_frame(client)) is not None:
            prefix, body = frame
            request = parse_request_header(body)
            if owner is not None and request.client_id:
                self.client_ids[owner] = request.client_id
            if request.api_key == OFFSET_COMMIT and self.faults.blocks_commit(request):
                # The request never leaves: the client's connection is closed under it, as a broken
                # path would close it. librdkafka fails or retries the commit; the broker saw nothing.
                await asyncio.shield(self.faults.commit_blocked(request, peer))
                return  # which ends this connection (_serve_client closes both sides)
            # Remembered before the bytes leave, so the response can never overtake it.
            in_flight.append(request)
            if request.api_key == PRODUCE:
                self.faults.saw_produce_request(request)
            if self.observer is not None:
                self.observer("request", request, request.correlation_id)
            broker.write(prefix)
            broker.write(body)
            await broker.drain()

    async def _forward_responses(self, broker: asyncio.StreamReader, client: asyncio.StreamWriter,
                                 in_flight: collections.deque, peer: str) -> None:
        while (frame := await read_frame(broker)) is not None:
            prefix, body = frame
            correlation_id = parse_response_correlation_id(body)
            request = self._answered_request(in_flight, correlation_id)
            if self.observer is not None:
                self.observer("response", request, correlation_id)
            if request is not None and request.api_key == PRODUCE:
                # Shielded: a client hanging up mid-way must not cut a database round trip in half.
                if await asyncio.shield(self.faults.take_drop(request)):
                    await asyncio.shield(self.faults.dropped(request, peer))
                    # No answer returns on this connection from now on, while the requests pump
                    # keeps forwarding what the client sends; then the connection ends (returning
                    # ends it): the client never gets these acknowledgements.
                    await asyncio.sleep(DROP_HOLD_SECONDS)
                    client.transport.abort()
                    return
                delay = self.faults.delay_for(request)
                if delay:
                    await asyncio.sleep(delay)
            client.write(prefix)
            client.write(body)
            await client.drain()

    @staticmethod
    def _answered_request(in_flight: collections.deque, correlation_id: int) -> RequestHeader | None:
        """Pop the request this response answers; older unanswered ones (acks=0 Produce) go too."""
        while in_flight:
            request = in_flight.popleft()
            if request.correlation_id == correlation_id:
                return request
        return None


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected host:port, got {value!r}")
    return host.strip("[]"), int(port)


async def serve(args: argparse.Namespace) -> None:
    listen, upstream = args.listen, args.upstream
    listen_text, upstream_text = f"{listen[0]}:{listen[1]}", f"{upstream[0]}:{upstream[1]}"
    if args.database_url:
        faults: Faults = ControlledFaults(args.database_url, args.name, listen_text, upstream_text)
        await faults.start()
    else:
        log.warning("no DATABASE_URL: a plain pass-through that nothing can arm")
        faults = Faults()
    proxy = await FaultProxy(listen, upstream, faults).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"fault proxy {args.name} listening on {listen_text}, forwarding to {upstream_text}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.close()
        if isinstance(faults, ControlledFaults):
            await faults.close()


def ensure_control_table(database_url: str) -> None:
    """Bring the control schema (this table included) to head when the proxy starts before the agent."""
    from ..store.migrations import upgrade

    upgrade(database_url)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.faultproxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="host:port clients connect to")
    parser.add_argument("--upstream", type=_address, required=True, help="host:port of the broker's listener")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"),
                        help="PostgreSQL for the control row (default: DATABASE_URL)")
    parser.add_argument("--name", default=DEFAULT_NAME, help="the control row's name")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s faultproxy[{os.getpid()}] %(levelname)s %(message)s")
    if args.database_url:
        ensure_control_table(args.database_url)
    asyncio.run(serve(args))
    return 0

