"""The Kafka messages the learners' gateway reads, rewrites or answers itself, as wire.py schemas,
in their non-flexible versions (Kafka's clients/src/main/resources/common/message/*.json): the
gateway advertises no later version, so a client that follows ApiVersions never sends one.

``API`` maps each API key the gateway handles to its name, the newest version it parses (the cap),
and its request and response schemas. Error codes are Kafka's (org.apache.kafka.common.protocol.Errors).
"""
from __future__ import annotations

from dataclasses import dataclass

from .wire import Array, NullableArray
from .wire import field as f

# --- error codes --------------------------------------------------------------------------------
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
UNSUPPORTED_VERSION = 35
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SASL_AUTHENTICATION_FAILED = 58
# Kafka's "authorized operations were not asked for" (Integer.MIN_VALUE).
NO_AUTHORIZED_OPERATIONS = -2147483648

# --- API keys -----------------------------------------------------------------------------------
PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP = 8, 9, 10, 11, 12, 13, 14
DESCRIBE_GROUPS, LIST_GROUPS, SASL_HANDSHAKE, API_VERSIONS = 15, 16, 17, 18
CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS, INIT_PRODUCER_ID = 19, 20, 21, 22
SASL_AUTHENTICATE, CREATE_PARTITIONS, DELETE_GROUPS, OFFSET_DELETE = 36, 37, 42, 47

# --- schemas --------------------------------------------------------------------------------------
PRODUCE_REQUEST = (
    f("transactional_id", "nstring", 3), f("acks", "int16"), f("timeout_ms", "int32"),
    f("topic_data", Array((f("name", "string"), f("partition_data", Array((
        f("index", "int32"), f("records", "nbytes"))))))),
)
PRODUCE_RESPONSE = (
    f("responses", Array((f("name", "string"), f("partition_responses", Array((
        f("index", "int32"), f("error_code", "int16"), f("base_offset", "int64"),
        f("log_append_time_ms", "int64", 2), f("log_start_offset", "int64", 5),
        f("record_errors", Array((f("batch_index", "int32"), f("batch_index_error_message", "nstring"))), 8),
        f("error_message", "nstring", 8))))))),
    f("throttle_time_ms", "int32", 1),
)
FETCH_REQUEST = (
    f("replica_id", "int32"), f("max_wait_ms", "int32"), f("min_bytes", "int32"), f("max_bytes", "int32", 3),
    f("isolation_level", "int8", 4), f("session_id", "int32", 7), f("session_epoch", "int32", 7),
    f("topics", Array((f("topic", "string"), f("partitions", Array((
        f("partition", "int32"), f("current_leader_epoch", "int32", 9), f("fetch_offset", "int64"),
        f("log_start_offset", "int64", 5), f("partition_max_bytes", "int32"))))))),
    f("forgotten_topics_data", Array((f("topic", "string"), f("partitions", Array("int32")))), 7),
    f("rack_id", "string", 11),
)
FETCH_RESPONSE = (
    f("throttle_time_ms", "int32", 1), f("error_code", "int16", 7), f("session_id", "int32", 7),
    f("responses", Array((f("topic", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("error_code", "int16"), f("high_watermark", "int64"),
        f("last_stable_offset", "int64", 4), f("log_start_offset", "int64", 5),
        f("aborted_transactions", NullableArray((f("producer_id", "int64"), f("first_offset", "int64"))), 4),
        f("preferred_read_replica", "int32", 11), f("records", "nbytes"))))))),
)
LIST_OFFSETS_REQUEST = (
    f("replica_id", "int32"), f("isolation_level", "int8", 2),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("current_leader_epoch", "int32", 4), f("timestamp", "int64"),
        f("max_num_offsets", "int32", 0, 0))))))),
)
LIST_OFFSETS_RESPONSE = (
    f("throttle_time_ms", "int32", 2),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("error_code", "int16"), f("old_style_offsets", Array("int64"), 0, 0),
        f("timestamp", "int64", 1), f("offset", "int64", 1), f("leader_epoch", "int32", 4))))))),
)
METADATA_REQUEST = (
    f("topics", Array("string"), 0, 0), f("topics", NullableArray("string"), 1),
    f("allow_auto_topic_creation", "bool", 4), f("include_cluster_authorized_operations", "bool", 8),
    f("include_topic_authorized_operations", "bool", 8),
)
METADATA_RESPONSE = (
    f("throttle_time_ms", "int32", 3),
    f("brokers", Array((f("node_id", "int32"), f("host", "string"), f("port", "int32"), f("rack", "nstring", 1)))),
    f("cluster_id", "nstring", 2), f("controller_id", "int32", 1),
    f("topics", Array((f("error_code", "int16"), f("name", "string"), f("is_internal", "bool", 1),
                       f("partitions", Array((
                           f("error_code", "int16"), f("partition_index", "int32"), f("leader_id", "int32"),
                           f("leader_epoch", "int32", 7), f("replica_nodes", Array("int32")),
                           f("isr_nodes", Array("int32")), f("offline_replicas", Array("int32"), 5)))),
                       f("topic_authorized_operations", "int32", 8)))),
    f("cluster_authorized_operations", "int32", 8),
)
OFFSET_COMMIT_REQUEST = (
    f("group_id", "string"), f("generation_id", "int32", 1), f("member_id", "string", 1),
    f("group_instance_id", "nstring", 7), f("retention_time_ms", "int64", 2, 4),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("committed_offset", "int64"), f("committed_leader_epoch", "int32", 6),
        f("commit_timestamp", "int64", 1, 1), f("committed_metadata", "nstring"))))))),
)
OFFSET_COMMIT_RESPONSE = (
    f("throttle_time_ms", "int32", 3),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("error_code", "int16"))))))),
)
OFFSET_FETCH_REQUEST = (
    f("group_id", "string"),
    f("topics", Array((f("name", "string"), f("partition_indexes", Array("int32")))), 0, 1),
    f("topics", NullableArray((f("name", "string"), f("partition_indexes", Array("int32")))), 2),
)
OFFSET_FETCH_RESPONSE = (
    f("throttle_time_ms", "int32", 3),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("committed_offset", "int64"), f("committed_leader_epoch", "int32", 5),
        f("metadata", "nstring"), f("error_code", "int16"))))))),
    f("error_code", "int16", 2),
)
GROUP_ID_FIRST = (f("group_id", "string"),)  # JoinGroup, Heartbeat, LeaveGroup, SyncGroup: the rest unread
FIND_COORDINATOR_REQUEST = (f("key", "string"), f("key_type", "int8", 1))
FIND_COORDINATOR_RESPONSE = (
    f("throttle_time_ms", "int32", 1), f("error_code", "int16"), f("error_message", "nstring", 1),
    f("node_id", "int32"), f("host", "string"), f("port", "int32"),
)
JOIN_GROUP_RESPONSE = (
    f("throttle_time_ms", "int32", 2), f("error_code", "int16"), f("generation_id", "int32"),
    f("protocol_name", "string"), f("leader", "string"), f("member_id", "string"),
    f("members", Array((f("member_id", "string"), f("group_instance_id", "nstring", 5), f("metadata", "bytes")))),
)
HEARTBEAT_RESPONSE = (f("throttle_time_ms", "int32", 1), f("error_code", "int16"))
LEAVE_GROUP_RESPONSE = (
    f("throttle_time_ms", "int32", 1), f("error_code", "int16"),
    f("members", Array((f("member_id", "string"), f("group_instance_id", "nstring"), f("error_code", "int16"))), 3),
)
SYNC_GROUP_RESPONSE = (f("throttle_time_ms", "int32", 1), f("error_code", "int16"), f("assignment", "bytes"))
DESCRIBE_GROUPS_REQUEST = (f("groups", Array("string")), f("include_authorized_operations", "bool", 3))
DESCRIBE_GROUPS_RESPONSE = (
    f("throttle_time_ms", "int32", 1),
    f("groups", Array((f("error_code", "int16"), f("group_id", "string"), f("group_state", "string"),
                       f("protocol_type", "string"), f("protocol_data", "string"),
                       f("members", Array((f("member_id", "string"), f("group_instance_id", "nstring", 4),
                                           f("client_id", "string"), f("client_host", "string"),
                                           f("member_metadata", "bytes"), f("member_assignment", "bytes")))),
                       f("authorized_operations", "int32", 3)))),
)
LIST_GROUPS_REQUEST = ()
LIST_GROUPS_RESPONSE = (
    f("throttle_time_ms", "int32", 1), f("error_code", "int16"),
    f("groups", Array((f("group_id", "string"), f("protocol_type", "string")))),
)
SASL_HANDSHAKE_REQUEST = (f("mechanism", "string"),)
SASL_HANDSHAKE_RESPONSE = (f("error_code", "int16"), f("mechanisms", Array("string")))
SASL_AUTHENTICATE_REQUEST = (f("auth_bytes", "bytes"),)
SASL_AUTHENTICATE_RESPONSE = (
    f("error_code", "int16"), f("error_message", "nstring"), f("auth_bytes", "bytes"),
    f("session_lifetime_ms", "int64", 1),
)
API_VERSIONS_RESPONSE = (
    f("error_code", "int16"),
    f("api_keys", Array((f("api_key", "int16"), f("min_version", "int16"), f("max_version", "int16")))),
    f("throttle_time_ms", "int32", 1),
)
CREATE_TOPICS_REQUEST = (
    f("topics", Array((f("name", "string"), f("num_partitions", "int32"), f("replication_factor", "int16"),
                       f("assignments", Array((f("partition_index", "int32"), f("broker_ids", Array("int32"))))),
                       f("configs", Array((f("name", "string"), f("value", "nstring"))))))),
    f("timeout_ms", "int32"), f("validate_only", "bool", 1),
)
CREATE_TOPICS_RESPONSE = (
    f("throttle_time_ms", "int32", 2),
    f("topics", Array((f("name", "string"), f("error_code", "int16"), f("error_message", "nstring", 1)))),
)
DELETE_TOPICS_REQUEST = (f("topic_names", Array("string")), f("timeout_ms", "int32"))
DELETE_TOPICS_RESPONSE = (
    f("throttle_time_ms", "int32", 1), f("responses", Array((f("name", "string"), f("error_code", "int16")))),
)
DELETE_RECORDS_REQUEST = (
    f("topics", Array((f("name", "string"), f("partitions", Array((f("partition_index", "int32"),
                                                                   f("offset", "int64"))))))),
    f("timeout_ms", "int32"),
)
DELETE_RECORDS_RESPONSE = (
    f("throttle_time_ms", "int32"),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("low_watermark", "int64"), f("error_code", "int16"))))))),
)
INIT_PRODUCER_ID_REQUEST = (f("transactional_id", "nstring"), f("transaction_timeout_ms", "int32"))
INIT_PRODUCER_ID_RESPONSE = (
    f("throttle_time_ms", "int32"), f("error_code", "int16"), f("producer_id", "int64"),
    f("producer_epoch", "int16"),
)
CREATE_PARTITIONS_REQUEST = (
    f("topics", Array((f("name", "string"), f("count", "int32"),
                       f("assignments", NullableArray((f("broker_ids", Array("int32")),)))))),
    f("timeout_ms", "int32"), f("validate_only", "bool"),
)
CREATE_PARTITIONS_RESPONSE = (
    f("throttle_time_ms", "int32"),
    f("results", Array((f("name", "string"), f("error_code", "int16"), f("error_message", "nstring")))),
)
DELETE_GROUPS_REQUEST = (f("groups_names", Array("string")),)
DELETE_GROUPS_RESPONSE = (
    f("throttle_time_ms", "int32"), f("results", Array((f("group_id", "string"), f("error_code", "int16")))),
)
OFFSET_DELETE_REQUEST = (
    f("group_id", "string"),
    f("topics", Array((f("name", "string"), f("partitions", Array((f("partition_index", "int32"),)))))),
)
OFFSET_DELETE_RESPONSE = (
    f("error_code", "int16"), f("throttle_time_ms", "int32"),
    f("topics", Array((f("name", "string"), f("partitions", Array((
        f("partition_index", "int32"), f("error_code", "int16"))))))),
)


@dataclass(frozen=True)
class Api:
    """One API the gateway handles: the newest version it parses and its schemas."""
    name: str
    max_version: int
    request: tuple
    response: tuple


API: dict[int, Api] = {
    PRODUCE: Api("Produce", 8, PRODUCE_REQUEST, PRODUCE_RESPONSE),
    FETCH: Api("Fetch", 11, FETCH_REQUEST, FETCH_RESPONSE),
    LIST_OFFSETS: Api("ListOffsets", 5, LIST_OFFSETS_REQUEST, LIST_OFFSETS_RESPONSE),
    METADATA: Api("Metadata", 8, METADATA_REQUEST, METADATA_RESPONSE),
    OFFSET_COMMIT: Api("OffsetCommit", 7, OFFSET_COMMIT_REQUEST, OFFSET_COMMIT_RESPONSE),
    OFFSET_FETCH: Api("OffsetFetch", 5, OFFSET_FETCH_REQUEST, OFFSET_FETCH_RESPONSE),
    FIND_COORDINATOR: Api("FindCoordinator", 2, FIND_COORDINATOR_REQUEST, FIND_COORDINATOR_RESPONSE),
    JOIN_GROUP: Api("JoinGroup", 5, GROUP_ID_FIRST, JOIN_GROUP_RESPONSE),
    HEARTBEAT: Api("Heartbeat", 3, GROUP_ID_FIRST, HEARTBEAT_RESPONSE),
    LEAVE_GROUP: Api("LeaveGroup", 3, GROUP_ID_FIRST, LEAVE_GROUP_RESPONSE),
    SYNC_GROUP: Api("SyncGroup", 3, GROUP_ID_FIRST, SYNC_GROUP_RESPONSE),
    DESCRIBE_GROUPS: Api("DescribeGroups", 4, DESCRIBE_GROUPS_REQUEST, DESCRIBE_GROUPS_RESPONSE),
    LIST_GROUPS: Api("ListGroups", 2, LIST_GROUPS_REQUEST, LIST_GROUPS_RESPONSE),
    SASL_HANDSHAKE: Api("SaslHandshake", 1, SASL_HANDSHAKE_REQUEST, SASL_HANDSHAKE_RESPONSE),
    API_VERSIONS: Api("ApiVersions", 3, (), API_VERSIONS_RESPONSE),
    CREATE_TOPICS: Api("CreateTopics", 4, CREATE_TOPICS_REQUEST, CREATE_TOPICS_RESPONSE),
    DELETE_TOPICS: Api("DeleteTopics", 3, DELETE_TOPICS_REQUEST, DELETE_TOPICS_RESPONSE),
    DELETE_RECORDS: Api("DeleteRecords", 1, DELETE_RECORDS_REQUEST, DELETE_RECORDS_RESPONSE),
    INIT_PRODUCER_ID: Api("InitProducerId", 1, INIT_PRODUCER_ID_REQUEST, INIT_PRODUCER_ID_RESPONSE),
    SASL_AUTHENTICATE: Api("SaslAuthenticate", 2, SASL_AUTHENTICATE_REQUEST, SASL_AUTHENTICATE_RESPONSE),
    CREATE_PARTITIONS: Api("CreatePartitions", 1, CREATE_PARTITIONS_REQUEST, CREATE_PARTITIONS_RESPONSE),
    DELETE_GROUPS: Api("DeleteGroups", 1, DELETE_GROUPS_REQUEST, DELETE_GROUPS_RESPONSE),
    OFFSET_DELETE: Api("OffsetDelete", 0, OFFSET_DELETE_REQUEST, OFFSET_DELETE_RESPONSE),
}
# Answered by the gateway itself whatever the broker supports: advertised even when it lists none.
GATEWAY_OWN_APIS = {SASL_HANDSHAKE: (0, 1), SASL_AUTHENTICATE: (0, 2)}
FLEXIBLE_FROM = {API_VERSIONS: 3, SASL_AUTHENTICATE: 2}  # the two flexible versions the gateway speaks
