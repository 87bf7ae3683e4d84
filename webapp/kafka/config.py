"""The lab's Kafka client configs: the producer's, the consumers', the group timeouts and the
producer's client id (the one chaos cuts by).
"""
from __future__ import annotations

# Short group timeouts: on Tansu the first join waits about half the session timeout, and they
# make the hand-over after a kill or a freeze visible within seconds (BROKER.md).
GROUP_TIMEOUTS = {"session.timeout.ms": 6000, "heartbeat.interval.ms": 1000}


def _quiet(config: dict) -> dict:
    # librdkafka logs connection churn to stderr; the lab reports broker state on screen instead.
    return {"log_level": 3, **config}


# The lab's producer as the fault proxy sees it: chaos cuts its connections by this id.
PRODUCER_CLIENT_ID = "lab-producer"


def producer_config(bootstrap_servers: str, idempotent: bool, max_in_flight: int | None = None) -> dict:
    """``max_in_flight``: max.in.flight.requests.per.connection (None: librdkafka's default)."""
    in_flight = {} if max_in_flight is None else {"max.in.flight.requests.per.connection": max_in_flight}
    return _quiet({
        **in_flight,
        "bootstrap.servers": bootstrap_servers,
        "client.id": PRODUCER_CLIENT_ID,
        "enable.idempotence": idempotent,
        "acks": "all",
        # Each publish is its own batch: Tansu reports a wrong high watermark for batches of
        # several records (BROKER.md), and a class reads offsets one by one anyway.
        "linger.ms": 0,
        "retry.backoff.ms": 200,
        "message.timeout.ms": 15000,
    })


def consumer_config(bootstrap_servers: str, group_id: str, client_id: str) -> dict:
    return _quiet({
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Step mode may hold one message for minutes while a class discusses it.
        "max.poll.interval.ms": 600000,
        **GROUP_TIMEOUTS,
    })
