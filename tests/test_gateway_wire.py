"""The learners' gateway's codec (webapp/faultproxy/wire.py, messages.py) against kafka-python's
protocol classes, an independent reading of Kafka's message specs: a value written with the
gateway's schema in a version, read by kafka-python's class of that version and written again by
it, gives the same bytes; and the gateway reads back what it wrote. Pure: no broker, no database."""
from __future__ import annotations

from io import BytesIO

import pytest

from webapp.faultproxy import messages as m
from webapp.faultproxy.protocol import ProtocolError
from webapp.faultproxy.wire import Array, Reader, decode, encode, present

SAMPLE = {"int8": 1, "int16": 2, "int32": 3, "int64": 4, "bool": True, "string": "s", "nstring": "n",
          "bytes": b"b", "nbytes": b"nb"}


def sample(kind, version: int):
    """A value of ``kind`` with every field set (and one element in each array), so that no field
    can be misplaced without the bytes showing it."""
    if isinstance(kind, Array):
        return [sample(kind.of, version)]
    if isinstance(kind, tuple):
        return {name: sample(of, version) for name, of, *_ in (f for f in kind if present(f, version))}
    return SAMPLE[kind]


def kafka_python(module: str, name: str, version: int):
    import importlib
    return getattr(importlib.import_module(f"kafka.protocol.{module}"), f"{name}_v{version}")


PAIRS = [  # (the gateway's schema, kafka-python's module and class, the versions both have)
    (m.METADATA_REQUEST, "metadata", "MetadataRequest", range(0, 6)),
    (m.METADATA_RESPONSE, "metadata", "MetadataResponse", range(0, 6)),
    (m.FETCH_REQUEST, "fetch", "FetchRequest", range(0, 12)),
    (m.FETCH_RESPONSE, "fetch", "FetchResponse", range(0, 12)),
    (m.LIST_OFFSETS_REQUEST, "offset", "OffsetRequest", range(0, 6)),
    (m.LIST_OFFSETS_RESPONSE, "offset", "OffsetResponse", range(0, 6)),
    (m.OFFSET_COMMIT_REQUEST, "commit", "OffsetCommitRequest", range(0, 4)),
    (m.OFFSET_COMMIT_RESPONSE, "commit", "OffsetCommitResponse", range(0, 4)),
    (m.OFFSET_FETCH_REQUEST, "commit", "OffsetFetchRequest", range(0, 4)),
    (m.OFFSET_FETCH_RESPONSE, "commit", "OffsetFetchResponse", range(0, 4)),
    (m.FIND_COORDINATOR_RESPONSE, "commit", "GroupCoordinatorResponse", range(0, 2)),
    (m.JOIN_GROUP_RESPONSE, "group", "JoinGroupResponse", range(0, 3)),
    (m.SYNC_GROUP_RESPONSE, "group", "SyncGroupResponse", range(0, 2)),
    (m.HEARTBEAT_RESPONSE, "group", "HeartbeatResponse", range(0, 2)),
    (m.LEAVE_GROUP_RESPONSE, "group", "LeaveGroupResponse", range(0, 2)),
    (m.LIST_GROUPS_RESPONSE, "admin", "ListGroupsResponse", range(0, 3)),
    (m.DESCRIBE_GROUPS_REQUEST, "admin", "DescribeGroupsRequest", range(0, 4)),
    (m.DESCRIBE_GROUPS_RESPONSE, "admin", "DescribeGroupsResponse", range(0, 4)),
    (m.PRODUCE_REQUEST, "produce", "ProduceRequest", range(0, 9)),
    (m.PRODUCE_RESPONSE, "produce", "ProduceResponse", range(0, 9)),
    (m.CREATE_TOPICS_REQUEST, "admin", "CreateTopicsRequest", range(0, 4)),
    (m.CREATE_TOPICS_RESPONSE, "admin", "CreateTopicsResponse", range(0, 4)),
    (m.DELETE_TOPICS_REQUEST, "admin", "DeleteTopicsRequest", range(0, 4)),
    (m.DELETE_TOPICS_RESPONSE, "admin", "DeleteTopicsResponse", range(0, 4)),
    (m.DELETE_GROUPS_REQUEST, "admin", "DeleteGroupsRequest", range(0, 2)),
    (m.DELETE_GROUPS_RESPONSE, "admin", "DeleteGroupsResponse", range(0, 2)),
    (m.CREATE_PARTITIONS_RESPONSE, "admin", "CreatePartitionsResponse", range(0, 2)),
    (m.SASL_HANDSHAKE_REQUEST, "admin", "SaslHandShakeRequest", range(0, 2)),
    (m.SASL_HANDSHAKE_RESPONSE, "admin", "SaslHandShakeResponse", range(0, 2)),
    (m.SASL_AUTHENTICATE_RESPONSE, "admin", "SaslAuthenticateResponse", range(0, 2)),
    (m.API_VERSIONS_RESPONSE, "admin", "ApiVersionResponse", range(0, 3)),
]


# Where kafka-python 2.0.6's class departs from Kafka's message spec, the gateway follows the spec
# and only its own round trip is checked.
KAFKA_PYTHON_DEPARTS = {
    **{("FetchRequest", v): "forgotten_topics_data's topic is a bare String class (cannot decode)"
       for v in range(7, 12)},
    **{("OffsetRequest", v): "current_leader_epoch as int64 (the spec: int32)" for v in (4, 5)},
    ("DescribeGroupsResponse", 3): "authorized_operations after the groups array (the spec: in each group)",
    ("ProduceResponse", 8): "record_errors and error_message outside the partition (the spec: in it)",
}


@pytest.mark.parametrize("schema, module, name, version", [
    pytest.param(schema, module, name, version, id=f"{name}_v{version}")
    for schema, module, name, versions in PAIRS for version in versions])
def test_the_gateways_bytes_are_kafka_pythons(schema, module, name, version):
    value = sample(schema, version)
    ours = encode(schema, version, value)
    assert decode(Reader(ours), schema, version) == value
    if (name, version) not in KAFKA_PYTHON_DEPARTS:
        theirs = kafka_python(module, name, version).decode(BytesIO(ours))
        assert theirs.encode() == ours


def test_every_api_is_capped_below_its_first_flexible_version():
    # The first flexible version of each API (Kafka's message specs, "flexibleVersions").
    flexible_from = {m.PRODUCE: 9, m.FETCH: 12, m.LIST_OFFSETS: 6, m.METADATA: 9, m.OFFSET_COMMIT: 8,
                     m.OFFSET_FETCH: 6, m.FIND_COORDINATOR: 3, m.JOIN_GROUP: 6, m.HEARTBEAT: 4, m.LEAVE_GROUP: 4,
                     m.SYNC_GROUP: 4, m.DESCRIBE_GROUPS: 5, m.LIST_GROUPS: 3, m.SASL_HANDSHAKE: 99,
                     m.CREATE_TOPICS: 5, m.DELETE_TOPICS: 4, m.DELETE_RECORDS: 2, m.INIT_PRODUCER_ID: 2,
                     m.CREATE_PARTITIONS: 2, m.DELETE_GROUPS: 2, m.OFFSET_DELETE: 99}
    for key, api in m.API.items():
        if key in m.FLEXIBLE_FROM:
            continue  # written by hand in their flexible version
        assert api.max_version < flexible_from[key], api.name


@pytest.mark.parametrize("data", [b"", b"\x00", b"\x00\x00\x00\x05abc", b"\xff\xff\xff\xff"])
def test_a_message_cut_short_is_a_protocol_error(data):
    with pytest.raises(ProtocolError):
        decode(Reader(data), m.DELETE_TOPICS_REQUEST, 1)
