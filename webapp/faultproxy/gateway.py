"""The learners' gateway: the fault proxy's second listener, the one a learner's own code reaches.

The embedded broker (Tansu) has no ACLs, so this listener is where a lane's Kafka credentials are
checked and its rights enforced, as Apache Kafka's SASL listener and its authorizer would:

- Every connection authenticates with SASL/PLAIN (SaslHandshake v0/v1, then SaslAuthenticate
  v0..v2, or a raw token after a v0 handshake) against the lane's principal in PostgreSQL. Before
  that only ApiVersions and the SASL requests pass; a failed authentication is answered
  SASL_AUTHENTICATION_FAILED (58) and the connection closes.
- After it, each request is authorized against the principal's grant: read (Fetch, ListOffsets,
  Metadata) of its lab's topic only, and its consumer group (the lane's group id, or that id
  followed by ``.r<digits>``, the lab's moves to a fresh id) for FindCoordinator, JoinGroup,
  SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, DescribeGroups. Everything else is
  answered by the gateway itself with Kafka's authorization error codes (29 topic, 30 group, 31
  cluster, 53 transactional id) in a well-formed response of the request's version; Metadata and
  ListGroups answers are filtered to what the principal may see.
- Broker addresses in answers (Metadata's brokers, FindCoordinator's host and port) are rewritten
  to this listener's advertised address, so the client never goes round the gateway.
- ApiVersions answers list only the APIs the gateway knows, capped at the newest version it parses
  (messages.API), plus the SASL APIs it answers itself: a client that follows them sends nothing
  the gateway cannot read. A request of another API or version closes the connection, as a broker
  does with a request it cannot parse.

Requests are answered in order (Kafka's rule on one connection): an answer the gateway makes
waits behind the broker's answers to earlier requests.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ..domain.lab import Lab
from .messages import (
    API,
    API_VERSIONS,
    CLUSTER_AUTHORIZATION_FAILED,
    CREATE_PARTITIONS,
    CREATE_TOPICS,
    DELETE_GROUPS,
    DELETE_RECORDS,
    DELETE_TOPICS,
    DESCRIBE_GROUPS,
    FETCH,
    FIND_COORDINATOR,
    GATEWAY_OWN_APIS,
    GROUP_AUTHORIZATION_FAILED,
    HEARTBEAT,
    ILLEGAL_SASL_STATE,
    INIT_PRODUCER_ID,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    LIST_OFFSETS,
    METADATA,
    NO_AUTHORIZED_OPERATIONS,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    PRODUCE,
    SASL_AUTHENTICATE,
    SASL_AUTHENTICATION_FAILED,
    SASL_HANDSHAKE,
    SYNC_GROUP,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    UNKNOWN_TOPIC_OR_PARTITION,
    UNSUPPORTED_SASL_MECHANISM,
)
from .protocol import LENGTH, MAX_FRAME_BYTES, ProtocolError, RequestHeader, parse_request_header, read_frame
from .wire import INT16, INT32, INT64, Reader, Writer, decode, encode

log = logging.getLogger("idempotency_lab.faultproxy")

MECHANISM = "PLAIN"
# Kafka's own messages for these errors (org.apache.kafka.common.protocol.Errors).
AUTHENTICATION_FAILED_MESSAGE = "Authentication failed: Invalid username or password"
TOPIC_AUTHORIZATION_FAILED_MESSAGE = "Topic authorization failed."
# Kafka holds a failed authentication's answer this long (connection.failed.authentication.delay.ms
# is 100 ms by default): a guesser gets fewer tries a second per connection.
FAILED_AUTHENTICATION_DELAY = 0.1
# Before authentication a frame is an ApiVersions or SASL request, a few hundred bytes: Kafka
# caps it at 512 KiB (sasl.server.max.receive.size), and so does the gateway.
MAX_UNAUTHENTICATED_FRAME_BYTES = 512 * 1024
MAX_QUEUED_ANSWERS = 64
# After the gateway decides to close, how long the answers already queued may take to leave.
FLUSH_BEFORE_CLOSE_SECONDS = 5.0


@dataclass(frozen=True)
class Grant:
    """What an authenticated principal may do: read its lab's topic, use its lane's consumer group."""
    username: str
    lab: str
    topic: str
    group_id: str

    def may_read(self, topic: str) -> bool:
        return topic == self.topic

    def may_use_group(self, group: str) -> bool:
        """The lane's group id, or that id after one of the lab's moves to a fresh id (``<id>.r<n>``)."""
        return group == self.group_id or re.fullmatch(re.escape(self.group_id) + r"\.r[0-9]+", group) is not None


# username, password -> the principal's grant, or None when they do not authenticate.
Authenticate = Callable[[str, str], Awaitable["Grant | None"]]


def plain_credentials(token: bytes) -> tuple[str, str] | None:
    """(username, password) of a SASL/PLAIN message (RFC 4616: authzid NUL authcid NUL passwd); None
    when it is not one, or names an authorization id other than the username (Kafka refuses that)."""
    parts = token.split(b"\x00")
    if len(parts) != 3:
        return None
    try:
        authzid, username, password = (part.decode("utf-8") for part in parts)
    except UnicodeDecodeError:
        return None
    if not username or (authzid and authzid != username):
        return None
    return username, password


class _Slot:
    """One answer owed to the client, in request order: the broker's (``transform``ed, or as it
    comes), the gateway's own bytes, or the end of the connection."""
    __slots__ = ("kind", "header", "body", "transform")

    def __init__(self, kind: str, header: RequestHeader | None = None, body: bytes = b"",
                 transform: Callable[[bytes], bytes] | None = None):
        self.kind, self.header, self.body, self.transform = kind, header, body, transform


CLOSE = _Slot("close")


def body_start(frame: bytes, header: RequestHeader, flexible: bool) -> int:
    """Where a request's body begins: after the header's client id, and its tagged fields in a
    flexible version (request header v2)."""
    reader = Reader(frame, INT16.size * 2 + INT32.size)
    reader.string(nullable=True)
    if flexible:
        reader.skip_tagged_fields()
    return reader.offset


def response(header: RequestHeader, schema: tuple, value: dict) -> bytes:
    """A response body (header v0: the correlation id) in the request's version."""
    return INT32.pack(header.correlation_id) + encode(schema, header.api_version, value)


class LearnerSession:
    """One learner's connection through the gateway: authenticate, then authorize every request."""

    def __init__(self, authenticate: Authenticate, advertised: tuple[str, int], faults: Any,
                 client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 broker: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                 on_client_id: Callable[[str], None], peer: str):
        self.authenticate = authenticate
        self.advertised = advertised
        self.faults = faults
        self.client_reader, self.client_writer = client
        self.broker_reader, self.broker_writer = broker
        self.on_client_id = on_client_id
        self.peer = peer
        self.grant: Grant | None = None
        self.handshake_version: int | None = None
        self.raw_token_expected = False  # after a SaslHandshake v0 the token comes bare, not in a request
        # Bounded: a client that sends refused requests and never reads the answers stops being read.
        self.answers: asyncio.Queue[_Slot] = asyncio.Queue(maxsize=MAX_QUEUED_ANSWERS)
        self.logged_refusals: set[tuple[int, str]] = set()

    async def run(self) -> None:
        """Serve until either side ends or the gateway closes the connection."""
        requests = asyncio.create_task(self._requests())
        answers = asyncio.create_task(self._answers())
        try:
            done, _ = await asyncio.wait({requests, answers}, return_when=asyncio.FIRST_COMPLETED)
            if requests in done and not requests.cancelled() and requests.exception() is None \
                    and requests.result() == "flush":
                # The gateway closes: what it queued before (a refusal's answer) leaves first.
                await asyncio.wait({answers}, timeout=FLUSH_BEFORE_CLOSE_SECONDS)
        finally:
            for pump in (requests, answers):
                pump.cancel()
            results = await asyncio.gather(requests, answers, return_exceptions=True)
        for result in results:
            if isinstance(result, ProtocolError):
                log.warning("learner gateway: closing %s: %s", self.peer, result)
            elif isinstance(result, Exception) and not isinstance(result, (ConnectionError, asyncio.CancelledError)):
                # A request the gateway could not handle: the connection closes (it never passes unchecked).
                log.warning("learner gateway: closing %s after %s: %s", self.peer, type(result).__name__, result)

    # --- the answers, in order -------------------------------------------------------------------
    async def _answers(self) -> None:
        while True:
            slot = await self.answers.get()
            if slot.kind == "close":
                return
            body = slot.body
            if slot.kind == "broker":
                frame = await read_frame(self.broker_reader)
                if frame is None:
                    return
                body = frame[1]
                (correlation_id,) = INT32.unpack_from(body) if len(body) >= INT32.size else (None,)
                if correlation_id != slot.header.correlation_id:
                    raise ProtocolError(f"the broker answered correlation id {correlation_id}, "
                                        f"expected {slot.header.correlation_id}")
                if slot.transform is not None:
                    body = slot.transform(body)
            self.client_writer.write(LENGTH.pack(len(body)) + body)
            await self.client_writer.drain()

    async def answer(self, body: bytes) -> None:
        await self.answers.put(_Slot("own", body=body))

    async def forward(self, header: RequestHeader, body: bytes,
                      transform: Callable[[bytes], bytes] | None = None) -> None:
        # Queued before the bytes leave: the answer can never overtake its place.
        await self.answers.put(_Slot("broker", header, transform=transform))
        self.broker_writer.write(LENGTH.pack(len(body)) + body)
        await self.broker_writer.drain()

    # --- the requests ------------------------------------------------------------------------------
    async def _requests(self) -> str | None:
        """Read the client's requests; "flush" when the gateway closes the connection itself,
        "abort" when it must close at once, None when the client hung up."""
        while (frame := await read_frame(self.client_reader, MAX_FRAME_BYTES if self.grant is not None
                                         else MAX_UNAUTHENTICATED_FRAME_BYTES)) is not None:
            _, body = frame
            if self.raw_token_expected:
                outcome = await self._raw_token(body)
            else:
                header = parse_request_header(body)
                if self.grant is not None:  # the lab's faults match authenticated connections only
                    if Lab.of_client_id(header.client_id) not in (None, Lab(self.grant.lab)):
                        # A client id naming another lab would put this connection under that
                        # lab's faults (and in its counts): it counts as no client id at all.
                        header = dataclasses.replace(header, client_id=None)
                    self.on_client_id(header.client_id or "")
                outcome = await self._request(header, body)
            if outcome is not None:
                if outcome == "flush":
                    await self.answers.put(CLOSE)
                return outcome
        return None

    async def _request(self, header: RequestHeader, frame: bytes) -> str | None:
        api = API.get(header.api_key)
        if api is None or header.api_version > api.max_version:
            log.warning("learner gateway: closing %s (%s): api key %s v%s is not one it serves", self.peer,
                        self.grant.username if self.grant else "not authenticated", header.api_key, header.api_version)
            return "flush"
        if header.api_key == API_VERSIONS:
            await self.forward(header, frame, lambda body: self._api_versions(header, body))
            return None
        if header.api_key == SASL_HANDSHAKE:
            return await self._handshake(header, frame)
        if header.api_key == SASL_AUTHENTICATE:
            return await self._authenticate_request(header, frame)
        if self.grant is None:
            # Kafka's SASL listener takes no other request before authentication: it closes.
            log.warning("learner gateway: closing %s: %s before authenticating", self.peer, api.name)
            return "flush"
        flexible = False  # every other API is capped below its first flexible version
        reader = Reader(frame, body_start(frame, header, flexible))
        request = decode(reader, api.request, header.api_version)
        handler = self._handlers()[header.api_key]
        return await handler(header, frame, request)

    def _handlers(self) -> dict[int, Callable[[RequestHeader, bytes, dict], Awaitable[str | None]]]:
        return {PRODUCE: self._produce, FETCH: self._fetch, LIST_OFFSETS: self._list_offsets,
                METADATA: self._metadata, OFFSET_COMMIT: self._offset_commit, OFFSET_FETCH: self._offset_fetch,
                FIND_COORDINATOR: self._find_coordinator, JOIN_GROUP: self._group_request,
                HEARTBEAT: self._group_request, LEAVE_GROUP: self._group_request, SYNC_GROUP: self._group_request,
                DESCRIBE_GROUPS: self._describe_groups, LIST_GROUPS: self._list_groups,
                CREATE_TOPICS: self._create_topics, DELETE_TOPICS: self._delete_topics,
                DELETE_RECORDS: self._delete_records, INIT_PRODUCER_ID: self._init_producer_id,
                CREATE_PARTITIONS: self._create_partitions, DELETE_GROUPS: self._delete_groups,
                OFFSET_DELETE: self._offset_delete}

    def refused(self, header: RequestHeader, what: str) -> None:
        """Log a refusal, once per connection and kind: a client retrying in a loop must not flood the log."""
        if (header.api_key, what) in self.logged_refusals:
            return
        self.logged_refusals.add((header.api_key, what))
        log.info("learner gateway: refused %s v%s of %s (%s) from %s: %s", API[header.api_key].name,
                 header.api_version, self.grant.username if self.grant else "?", header.client_id, self.peer, what)

    def reencoded(self, header: RequestHeader, frame: bytes, request: dict) -> bytes:
        """The request's header as it came, then ``request`` encoded in its version."""
        start = body_start(frame, header, False)
        return frame[:start] + encode(API[header.api_key].request, header.api_version, request)

    def transformed(self, header: RequestHeader, change: Callable[[dict], None]) -> Callable[[bytes], bytes]:
        """A transform of the broker's answer: decoded in the request's version, changed, encoded again."""
        schema = API[header.api_key].response

        def transform(body: bytes) -> bytes:
            value = decode(Reader(body, INT32.size), schema, header.api_version)
            change(value)
            return body[:INT32.size] + encode(schema, header.api_version, value)
        return transform

    # --- SASL ------------------------------------------------------------------------------------------
    async def _handshake(self, header: RequestHeader, frame: bytes) -> str | None:
        request = decode(Reader(frame, body_start(frame, header, False)), API[SASL_HANDSHAKE].request,
                         header.api_version)
        schema = API[SASL_HANDSHAKE].response
        if self.grant is not None or self.handshake_version is not None:
            await self.answer(response(header, schema, {"error_code": ILLEGAL_SASL_STATE, "mechanisms": [MECHANISM]}))
            return "flush"
        if request["mechanism"] != MECHANISM:
            log.info("learner gateway: %s asked for SASL mechanism %r", self.peer, request["mechanism"])
            await self.answer(response(header, schema, {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": [MECHANISM]}))
            return "flush"
        self.handshake_version = header.api_version
        self.raw_token_expected = header.api_version == 0
        await self.answer(response(header, schema, {"error_code": 0, "mechanisms": [MECHANISM]}))
        return None

    async def _authenticate_request(self, header: RequestHeader, frame: bytes) -> str | None:
        flexible = header.api_version >= 2
        reader = Reader(frame, body_start(frame, header, flexible))
        token = reader.compact_bytes() if flexible else reader.bytes_()
        if self.handshake_version != 1 or self.grant is not None:
            await self.answer(self._authenticate_answer(header, ILLEGAL_SASL_STATE,
                                                  "SaslAuthenticate comes after a SaslHandshake v1, once"))
            return "flush"
        if await self._check(token or b""):
            await self.answer(self._authenticate_answer(header, 0, None))
            return None
        await self.answer(self._authenticate_answer(header, SASL_AUTHENTICATION_FAILED, AUTHENTICATION_FAILED_MESSAGE))
        return "flush"

    def _authenticate_answer(self, header: RequestHeader, error_code: int, message: str | None) -> bytes:
        if header.api_version < 2:
            return response(header, API[SASL_AUTHENTICATE].response,
                            {"error_code": error_code, "error_message": message, "auth_bytes": b"",
                             "session_lifetime_ms": 0})
        writer = Writer()  # v2 is flexible: response header v1 (tagged fields), compact strings
        writer.fixed(INT32, header.correlation_id)
        writer.no_tagged_fields()
        writer.fixed(INT16, error_code)
        writer.compact_string(message)
        writer.compact_bytes(b"")
        writer.fixed(INT64, 0)
        writer.no_tagged_fields()
        return writer.getvalue()

    async def _raw_token(self, token: bytes) -> str | None:
        """The bare SASL/PLAIN token after a SaslHandshake v0: an empty frame answers success;
        a failure closes the connection without an answer, as Kafka does."""
        self.raw_token_expected = False
        if await self._check(token):
            await self.answer(b"")
            return None
        return "flush"

    async def _check(self, token: bytes) -> bool:
        credentials = plain_credentials(token)
        grant = await self.authenticate(*credentials) if credentials is not None else None
        if grant is None:
            log.info("learner gateway: failed authentication of %r from %s",
                     credentials[0] if credentials else "(not a PLAIN token)", self.peer)
            await asyncio.sleep(FAILED_AUTHENTICATION_DELAY)
            return False
        self.grant = grant
        log.info("learner gateway: %s authenticated from %s (lab %s)", grant.username, self.peer, grant.lab)
        return True

    # --- ApiVersions ---------------------------------------------------------------------------------
    def _api_versions(self, header: RequestHeader, body: bytes) -> bytes:
        """The broker's ApiVersions answer with only the APIs the gateway serves, each capped at the
        newest version it parses, and the SASL APIs it answers itself."""
        error_code = INT16.unpack_from(body, INT32.size)[0] if len(body) >= INT32.size + INT16.size else 0
        flexible = header.api_version >= 3 and error_code == 0
        # An error answer (UNSUPPORTED_VERSION: the client asked too new a version) comes as v0.
        version = header.api_version if error_code == 0 else 0
        reader = Reader(body, INT32.size)
        if flexible:
            reader.fixed(INT16)
            keys = []
            for _ in range(reader.unsigned_varint() - 1):
                keys.append((reader.fixed(INT16), reader.fixed(INT16), reader.fixed(INT16)))
                reader.skip_tagged_fields()
            throttle = reader.fixed(INT32)
            tagged = reader.rest()  # the broker's features (tagged fields), passed on as they are
        else:
            value = decode(reader, API[API_VERSIONS].response, version)
            keys = [(k["api_key"], k["min_version"], k["max_version"]) for k in value["api_keys"]]
            throttle = value.get("throttle_time_ms", 0)
        offered = {}
        for key, low, high in keys:
            if key in API and key not in GATEWAY_OWN_APIS:
                high = min(high, API[key].max_version)
                if low <= high:
                    offered[key] = (low, high)
        offered.update(GATEWAY_OWN_APIS)
        entries = [{"api_key": key, "min_version": low, "max_version": high}
                   for key, (low, high) in sorted(offered.items())]
        if not flexible:
            return body[:INT32.size] + encode(API[API_VERSIONS].response, version,
                                              {"error_code": error_code, "api_keys": entries,
                                               "throttle_time_ms": throttle})
        writer = Writer()
        writer.raw(body[:INT32.size])  # ApiVersions answers keep response header v0, even flexible ones
        writer.fixed(INT16, error_code)
        writer.unsigned_varint(len(entries) + 1)
        for entry in entries:
            writer.fixed(INT16, entry["api_key"])
            writer.fixed(INT16, entry["min_version"])
            writer.fixed(INT16, entry["max_version"])
            writer.no_tagged_fields()
        writer.fixed(INT32, throttle)
        writer.raw(tagged)
        return writer.getvalue()

    # --- topics ------------------------------------------------------------------------------------------
    async def _metadata(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        """Forwarded with only the principal's topic asked and no auto-creation (Kafka creates a
        topic on Metadata only with CREATE rights); the answer lists that topic only (every topic
        asked for and not the principal's answers TOPIC_AUTHORIZATION_FAILED), its brokers at the
        gateway's advertised address."""
        asked = request["topics"]
        all_topics = asked is None or (header.api_version == 0 and not asked)
        refused = [] if all_topics else [name for name in dict.fromkeys(asked) if not self.grant.may_read(name)]
        allowed = [self.grant.topic] if all_topics else [name for name in asked if self.grant.may_read(name)]
        if refused:
            self.refused(header, f"topics {', '.join(refused)}")
        request["topics"] = allowed
        if "allow_auto_topic_creation" in request:
            request["allow_auto_topic_creation"] = False
        host, port = self.advertised

        def change(value: dict) -> None:
            value["brokers"] = [{**broker, "host": host, "port": port} for broker in value["brokers"]]
            # Asked for every topic, a client hears of those that exist (as Kafka answers), here
            # the principal's only.
            value["topics"] = [topic for topic in value["topics"] if topic["name"] in allowed and not (
                all_topics and topic["error_code"] == UNKNOWN_TOPIC_OR_PARTITION)] + [
                {"error_code": TOPIC_AUTHORIZATION_FAILED, "name": name, "is_internal": False, "partitions": [],
                 "topic_authorized_operations": NO_AUTHORIZED_OPERATIONS} for name in refused]
        await self.forward(header, self.reencoded(header, frame, request), self.transformed(header, change))

    async def _topic_scoped(self, header: RequestHeader, frame: bytes, request: dict, topics_key: str,
                            name_key: str, answer_topics_key: str, refusal: Callable[[dict], dict],
                            top: dict | None = None) -> None:
        """A request naming topics: as it came when every topic is the principal's; otherwise the
        principal's part forwarded and each other topic's partitions answered ``refusal`` (Kafka
        answers per partition), or all answered by the gateway when none is the principal's."""
        topics = request[topics_key] or []
        refused = [topic for topic in topics if not self.grant.may_read(topic[name_key])]
        if not refused:
            await self.forward(header, frame)
            return
        self.refused(header, f"topics {', '.join(sorted({topic[name_key] for topic in refused}))}")
        errors = [refusal(topic) for topic in refused]
        kept = [topic for topic in topics if self.grant.may_read(topic[name_key])]
        if not kept:
            await self.answer(response(header, API[header.api_key].response, {**(top or {}), answer_topics_key: errors}))
            return
        request[topics_key] = kept

        def change(value: dict) -> None:
            value[answer_topics_key] = value[answer_topics_key] + errors
        await self.forward(header, self.reencoded(header, frame, request), self.transformed(header, change))

    async def _fetch(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        """A consumer's Fetch of the principal's topic. Fetch sessions (v7+) are not allowed: a
        session's id is the broker's, not the connection's, and an incremental fetch names no
        topic, so a client could read another client's session unchecked. Each Fetch goes as a
        full fetch without a session (id 0, epoch -1), which every client must accept."""
        if request.get("session_id", 0) != 0 or request.get("session_epoch", -1) != -1 \
                or request.get("forgotten_topics_data"):
            request.update(session_id=0, session_epoch=-1, forgotten_topics_data=[])
            frame = self.reencoded(header, frame, request)

        def refusal(topic: dict) -> dict:
            return {"topic": topic["topic"], "partitions": [
                {"partition_index": p["partition"], "error_code": TOPIC_AUTHORIZATION_FAILED, "high_watermark": -1,
                 "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
                 "preferred_read_replica": -1, "records": b""} for p in topic["partitions"]]}
        if request["replica_id"] != -1:
            # A follower's fetch takes CLUSTER_ACTION, which no lane has: Kafka refuses each partition.
            self.refused(header, f"a follower's fetch (replica id {request['replica_id']})")
            await self.answer(response(header, API[FETCH].response, {"responses": [
                refusal(topic) for topic in request["topics"]]}))
            return
        await self._topic_scoped(header, frame, request, "topics", "topic", "responses", refusal)

    async def _list_offsets(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        def refusal(topic: dict) -> dict:
            return {"name": topic["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": TOPIC_AUTHORIZATION_FAILED,
                 "old_style_offsets": [], "timestamp": -1, "offset": -1, "leader_epoch": -1}
                for p in topic["partitions"]]}
        await self._topic_scoped(header, frame, request, "topics", "name", "topics", refusal)

    async def _produce(self, header: RequestHeader, frame: bytes, request: dict) -> str | None:
        """Learners only read: every Produce is refused (the lab's producer writes the lab's topic)."""
        self.refused(header, f"produce to {', '.join(t['name'] for t in request['topic_data'])}")
        if request["acks"] == 0:
            return "flush"  # no answer is owed; Kafka closes the connection to say a write failed
        await self.answer(response(header, API[PRODUCE].response, {"responses": [
            {"name": topic["name"], "partition_responses": [
                {"index": p["index"], "error_code": TOPIC_AUTHORIZATION_FAILED, "base_offset": -1,
                 "log_append_time_ms": -1, "log_start_offset": -1, "record_errors": [], "error_message": None}
                for p in topic["partition_data"]]} for topic in request["topic_data"]]}))
        return None

    async def _create_topics(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        self.refused(header, "create topics")
        await self.answer(response(header, API[CREATE_TOPICS].response, {"topics": [
            {"name": topic["name"], "error_code": TOPIC_AUTHORIZATION_FAILED,
             "error_message": TOPIC_AUTHORIZATION_FAILED_MESSAGE} for topic in request["topics"]]}))

    async def _delete_topics(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        self.refused(header, f"delete topics {', '.join(request['topic_names'])}")
        await self.answer(response(header, API[DELETE_TOPICS].response, {"responses": [
            {"name": name, "error_code": TOPIC_AUTHORIZATION_FAILED} for name in request["topic_names"]]}))

    async def _delete_records(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        self.refused(header, "delete records")
        await self.answer(response(header, API[DELETE_RECORDS].response, {"topics": [
            {"name": topic["name"], "partitions": [
                {"partition_index": p["partition_index"], "low_watermark": -1,
                 "error_code": TOPIC_AUTHORIZATION_FAILED} for p in topic["partitions"]]}
            for topic in request["topics"]]}))

    async def _create_partitions(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        self.refused(header, "create partitions")
        await self.answer(response(header, API[CREATE_PARTITIONS].response, {"results": [
            {"name": topic["name"], "error_code": TOPIC_AUTHORIZATION_FAILED,
             "error_message": TOPIC_AUTHORIZATION_FAILED_MESSAGE} for topic in request["topics"]]}))

    async def _init_producer_id(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        """A transactional producer lacks WRITE on its transactional id; an idempotent one lacks
        IDEMPOTENT_WRITE on the cluster (and WRITE on any topic), as Kafka's authorizer answers."""
        transactional = request["transactional_id"] is not None
        self.refused(header, "transactional id" if transactional else "idempotent write")
        await self.answer(response(header, API[INIT_PRODUCER_ID].response, {
            "error_code": TRANSACTIONAL_ID_AUTHORIZATION_FAILED if transactional else CLUSTER_AUTHORIZATION_FAILED,
            "producer_id": -1, "producer_epoch": -1}))

    # --- groups ----------------------------------------------------------------------------------------
    async def _find_coordinator(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        key_type = request.get("key_type", 0)
        error = None
        if key_type != 0:
            error = TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        elif not self.grant.may_use_group(request["key"]):
            error = GROUP_AUTHORIZATION_FAILED
        if error is not None:
            self.refused(header, f"coordinator of {request['key']!r} (key type {key_type})")
            await self.answer(response(header, API[FIND_COORDINATOR].response, {
                "error_code": error, "error_message": None, "node_id": -1, "host": "", "port": -1}))
            return
        host, port = self.advertised

        def change(value: dict) -> None:
            if value["error_code"] == 0:
                value["host"], value["port"] = host, port
        await self.forward(header, frame, self.transformed(header, change))

    async def _group_request(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        """JoinGroup, Heartbeat, LeaveGroup, SyncGroup: forwarded as they came for the principal's
        group, GROUP_AUTHORIZATION_FAILED for any other."""
        if self.grant.may_use_group(request["group_id"]):
            await self.forward(header, frame)
            return
        self.refused(header, f"group {request['group_id']}")
        await self.answer(response(header, API[header.api_key].response, {
            "error_code": GROUP_AUTHORIZATION_FAILED, "generation_id": -1, "protocol_name": "", "leader": "",
            "member_id": "", "members": [], "assignment": b""}))

    async def _offset_commit(self, header: RequestHeader, frame: bytes, request: dict) -> str | None:
        def refusal_of(error: int) -> Callable[[dict], dict]:
            return lambda topic: {"name": topic["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": error} for p in topic["partitions"]]}
        if not self.grant.may_use_group(request["group_id"]):
            self.refused(header, f"commit in group {request['group_id']}")
            await self.answer(response(header, API[OFFSET_COMMIT].response, {
                "topics": [refusal_of(GROUP_AUTHORIZATION_FAILED)(topic) for topic in request["topics"]]}))
            return None
        if self.faults.blocks_commit(header):
            # The lab's commit-block fault, as on the lab's own listener: the connection is closed
            # under the request, which never reaches the broker.
            await asyncio.shield(self.faults.commit_blocked(header, self.peer))
            return "abort"
        await self._topic_scoped(header, frame, request, "topics", "name", "topics",
                                 refusal_of(TOPIC_AUTHORIZATION_FAILED))
        return None

    async def _offset_fetch(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        def refusal_of(error: int) -> Callable[[dict], dict]:
            return lambda topic: {"name": topic["name"], "partitions": [
                {"partition_index": index, "committed_offset": -1, "committed_leader_epoch": -1, "metadata": "",
                 "error_code": error} for index in topic["partition_indexes"]]}
        if not self.grant.may_use_group(request["group_id"]):
            self.refused(header, f"offsets of group {request['group_id']}")
            await self.answer(response(header, API[OFFSET_FETCH].response, {
                "topics": [refusal_of(GROUP_AUTHORIZATION_FAILED)(topic) for topic in request["topics"] or []],
                "error_code": GROUP_AUTHORIZATION_FAILED}))
            return
        if request["topics"] is None:  # every topic the group committed: those the principal may read
            def change(value: dict) -> None:
                value["topics"] = [topic for topic in value["topics"] if self.grant.may_read(topic["name"])]
            await self.forward(header, frame, self.transformed(header, change))
            return
        await self._topic_scoped(header, frame, request, "topics", "name", "topics",
                                 refusal_of(TOPIC_AUTHORIZATION_FAILED), top={"error_code": 0})

    async def _describe_groups(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        refused = [group for group in request["groups"] if not self.grant.may_use_group(group)]
        if not refused:
            await self.forward(header, frame)
            return
        self.refused(header, f"describe groups {', '.join(refused)}")
        errors = [{"error_code": GROUP_AUTHORIZATION_FAILED, "group_id": group, "group_state": "", "protocol_type": "",
                   "protocol_data": "", "members": [], "authorized_operations": NO_AUTHORIZED_OPERATIONS}
                  for group in refused]
        kept = [group for group in request["groups"] if self.grant.may_use_group(group)]
        if not kept:
            await self.answer(response(header, API[DESCRIBE_GROUPS].response, {"groups": errors}))
            return
        request["groups"] = kept

        def change(value: dict) -> None:
            value["groups"] = value["groups"] + errors
        await self.forward(header, self.reencoded(header, frame, request), self.transformed(header, change))

    async def _list_groups(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        def change(value: dict) -> None:
            value["groups"] = [group for group in value["groups"] if self.grant.may_use_group(group["group_id"])]
        await self.forward(header, frame, self.transformed(header, change))

    async def _delete_groups(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        """Deleting a group takes DELETE on it, which no lane has, its own group included."""
        self.refused(header, f"delete groups {', '.join(request['groups_names'])}")
        await self.answer(response(header, API[DELETE_GROUPS].response, {"results": [
            {"group_id": group, "error_code": GROUP_AUTHORIZATION_FAILED} for group in request["groups_names"]]}))

    async def _offset_delete(self, header: RequestHeader, frame: bytes, request: dict) -> None:
        self.refused(header, f"delete offsets of group {request['group_id']}")
        await self.answer(response(header, API[OFFSET_DELETE].response, {"error_code": GROUP_AUTHORIZATION_FAILED,
                                                                    "topics": []}))
