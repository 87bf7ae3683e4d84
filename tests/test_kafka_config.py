"""The lab's Kafka client configs (webapp/kafka/config.py): pure functions of the lab's settings."""
from __future__ import annotations

import pytest

from webapp.kafka.config import consumer_config


@pytest.mark.parametrize("debug, expected", [
    ("", {}),
    ("cgrp,protocol", {"debug": "cgrp,protocol", "log_level": 7}),
])
def test_a_consumer_logs_librdkafka_debug_contexts_only_when_asked(debug, expected):
    config = consumer_config("127.0.0.1:9092", "lab_x.payments", "lab-x-c1", debug=debug)
    assert {key: config[key] for key in ("debug", "log_level") if key in config} == (expected or {"log_level": 3})
    assert config["enable.auto.commit"] is False and config["auto.offset.reset"] == "earliest"
