"""The committer's reading of a failed commit (webapp/consumer/commit.py); its commits against the
broker, in each commit mode, are tests/test_consumer.py's and tests/test_broker.py's."""
from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from webapp.consumer.commit import RETRIABLE_COMMIT_ERRORS, describe_offsets, kafka_reason, where_on_the_timeline


def test_a_commit_that_fences_the_consumer_is_not_retried_one_that_did_not_arrive_is():
    assert KafkaError.UNKNOWN_MEMBER_ID not in RETRIABLE_COMMIT_ERRORS
    assert KafkaError.ILLEGAL_GENERATION not in RETRIABLE_COMMIT_ERRORS
    assert KafkaError.REBALANCE_IN_PROGRESS not in RETRIABLE_COMMIT_ERRORS
    assert {KafkaError._TRANSPORT, KafkaError.COORDINATOR_NOT_AVAILABLE} <= RETRIABLE_COMMIT_ERRORS


def test_the_reason_names_librdkafkas_error_or_says_the_text_it_was_given():
    error, reason = kafka_reason(KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION, "stale generation")))
    assert error.code() == KafkaError.ILLEGAL_GENERATION
    assert reason == "ILLEGAL_GENERATION: stale generation"
    assert kafka_reason(KafkaException("no error object")) == (None, "no error object")


def test_the_timeline_places_a_commit_at_the_last_record_it_covers():
    offsets = [TopicPartition("t", 2, 8), TopicPartition("t", 0, 3)]
    assert describe_offsets(offsets) == "offset 8 on partition 2, offset 3 on partition 0"
    assert where_on_the_timeline(offsets) == {"partition": 2, "offset": 7}
    assert where_on_the_timeline([]) == {"partition": None, "offset": None}
