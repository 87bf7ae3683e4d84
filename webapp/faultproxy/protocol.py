"""Kafka's wire framing, as much as the fault proxy reads of it: the 4-byte length of every frame,
then a request's api_key, api_version, correlation_id and client_id; a response's correlation id.
Everything else is forwarded unread.
"""
from __future__ import annotations

import asyncio
import struct
from dataclasses import dataclass

PRODUCE = 0
OFFSET_COMMIT = 8
# A frame bigger than this is not Kafka (the broker's default socket.request.max.bytes is 100 MiB).
MAX_FRAME_BYTES = 256 * 1024 * 1024

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


async def read_frame(reader: asyncio.StreamReader, limit: int = MAX_FRAME_BYTES) -> tuple[bytes, bytes] | None:
    """One frame as (length prefix, body), or None at a clean end of stream; a frame longer than
    ``limit`` bytes is a ProtocolError, its body never read."""
    try:
        prefix = await reader.readexactly(LENGTH.size)
    except asyncio.IncompleteReadError as error:
        if error.partial:
            raise ProtocolError("the stream ended inside a frame's length") from None
        return None
    (length,) = LENGTH.unpack(prefix)
    if not 0 <= length <= limit:
        raise ProtocolError(f"frame length {length} is not Kafka" if limit == MAX_FRAME_BYTES else
                            f"a frame of {length} bytes, over the {limit} allowed here")
    try:
        body = await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise ProtocolError("the stream ended inside a frame") from None
    return prefix, body
