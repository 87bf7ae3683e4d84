"""What a fault does, kept in memory (Faults): the proxy asks it once per Produce response and
once per OffsetCommit request.

Faults on Produce responses (api_key 0):
- drop the next N: the Produce request reaches the broker (which writes the records), and
  when its response comes back the proxy holds back every answer on that connection for
  ``DROP_HOLD_SECONDS`` (the client's later requests still reach the broker), then closes it.
  librdkafka sees lost acknowledgements and retries every request in flight; the log holds those
  records twice, the first behind later ones, unless ``enable.idempotence`` lets the broker
  recognise the retries.
- delay by T ms: hold each Produce response for T ms before returning it.
One fault on OffsetCommit requests (api_key 8), per Kafka client id, for a while: the proxy
closes a connection of that client that carries an OffsetCommit, without forwarding the request
(the path to the group coordinator is broken, as a network fault would break it). The broker
never sees the commit; fetches, on the client's other connection, flow. Commit mode's lesson:
a synchronous commit says so and the consumer waits; an asynchronous one has already returned.
Disarmed, it is a plain pass-through.
"""
from __future__ import annotations

import logging
from typing import Callable

from .protocol import RequestHeader

log = logging.getLogger("idempotency_lab.faultproxy")

# After a dropped Produce response, how long the connection stays open with its answers held
# back. Closing at once made the lesson depend on the machine's pace: on a busy machine a burst's
# first request was often alone in flight when its answer was lost, so its retry landed before
# the burst's later records and nothing came out of order (one guided run in a full test suite).
# Held, what the producer sends meanwhile (up to its max.in.flight) is written first.
DROP_HOLD_SECONDS = 0.5


class Faults:
    """What the proxy does to Produce responses, kept in memory.

    The proxy asks it once per Produce response. The PostgreSQL-backed subclass makes the same
    decisions from the lab's control row.
    """

    def __init__(self) -> None:
        self.drop_produce_responses = 0
        self.delay_ms = 0
        self.produce_requests = 0
        self.responses_dropped = 0
        self.responses_delayed = 0
        self.connections = 0  # client connections open now
        self.connections_cut = 0
        # Kafka client ids whose OffsetCommit requests never reach the broker; how many were stopped.
        self.blocked_commit_clients: frozenset[str] = frozenset()
        self.commits_blocked = 0
        # Chaos (issue 15): set by the proxy, closes the connections of the given client ids; the count.
        self.cut_clients: Callable[[list[str]], int] | None = None
        # Set by the proxy: the client ids of the connections it carries now.
        self.connected_clients: Callable[[], set[str]] = set

    def arm(self, drop_produce_responses: int = 0, delay_ms: int = 0) -> None:
        self.drop_produce_responses = drop_produce_responses
        self.delay_ms = delay_ms

    @property
    def armed(self) -> bool:
        return self.drop_produce_responses > 0 or self.delay_ms > 0

    def saw_produce_request(self, request: RequestHeader) -> None:
        self.produce_requests += 1

    async def take_drop(self, request: RequestHeader) -> bool:
        """True when this Produce response must be dropped (and one drop is used up)."""
        if self.drop_produce_responses <= 0:
            return False
        self.drop_produce_responses -= 1
        self.responses_dropped += 1
        return True

    def delay_for(self, request: RequestHeader) -> float:
        """Seconds to hold this Produce response; counts it as delayed when above zero."""
        if self.delay_ms <= 0:
            return 0.0
        self.responses_delayed += 1
        return self.delay_ms / 1000

    async def dropped(self, request: RequestHeader, peer: str) -> None:
        """Called for a dropped response, just before the client's connection is closed."""
        log.info("dropped the response to Produce v%s correlation id %s from %s (%s)",
                 request.api_version, request.correlation_id, request.client_id, peer)

    def blocks_commit(self, request: RequestHeader) -> bool:
        """True when this OffsetCommit request must not reach the broker (and counts it)."""
        if request.client_id not in self.blocked_commit_clients:
            return False
        self.commits_blocked += 1
        return True

    async def commit_blocked(self, request: RequestHeader, peer: str) -> None:
        """Called for a blocked OffsetCommit, just before the client's connection is closed."""
        log.info("blocked OffsetCommit v%s correlation id %s from %s (%s)",
                 request.api_version, request.correlation_id, request.client_id, peer)
