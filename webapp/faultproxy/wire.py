"""Kafka's message bodies, as much as the learners' gateway reads and writes of them: a small
declarative codec for the non-flexible versions of the requests it authorizes and the responses it
filters, rewrites or makes (messages.py holds the schemas).

A schema is a tuple of fields; a field is ``(name, type, first_version, last_version)`` and is on
the wire only in the versions between the two (``last_version`` None: every later one). A type is
one of the primitive names below, or ``Array(schema_or_type)`` / ``NullableArray(...)``. Decoding
gives plain dicts (a field absent in that version is left out); encoding takes the same dicts, a
missing field taking its type's zero value. Flexible versions (compact strings, tagged fields) are
not handled here: the gateway caps every API it parses below its first flexible version, and
writes the two flexible bodies it needs (ApiVersions v3, SaslAuthenticate v2) by hand.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from .protocol import ProtocolError

INT8, INT16, INT32, INT64 = struct.Struct(">b"), struct.Struct(">h"), struct.Struct(">i"), struct.Struct(">q")
_FIXED = {"int8": INT8, "int16": INT16, "int32": INT32, "int64": INT64, "bool": INT8}
_ZERO = {"int8": 0, "int16": 0, "int32": 0, "int64": 0, "bool": False, "string": "", "nstring": None,
         "bytes": b"", "nbytes": None, "uuid": bytes(16)}


@dataclass(frozen=True)
class Array:
    """An int32-counted array of ``of`` (a schema: a tuple of fields, or a primitive type's name)."""
    of: Any
    nullable: bool = False


def NullableArray(of: Any) -> Array:  # noqa: N802 - reads as a type in a schema
    return Array(of, nullable=True)


def field(name: str, kind: Any, first: int = 0, last: int | None = None) -> tuple:
    return (name, kind, first, last)


class Reader:
    """Reads Kafka's primitive types from ``data``, from ``offset`` on; ProtocolError past the end."""

    def __init__(self, data: bytes, offset: int = 0):
        self.data, self.offset = data, offset

    def _take(self, size: int) -> bytes:
        if size < 0 or self.offset + size > len(self.data):
            raise ProtocolError(f"a message ends {self.offset + size - len(self.data)} byte(s) short")
        chunk = self.data[self.offset:self.offset + size]
        self.offset += size
        return chunk

    def fixed(self, layout: struct.Struct) -> int:
        return layout.unpack(self._take(layout.size))[0]

    def string(self, nullable: bool = False) -> str | None:
        length = self.fixed(INT16)
        if length < 0:
            if nullable:
                return None
            raise ProtocolError("a null where a string must be")
        return self._take(length).decode("utf-8", errors="replace")

    def bytes_(self, nullable: bool = False) -> bytes | None:
        length = self.fixed(INT32)
        if length < 0:
            if nullable:
                return None
            raise ProtocolError("a null where bytes must be")
        return self._take(length)

    def unsigned_varint(self) -> int:
        value, shift = 0, 0
        while True:
            byte = self._take(1)[0]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
            if shift > 28:
                raise ProtocolError("a varint longer than 5 bytes")

    def compact_bytes(self) -> bytes | None:
        length = self.unsigned_varint() - 1
        return None if length < 0 else self._take(length)

    def skip_tagged_fields(self) -> None:
        for _ in range(self.unsigned_varint()):
            self.unsigned_varint()  # the tag
            self._take(self.unsigned_varint())

    def rest(self) -> bytes:
        return self._take(len(self.data) - self.offset)

    def read(self, kind: Any, version: int) -> Any:
        if isinstance(kind, Array):
            count = self.fixed(INT32)
            if count < 0:
                if kind.nullable:
                    return None
                raise ProtocolError("a null where an array must be")
            if count > len(self.data) - self.offset:  # every element takes a byte at least
                raise ProtocolError(f"an array of {count} elements in a message of {len(self.data)} bytes")
            return [self.read(kind.of, version) for _ in range(count)]
        if isinstance(kind, tuple):
            return decode(self, kind, version)
        if kind in _FIXED:
            value = self.fixed(_FIXED[kind])
            return bool(value) if kind == "bool" else value
        if kind in ("string", "nstring"):
            return self.string(nullable=kind == "nstring")
        if kind in ("bytes", "nbytes"):
            return self.bytes_(nullable=kind == "nbytes")
        if kind == "uuid":
            return self._take(16)
        raise TypeError(f"no such wire type: {kind!r}")


class Writer:
    """Writes Kafka's primitive types into a growing buffer."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def getvalue(self) -> bytes:
        return b"".join(self.parts)

    def fixed(self, layout: struct.Struct, value: int) -> None:
        self.parts.append(layout.pack(value))

    def raw(self, data: bytes) -> None:
        self.parts.append(data)

    def string(self, value: str | None) -> None:
        if value is None:
            self.fixed(INT16, -1)
            return
        data = value.encode("utf-8")
        self.fixed(INT16, len(data))
        self.parts.append(data)

    def bytes_(self, value: bytes | None) -> None:
        if value is None:
            self.fixed(INT32, -1)
            return
        self.fixed(INT32, len(value))
        self.parts.append(value)

    def unsigned_varint(self, value: int) -> None:
        out = bytearray()
        while value > 0x7F:
            out.append((value & 0x7F) | 0x80)
            value >>= 7
        out.append(value)
        self.parts.append(bytes(out))

    def compact_string(self, value: str | None) -> None:
        if value is None:
            self.unsigned_varint(0)
            return
        data = value.encode("utf-8")
        self.unsigned_varint(len(data) + 1)
        self.parts.append(data)

    def compact_bytes(self, value: bytes | None) -> None:
        if value is None:
            self.unsigned_varint(0)
            return
        self.unsigned_varint(len(value) + 1)
        self.parts.append(value)

    def no_tagged_fields(self) -> None:
        self.unsigned_varint(0)

    def write(self, kind: Any, version: int, value: Any) -> None:
        if isinstance(kind, Array):
            if value is None:
                if not kind.nullable:
                    raise ValueError("a null for an array that cannot be null")
                self.fixed(INT32, -1)
                return
            self.fixed(INT32, len(value))
            for element in value:
                self.write(kind.of, version, element)
        elif isinstance(kind, tuple):
            encode_into(self, kind, version, value)
        elif kind in _FIXED:
            self.fixed(_FIXED[kind], int(value))
        elif kind in ("string", "nstring"):
            if value is None and kind == "string":
                raise ValueError("a null for a string that cannot be null")
            self.string(value)
        elif kind in ("bytes", "nbytes"):
            if value is None and kind == "bytes":
                raise ValueError("a null for bytes that cannot be null")
            self.bytes_(value)
        elif kind == "uuid":
            self.parts.append(bytes(value))
        else:
            raise TypeError(f"no such wire type: {kind!r}")


def present(spec: tuple, version: int) -> bool:
    _, _, first, last = spec
    return first <= version and (last is None or version <= last)


def zero(kind: Any) -> Any:
    if isinstance(kind, Array):
        return []
    if isinstance(kind, tuple):
        return {}
    return _ZERO[kind]


def decode(reader: Reader, schema: tuple, version: int) -> dict:
    """The fields of ``schema`` present in ``version``, read from ``reader``."""
    return {name: reader.read(kind, version) for name, kind, *_ in
            (spec for spec in schema if present(spec, version))}


def encode_into(writer: Writer, schema: tuple, version: int, value: dict) -> None:
    for spec in schema:
        if present(spec, version):
            name, kind, *_ = spec
            writer.write(kind, version, value.get(name, zero(kind)))


def encode(schema: tuple, version: int, value: dict) -> bytes:
    """``value`` written as ``schema`` in ``version``; a field it lacks takes its type's zero."""
    writer = Writer()
    encode_into(writer, schema, version, value)
    return writer.getvalue()
