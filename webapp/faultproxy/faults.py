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

Every fault is one lab's: armed for a lab, it acts only on requests whose Kafka client
id names that lab (``Lab.of_client_id``: ``lab-<lab>-<consumer>``, ``lab-<lab>.producer``); any
other client's requests pass untouched, whatever any lab armed.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

from ..domain.lab import Lab
from .protocol import RequestHeader

log = logging.getLogger("idempotency_lab.faultproxy")

# After a dropped Produce response, how long the connection stays open with its answers held
# back. Closing at once made the lesson depend on the machine's pace: on a busy machine a burst's
# first request was often alone in flight when its answer was lost, so its retry landed before
# the burst's later records and nothing came out of order (one guided run in a full test suite).
# Held, what the producer sends meanwhile (up to its max.in.flight) is written first.
DROP_HOLD_SECONDS = 0.5


@dataclass
class LabFaults:
    """One lab's faults, and what the proxy did to that lab's clients."""
    drop_produce_responses: int = 0
    delay_ms: int = 0
    # The lab's consumers (Kafka client ids) whose OffsetCommit requests never reach the broker.
    blocked_commit_clients: frozenset[str] = frozenset()
    produce_requests: int = 0
    responses_dropped: int = 0
    responses_delayed: int = 0
    commits_blocked: int = 0
    connections_cut: int = 0

    @property
    def armed(self) -> bool:
        return self.drop_produce_responses > 0 or self.delay_ms > 0 or bool(self.blocked_commit_clients)

    def disarm(self) -> None:
        self.drop_produce_responses, self.delay_ms, self.blocked_commit_clients = 0, 0, frozenset()


def lab_of(client_id: str | None) -> str | None:
    """The name of the lab a request's client id names; None for a client of no lab."""
    lab = Lab.of_client_id(client_id)
    return lab.name if lab is not None else None


class Faults:
    """What the proxy does to Produce responses and OffsetCommit requests, kept in memory, per lab.

    The proxy asks it once per Produce response and once per OffsetCommit request; each question
    is answered from the faults of the lab the request's client id names. The PostgreSQL-backed
    subclass makes the same decisions from the labs' control rows.
    """

    def __init__(self) -> None:
        self.labs: dict[str, LabFaults] = {}
        # The whole proxy's counters, every client's.
        self.produce_requests = 0
        self.responses_dropped = 0
        self.responses_delayed = 0
        self.commits_blocked = 0
        self.connections = 0  # client connections open now
        self.connections_cut = 0
        # Chaos: set by the proxy, closes the connections of the given client ids; the count.
        self.cut_clients: Callable[[list[str]], int] | None = None
        # Set by the proxy: the client id of each connection it carries now (one entry per connection).
        self.connected_clients: Callable[[], list[str]] = list

    def of(self, lab: str) -> LabFaults:
        """The lab's faults (none armed, for a lab not seen before)."""
        return self.labs.setdefault(lab, LabFaults())

    def of_request(self, request: RequestHeader) -> LabFaults | None:
        """The faults of the lab whose client sent ``request``; None for a client of no lab."""
        lab = lab_of(request.client_id)
        return self.of(lab) if lab is not None else None

    def arm(self, lab: str, drop_produce_responses: int = 0, delay_ms: int = 0) -> None:
        """Arm (both 0: disarm) the Produce faults of ``lab``'s requests."""
        faults = self.of(lab)
        faults.drop_produce_responses, faults.delay_ms = drop_produce_responses, delay_ms

    def block_commits(self, lab: str, client_ids: set[str] | frozenset[str]) -> None:
        """Block the OffsetCommit requests of these clients of ``lab`` (empty: block none); a client
        id of another lab is ignored: one lab cannot block another's commits."""
        self.of(lab).blocked_commit_clients = frozenset(c for c in client_ids if lab_of(c) == lab)

    def cut(self, lab: str, client_ids: list[str]) -> int:
        """Close the connections of these clients of ``lab`` (others' ids are ignored); how many."""
        own = [client for client in client_ids if lab_of(client) == lab]
        count = self.cut_clients(own) if self.cut_clients is not None and own else 0
        self.of(lab).connections_cut += count
        self.connections_cut += count
        return count

    def saw_produce_request(self, request: RequestHeader) -> None:
        self.produce_requests += 1
        faults = self.of_request(request)
        if faults is not None:
            faults.produce_requests += 1

    async def take_drop(self, request: RequestHeader) -> bool:
        """True when this Produce response must be dropped (and one drop of its lab is used up)."""
        faults = self.of_request(request)
        if faults is None or faults.drop_produce_responses <= 0:
            return False
        faults.drop_produce_responses -= 1
        faults.responses_dropped += 1
        self.responses_dropped += 1
        return True

    def delay_for(self, request: RequestHeader) -> float:
        """Seconds to hold this Produce response; counts it as delayed when above zero."""
        faults = self.of_request(request)
        if faults is None or faults.delay_ms <= 0:
            return 0.0
        faults.responses_delayed += 1
        self.responses_delayed += 1
        return faults.delay_ms / 1000

    async def dropped(self, request: RequestHeader, peer: str) -> None:
        """Called for a dropped response, just before the client's connection is closed."""
        log.info("dropped the response to Produce v%s correlation id %s from %s (%s)",
                 request.api_version, request.correlation_id, request.client_id, peer)

    def blocks_commit(self, request: RequestHeader) -> bool:
        """True when this OffsetCommit request must not reach the broker (and counts it)."""
        faults = self.of_request(request)
        if faults is None or request.client_id not in faults.blocked_commit_clients:
            return False
        faults.commits_blocked += 1
        self.commits_blocked += 1
        return True

    async def commit_blocked(self, request: RequestHeader, peer: str) -> None:
        """Called for a blocked OffsetCommit, just before the client's connection is closed."""
        log.info("blocked OffsetCommit v%s correlation id %s from %s (%s)",
                 request.api_version, request.correlation_id, request.client_id, peer)
