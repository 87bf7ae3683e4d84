"""What a consumer can know of its group's membership: the group's generation.

Kafka's generation is an epoch of the whole group, bumped by the coordinator at every rebalance;
every member of one rebalance holds the same generation, and a member whose generation is stale
(a zombie that slept through a rebalance) has its offset commits refused (ILLEGAL_GENERATION or
UNKNOWN_MEMBER_ID). librdkafka hands it to the application only inside the group metadata it
serialises for a transactional producer (``Consumer.consumer_group_metadata()``): the bytes
``CGMDv2:``, the generation id as a native-order int32, then the group id and the member id, each
NUL-terminated (librdkafka's ``rd_kafka_consumer_group_metadata_write``).
"""
from __future__ import annotations

import struct
import sys

MAGIC = b"CGMDv2:"
_INT32 = struct.Struct("<i" if sys.byteorder == "little" else ">i")


def group_generation(metadata: bytes) -> int | None:
    """The group's generation in librdkafka's serialised group metadata, or None when the format
    is not the one known here or the consumer is not a member yet (librdkafka says -1)."""
    if not isinstance(metadata, (bytes, bytearray)) or not metadata.startswith(MAGIC) \
            or len(metadata) < len(MAGIC) + _INT32.size:
        return None
    (generation,) = _INT32.unpack_from(metadata, len(MAGIC))
    return generation if generation >= 0 else None

