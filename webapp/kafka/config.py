"""The lab's Kafka client configs: the producer's, the consumers' and the group timeouts.

Every client of a lab carries a client id that names the lab (``Lab.client_id``,
``Lab.producer_client_id``): the fault proxy matches a lab's faults, and chaos its cuts, by it.
"""
from __future__ import annotations

from ..domain.group_health import DEFAULT_MAX_POLL_INTERVAL_MS, SESSION_TIMEOUT_MS

# Short group timeouts: on Tansu the first join waits about half the session timeout, and they
# make the hand-over after a kill or a freeze visible within seconds (docs/concepts/broker.md).
GROUP_TIMEOUTS = {"session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 1000}


def _quiet(config: dict) -> dict:
    # librdkafka logs connection churn to stderr; the lab reports broker state on screen instead.
    return {"log_level": 3, **config}


def producer_config(bootstrap_servers: str, idempotent: bool, max_in_flight: int | None = None, *,
                    client_id: str, acks: str = "all", retries: int | None = None) -> dict:
    """``max_in_flight``: max.in.flight.requests.per.connection (None: librdkafka's default);
    ``client_id``: the lab's producer client id (``Lab.producer_client_id``); ``acks`` (the lab's:
    all) and ``retries`` (None: librdkafka's default), as a learner may ask for them to see
    librdkafka refuse an idempotent producer without its terms."""
    in_flight = {} if max_in_flight is None else {"max.in.flight.requests.per.connection": max_in_flight}
    retried = {} if retries is None else {"retries": retries}
    return _quiet({
        **in_flight,
        **retried,
        "bootstrap.servers": bootstrap_servers,
        "client.id": client_id,
        "enable.idempotence": idempotent,
        "acks": acks,
        # Each publish is its own batch: Tansu reports a wrong high watermark for batches of
        # several records (docs/concepts/broker.md), and a class reads offsets one by one anyway.
        "linger.ms": 0,
        "retry.backoff.ms": 200,
        "message.timeout.ms": 15000,
    })


def consumer_config(bootstrap_servers: str, group_id: str, client_id: str,
                    max_poll_interval_ms: int = DEFAULT_MAX_POLL_INTERVAL_MS, debug: str = "") -> dict:
    """``max_poll_interval_ms``: also the rebalance timeout librdkafka sends with JoinGroup. The
    consumer never spends that long between two polls (domain/group_health.py: its statements and
    lock waits are bounded below it, and its waits poll). ``debug``: librdkafka's debug contexts
    (LAB_KAFKA_DEBUG), logged to the consumer's output at level 7."""
    traced = {"debug": debug, "log_level": 7} if debug else {}
    return _quiet({
        "bootstrap.servers": bootstrap_servers,
        "group.id": group_id,
        "client.id": client_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        # Step mode may hold one message for minutes while a class discusses it: it polls meanwhile,
        # its partitions paused (consumer/loop.py keep_alive), so it stays in the group.
        "max.poll.interval.ms": max_poll_interval_ms,
        **GROUP_TIMEOUTS,
        **traced,
    })
