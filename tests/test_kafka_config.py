"""The lab's Kafka client configs (webapp/kafka/config.py): pure functions of the lab's settings."""
from __future__ import annotations

import re

import pytest
from confluent_kafka import KafkaException, Producer

from webapp.kafka.config import consumer_config, producer_config


@pytest.mark.parametrize("debug, expected", [
    ("", {}),
    ("cgrp,protocol", {"debug": "cgrp,protocol", "log_level": 7}),
])
def test_a_consumer_logs_librdkafka_debug_contexts_only_when_asked(debug, expected):
    config = consumer_config("127.0.0.1:9092", "lab_x.payments", "lab-x-c1", debug=debug)
    assert {key: config[key] for key in ("debug", "log_level") if key in config} == (expected or {"log_level": 3})
    assert config["enable.auto.commit"] is False and config["auto.offset.reset"] == "earliest"


# The idempotent producer's terms (000: "acks=all e retries > 0 (e ordenação preservada via
# max.in.flight.requests.per.connection)"), as the client this lab uses enforces them.
@pytest.mark.parametrize("term, refusal", [
    ({"acks": "1"}, "`acks` must be set to `all` when `enable.idempotence` is true"),
    ({"retries": 0}, "`retries` must be set >= 1 when `enable.idempotence` is true"),
    ({"max.in.flight.requests.per.connection": 6},
     "`max.in.flight` must be set <= 5 when `enable.idempotence` is true"),
])
def test_librdkafka_refuses_an_idempotent_producer_without_its_terms(term, refusal):
    config = {**producer_config("127.0.0.1:9", idempotent=True, client_id="lab-x-producer"), **term}
    with pytest.raises(KafkaException, match=re.escape(refusal)):
        Producer(config)


def test_librdkafka_leaves_idempotence_off_unless_asked_and_the_lab_asks_for_acks_all_in_both_modes():
    """Unlike the Java client (on by default since Kafka 3.0, the source text's "default true"),
    librdkafka's default is off: the same terms are accepted when enable.idempotence is not set."""
    plain = producer_config("127.0.0.1:9", idempotent=False, client_id="lab-x-producer")
    assert plain["enable.idempotence"] is False and plain["acks"] == "all"
    assert producer_config("127.0.0.1:9", idempotent=True, client_id="lab-x-producer")["acks"] == "all"
    unset = {key: value for key, value in plain.items() if key != "enable.idempotence"}
    producer = Producer({**unset, "acks": "1", "retries": 0, "max.in.flight.requests.per.connection": 6})
    assert producer.flush(0) == 0  # created: nothing refused the terms, so idempotence was off
