"""The admin side of Kafka: the admin client, topics (create, delete, count partitions), a group's
committed offsets, offset resets (OffsetReset, target_offsets, alter_offsets), the broker's health,
and a lane's own principal on Apache Kafka (create_lane_principal, drop_lane_principal: SCRAM user, ACLs).
"""
from __future__ import annotations

import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from datetime import datetime

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    OffsetSpec,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from ..domain.vocabulary import OFFSET_RESET_MODES
from .config import _quiet

ADMIN_TIMEOUT = 10.0


def admin_client(bootstrap_servers: str) -> AdminClient:
    return AdminClient(_quiet({"bootstrap.servers": bootstrap_servers}))


def ensure_topics(admin: AdminClient, topics: dict[str, int]) -> list[str]:
    """Create the missing topics of ``{name: partitions}``; return the names created."""
    existing = admin.list_topics(timeout=ADMIN_TIMEOUT).topics
    # Replication factor -1: the broker's default.replication.factor (1 on one broker, 3 on the
    # docker-compose `cluster` profile), so the lab never hard-codes a cluster's size.
    missing = [NewTopic(name, partitions, -1) for name, partitions in topics.items() if name not in existing]
    if not missing:
        return []
    created = []
    for name, future in admin.create_topics(missing, operation_timeout=ADMIN_TIMEOUT).items():
        try:
            future.result()
            created.append(name)
        except KafkaException as error:
            # Made meanwhile by another client (an agent, the log reader): the topic is there, as asked.
            if error.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return created


def delete_topics(admin: AdminClient, names: list[str]) -> list[str]:
    existing = admin.list_topics(timeout=ADMIN_TIMEOUT).topics
    doomed = [name for name in names if name in existing]
    if doomed:
        for future in admin.delete_topics(doomed, operation_timeout=ADMIN_TIMEOUT).values():
            future.result()
    return doomed


def partition_count(admin: AdminClient, topic: str) -> int:
    metadata = admin.list_topics(topic, timeout=ADMIN_TIMEOUT).topics.get(topic)
    if metadata is None or metadata.error is not None:
        raise KafkaException(f"topic {topic} does not exist")
    return len(metadata.partitions)


def committed_offsets(admin: AdminClient, group_id: str, topic: str) -> dict[int, int | None]:
    """The group's committed offset per partition of ``topic`` (None: nothing committed)."""
    offsets = committed_offsets_of(admin, [(group_id, topic)])[(group_id, topic)]
    if isinstance(offsets, KafkaException):
        raise offsets
    return offsets


def group_state(admin: AdminClient, group_id: str) -> str:
    """The broker's state of ``group_id``: EMPTY, STABLE, PREPARING_REBALANCE, DEAD…, or UNKNOWN
    when it does not say in time."""
    future = admin.describe_consumer_groups([group_id], request_timeout=ADMIN_TIMEOUT)[group_id]
    try:
        return future.result(timeout=ADMIN_TIMEOUT + 5).state.name
    except (KafkaException, FutureTimeout):
        return "UNKNOWN"


def committed_offsets_of(admin: AdminClient, groups: list[tuple[str, str]]
                         ) -> dict[tuple[str, str], dict[int, int | None] | KafkaException]:
    """:func:`committed_offsets` of many (group, topic) pairs, their requests in flight together
    (one broker round trip for all rather than one each: a class's thirty labs are snapshotted
    every second). A pair whose answer failed maps to its KafkaException."""
    if not groups:
        return {}
    topics = admin.list_topics(timeout=ADMIN_TIMEOUT).topics
    futures = {pair: admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(pair[0])],
                                                       request_timeout=ADMIN_TIMEOUT)[pair[0]]
               for pair in groups}
    answers: dict[tuple[str, str], dict[int, int | None] | KafkaException] = {}
    # One bound for all: the requests are in flight together, and a broker that never answers must
    # not hold up the agent's loop, which snapshots every lab's offsets (seen on Tansu once:
    # docs/concepts/broker.md).
    deadline = time.monotonic() + ADMIN_TIMEOUT + 5
    for (group_id, topic), future in futures.items():
        metadata = topics.get(topic)
        try:
            if metadata is None or metadata.error is not None:
                raise KafkaException(f"topic {topic} does not exist")
            result = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except KafkaException as error:
            answers[(group_id, topic)] = error
            continue
        except FutureTimeout:
            answers[(group_id, topic)] = KafkaException(f"the broker did not answer for group {group_id} "
                                                        f"within {ADMIN_TIMEOUT + 5:.0f} s")
            future.cancel()
            continue
        offsets: dict[int, int | None] = {p: None for p in range(len(metadata.partitions))}
        for tp in result.topic_partitions:
            if tp.topic == topic:
                offsets[tp.partition] = tp.offset if tp.offset >= 0 else None
        answers[(group_id, topic)] = offsets
    return answers


@dataclass(frozen=True)
class OffsetReset:
    """Where to move a group: ``earliest``, ``offset`` (per partition), ``back`` N, ``timestamp``, or
    ``expire`` (no committed offset at all: the members start where auto.offset.reset says)."""
    mode: str
    offsets: dict[int, int] | None = None
    back: int | None = None
    timestamp: datetime | None = None

    MODES = OFFSET_RESET_MODES

    def __post_init__(self):
        if self.mode not in self.MODES:
            raise ValueError(f"mode must be one of {', '.join(self.MODES)}")
        if self.mode == "offset" and not self.offsets:
            raise ValueError("offsets: give at least one partition and offset")
        if self.mode == "back" and (self.back is None or self.back < 1):
            raise ValueError("back must be a whole number of at least 1")
        if self.mode == "timestamp" and self.timestamp is None:
            raise ValueError("timestamp is required")


def _listed_offsets(admin: AdminClient, topic: str, partitions: list[int], spec: OffsetSpec) -> dict[int, int]:
    request = {TopicPartition(topic, p): spec for p in partitions}
    return {tp.partition: future.result().offset for tp, future in admin.list_offsets(request).items()}


def target_offsets(admin: AdminClient, group_id: str, topic: str, reset: OffsetReset) -> dict[int, int]:
    """The offset per partition that ``reset`` means for this group now."""
    partitions = list(range(partition_count(admin, topic)))
    earliest = _listed_offsets(admin, topic, partitions, OffsetSpec.earliest())
    if reset.mode == "earliest":
        return earliest
    if reset.mode == "offset":
        unknown = sorted(set(reset.offsets) - set(partitions))
        if unknown:
            raise ValueError(f"partition(s) {unknown} do not exist; {topic} has {len(partitions)}")
        return {p: max(o, earliest[p]) for p, o in reset.offsets.items()}
    if reset.mode == "back":
        committed = committed_offsets(admin, group_id, topic)
        return {p: max(earliest[p], c - reset.back) for p, c in committed.items() if c is not None}
    millis = int(reset.timestamp.timestamp() * 1000)
    by_time = _listed_offsets(admin, topic, partitions, OffsetSpec.for_timestamp(millis))
    # -1 means no record at or after that time: start past the end (from the group's view, nothing to redo).
    return {p: o for p, o in by_time.items() if o >= 0}


def alter_offsets(admin: AdminClient, group_id: str, topic: str, offsets: dict[int, int]) -> None:
    """Set the group's committed offsets. Kafka accepts this only while the group is empty."""
    if not offsets:
        return
    request = ConsumerGroupTopicPartitions(group_id, [TopicPartition(topic, p, o) for p, o in offsets.items()])
    admin.alter_consumer_group_offsets([request])[group_id].result()


def broker_error(admin: AdminClient, timeout: float = 3.0) -> str | None:
    """None when the broker answers a metadata request, else why not."""
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as error:
        return f"Kafka does not answer: {error.args[0].str() if error.args else error}"
    if not metadata.brokers:
        return "Kafka answered with no brokers"
    return None


# --- a lane's own Kafka principal on Apache Kafka: SCRAM credentials and ACLs ------------------------
# Compose's LEARNERS listener (SASL_PLAINTEXT, SCRAM-SHA-512, StandardAuthorizer) authenticates a
# learner's own code as User:<the lane's role name>; these ACLs are all it may do. The embedded
# broker (Tansu) has no ACLs: there the fault proxy's learners' gateway enforces the same rights
# (webapp/faultproxy/gateway.py). Call these on Apache Kafka only: against Tansu, librdkafka 2.16
# aborts the whole process on CreateAcls' answer (measured), and Tansu would enforce nothing.

LANE_SCRAM_MECHANISM = ScramMechanism.SCRAM_SHA_512
LANE_SCRAM_ITERATIONS = 8192  # Kafka's minimum is 4096


def lane_acl_bindings(username: str, topic: str, group_id: str) -> list[AclBinding]:
    """The ACLs of a lane's principal: READ and DESCRIBE on its lab's topic (literal), READ on its
    group (literal) and on the lab's moves of it to fresh ids (prefixed ``<group_id>.r``: no other
    lane's group starts so, as neither a lab's nor a lane's name holds a dot). READ on a group
    implies DESCRIBE; nothing grants WRITE, CREATE, DELETE, ALTER or any cluster operation."""
    principal = f"User:{username}"

    def allow(resource: ResourceType, name: str, pattern: ResourcePatternType, operation: AclOperation) -> AclBinding:
        return AclBinding(resource, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)
    return [allow(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, AclOperation.READ),
            allow(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, AclOperation.DESCRIBE),
            allow(ResourceType.GROUP, group_id, ResourcePatternType.LITERAL, AclOperation.READ),
            allow(ResourceType.GROUP, f"{group_id}.r", ResourcePatternType.PREFIXED, AclOperation.READ)]


def upsert_scram_user(admin: AdminClient, username: str, password: str) -> None:
    """Create ``username``'s SCRAM-SHA-512 credential, or replace its password."""
    credential = ScramCredentialInfo(LANE_SCRAM_MECHANISM, LANE_SCRAM_ITERATIONS)
    futures = admin.alter_user_scram_credentials([UserScramCredentialUpsertion(username, credential,
                                                                               password.encode("utf-8"))])
    for future in futures.values():
        future.result(timeout=ADMIN_TIMEOUT)


def create_lane_principal(admin: AdminClient, username: str, password: str, topic: str, group_id: str) -> None:
    """A lane made: its SCRAM user (``username``, the lane's role name) and its ACLs
    (:func:`lane_acl_bindings`). Again for the same lane: the password replaced, the ACLs as they were."""
    upsert_scram_user(admin, username, password)
    for future in admin.create_acls(lane_acl_bindings(username, topic, group_id),
                                    request_timeout=ADMIN_TIMEOUT).values():
        future.result(timeout=ADMIN_TIMEOUT)


def drop_lane_principal(admin: AdminClient, username: str) -> None:
    """A lane dropped: every ACL of its principal, whatever resource, and its SCRAM credential."""
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, f"User:{username}", None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    for future in admin.delete_acls([everything], request_timeout=ADMIN_TIMEOUT).values():
        future.result(timeout=ADMIN_TIMEOUT)
    futures = admin.alter_user_scram_credentials([UserScramCredentialDeletion(username, LANE_SCRAM_MECHANISM)])
    for future in futures.values():
        try:
            future.result(timeout=ADMIN_TIMEOUT)
        except KafkaException as error:
            if error.args[0].code() != KafkaError.RESOURCE_NOT_FOUND:  # no credential left: dropped already
                raise


def set_topic_configs(admin: AdminClient, topic: str, configs: dict[str, str]) -> None:
    """Set ``configs`` (``retention.ms``, ``segment.ms``…) on ``topic``, each alone (an incremental
    alter: the topic's other settings stay); KafkaException when the broker refuses."""
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET) for name, value in configs.items()])
    future = admin.incremental_alter_configs([resource], request_timeout=ADMIN_TIMEOUT)[resource]
    try:
        future.result(timeout=ADMIN_TIMEOUT + 5)
    except FutureTimeout:
        future.cancel()
        raise KafkaException(f"the broker did not answer within {ADMIN_TIMEOUT + 5:.0f} s") from None
