"""The lost-ack fault proxy: a Kafka-aware TCP proxy between Kafka clients and the broker.

FaultProxy (asyncio) accepts Kafka clients and connects each one to the broker. It forwards every
byte unchanged in both directions and reads only frame headers (protocol.py); responses are matched
to their request by correlation id, per connection, and the faults (faults.py, control.py) decide
what happens to each Produce response and OffsetCommit request. serve() and main() run it as its own
process: ``python -m webapp.faultproxy --listen 127.0.0.1:P --upstream host:port
[--learner-listen host:port [--learner-advertise host:port]]``; the learner listener is the
learners' gateway (gateway.py).
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import signal
from typing import Callable

from ..settings import database_url
from .control import DEFAULT_NAME, ControlledFaults, ensure_control_table
from .faults import DROP_HOLD_SECONDS, Faults
from .gateway import Authenticate, LearnerSession
from .principals import DatabasePrincipals
from .protocol import (
    OFFSET_COMMIT,
    PRODUCE,
    ProtocolError,
    RequestHeader,
    parse_request_header,
    parse_response_correlation_id,
    read_frame,
)

log = logging.getLogger("idempotency_lab.faultproxy")

# Told of every frame: ("request", its header, correlation id) or ("response", the request it
# answers or None, correlation id). For tests and tracing; it must not block.
FrameObserver = Callable[[str, "RequestHeader | None", int], None]


class FaultProxy:
    """Accepts Kafka clients on ``listen`` and connects each one to the broker at ``upstream``."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], faults: Faults | None = None,
                 observer: FrameObserver | None = None, learner_listen: tuple[str, int] | None = None,
                 learner_advertised: tuple[str, int] | None = None, authenticate: Authenticate | None = None):
        """``learner_listen``: a second listener, the learners' gateway (gateway.py), whose clients
        authenticate with ``authenticate`` and are advertised ``learner_advertised`` (default: the
        address it listens on) as the broker's address."""
        if learner_listen is not None and authenticate is None:
            raise ValueError("the learners' listener needs a way to authenticate them")
        self.listen = listen
        self.upstream = upstream
        self.faults = faults or Faults()
        self.observer = observer
        self.learner_listen = learner_listen
        self._learner_advertised = learner_advertised
        self.authenticate = authenticate
        self.server: asyncio.Server | None = None
        self.learner_server: asyncio.Server | None = None
        self.clients: dict[asyncio.Task, asyncio.StreamWriter] = {}  # serving task -> client's writer
        self.client_ids: dict[asyncio.Task, str] = {}  # serving task -> the client id its requests carry
        self.faults.cut_clients = self.cut
        self.faults.connected_clients = lambda: list(self.client_ids.values())

    def cut(self, client_ids: list[str]) -> int:
        """Abort the connections whose requests carry one of ``client_ids``; how many."""
        doomed = [writer for task, writer in self.clients.items() if self.client_ids.get(task) in client_ids]
        for writer in doomed:
            writer.transport.abort()
        return len(doomed)

    async def start(self) -> "FaultProxy":
        self.server = await asyncio.start_server(self._serve_client, *self.listen)
        if self.learner_listen is not None:
            self.learner_server = await asyncio.start_server(self._serve_learner, *self.learner_listen)
        return self

    @property
    def port(self) -> int:
        return self.server.sockets[0].getsockname()[1]

    @property
    def learner_port(self) -> int:
        return self.learner_server.sockets[0].getsockname()[1]

    @property
    def learner_advertised(self) -> tuple[str, int]:
        """The address the learners' listener gives its clients as the broker's."""
        return self._learner_advertised or (self.learner_listen[0], self.learner_port)

    async def close(self) -> None:
        for server in (self.server, self.learner_server):
            if server is not None:
                server.close()
                await server.wait_closed()
        # Aborting the clients' sockets ends their pumps the way a peer's disconnect would.
        for writer in list(self.clients.values()):
            writer.transport.abort()
        await asyncio.gather(*self.clients, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def _bridged(self, client_writer: asyncio.StreamWriter, who: str):
        """A client's connection, counted and cut-able, with a connection of its own to the broker:
        yields (broker reader, broker writer, this task, the client's address), or None when the
        broker cannot be reached; both connections are closed and the client forgotten on the way out."""
        task = asyncio.current_task()
        self.clients[task] = client_writer
        self.faults.connections += 1
        peer = "%s:%s" % client_writer.get_extra_info("peername")[:2]
        upstream_writer = None
        try:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            except OSError as error:
                log.warning("cannot reach the broker at %s:%s for %s%s: %s", *self.upstream, who, peer, error)
                yield None
                return
            yield upstream_reader, upstream_writer, task, peer
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

    async def _serve_client(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        async with self._bridged(client_writer, "") as bridge:
            if bridge is None:
                return
            upstream_reader, upstream_writer, task, peer = bridge
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

    async def _serve_learner(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        """A learner's connection: the gateway's session (authentication, authorization) over its
        own connection to the broker; cut, like the lab's, by the Kafka client id it sends."""
        async with self._bridged(client_writer, "learner ") as bridge:
            if bridge is None:
                return
            upstream_reader, upstream_writer, task, peer = bridge

            def on_client_id(client_id: str) -> None:
                self.client_ids[task] = client_id
            await LearnerSession(self.authenticate, self.learner_advertised, self.faults,
                                 (client_reader, client_writer), (upstream_reader, upstream_writer),
                                 on_client_id, peer).run()

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
    principals = DatabasePrincipals(args.database_url) if args.learner_listen else None
    proxy = await FaultProxy(listen, upstream, faults, learner_listen=args.learner_listen,
                             learner_advertised=args.learner_advertise,
                             authenticate=principals.authenticate if principals else None).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"fault proxy {args.name} listening on {listen_text}, forwarding to {upstream_text}", flush=True)
    if proxy.learner_server is not None:
        host, port = proxy.learner_advertised
        print(f"learners' gateway listening on {args.learner_listen[0]}:{proxy.learner_port} (SASL/PLAIN), "
              f"advertised as {host}:{port}", flush=True)
    try:
        await stop.wait()
    finally:
        await proxy.close()
        if principals is not None:
            principals.close()
        if isinstance(faults, ControlledFaults):
            await faults.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m webapp.faultproxy", description=__doc__.split("\n")[0])
    parser.add_argument("--listen", type=_address, required=True, help="host:port clients connect to")
    parser.add_argument("--upstream", type=_address, required=True, help="host:port of the broker's listener")
    parser.add_argument("--database-url", default=database_url(),
                        help="PostgreSQL for the control row (default: DATABASE_URL, with DATABASE_PASSWORD_FILE's "
                             "password)")
    parser.add_argument("--name", default=DEFAULT_NAME, help="the control row's name")
    parser.add_argument("--learner-listen", type=_address, default=None,
                        help="host:port of the learners' gateway: SASL/PLAIN with a lane's Kafka credentials, "
                             "each request authorized against the lane's topic and group (unset: no such listener)")
    parser.add_argument("--learner-advertise", type=_address, default=None,
                        help="host:port the learners' gateway gives its clients as the broker's address "
                             "(default: --learner-listen's)")
    args = parser.parse_args(argv)
    if args.learner_listen and not args.database_url:
        parser.error("--learner-listen needs a database: the lanes' Kafka credentials are kept there")
    if args.learner_listen and not args.learner_advertise and args.learner_listen[0] in ("0.0.0.0", "::", ""):
        parser.error("--learner-listen binds every address: say with --learner-advertise which one clients reach")
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s faultproxy[{os.getpid()}] %(levelname)s %(message)s")
    if args.database_url:
        ensure_control_table(args.database_url)
    asyncio.run(serve(args))
    return 0
