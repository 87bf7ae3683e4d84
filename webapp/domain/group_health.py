"""A consumer group's time bounds and its health, as pure functions of what the lab records.

The bounds: librdkafka runs the group's heartbeats on a thread of its own, so a member
stuck in application code keeps its place in the group while it cannot rejoin a rebalance. The
broker waits up to the rebalance timeout for it (librdkafka sends max.poll.interval.ms as the
rebalance timeout), and on the embedded Tansu such a rebalance never completes, fresh members
included (docs/concepts/broker.md). So nothing a consumer does between two polls may take as long as
``max.poll.interval.ms``: every statement on its effects connection ends by ``statement_timeout``
and every lock wait by ``lock_timeout``, both well below it, and every wait (step mode, a backoff,
a retried commit, a notification retried) keeps calling ``poll()`` with its partitions paused.

The health: stable, rebalancing, stalled, recovering (and empty: no live member). A rebalance
legitimately lasts until every member has rejoined, up to the rebalance timeout, plus a session
timeout for a member that died without leaving: longer than that without an assignment, or
without progress while records wait, no correct broker is still rebalancing, and the group is
stalled (``stall_after_seconds``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

# max.poll.interval.ms of the lab's consumers unless a lab sets its own (settings key
# ``max_poll_interval_ms``): the rebalance timeout too. Short, so that a wedged rebalance is seen and
# recovered within a class's attention span; long enough for the slowest legitimate step between
# two polls (a dead-letter produce waits up to 15 s for its acknowledgement).
DEFAULT_MAX_POLL_INTERVAL_MS = 30_000
MAX_POLL_INTERVAL_SETTING = "max_poll_interval_ms"
# session.timeout.ms of the lab's consumers (kafka/config.py GROUP_TIMEOUTS); librdkafka refuses a
# max.poll.interval.ms below it.
SESSION_TIMEOUT_MS = 6_000

STABLE, REBALANCING, STALLED, RECOVERING, EMPTY = "stable", "rebalancing", "stalled", "recovering", "empty"
HEALTH_STATES = (STABLE, REBALANCING, STALLED, RECOVERING, EMPTY)


def max_poll_interval_ms(setting: object) -> int:
    """The lab's max.poll.interval.ms: its setting when it is a whole number not below the session
    timeout, else the default."""
    try:
        value = int(setting)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return DEFAULT_MAX_POLL_INTERVAL_MS
    return value if value >= SESSION_TIMEOUT_MS else DEFAULT_MAX_POLL_INTERVAL_MS


def statement_timeout_ms(poll_interval_ms: int) -> int:
    """The effects connection's statement_timeout: a third of the poll interval, so a statement
    cancelled, its transaction rolled back and the retry's backoff all fit inside it."""
    return poll_interval_ms // 3


def lock_timeout_ms(lab_setting_ms: int, poll_interval_ms: int) -> int:
    """The effects connection's lock_timeout: the lab's own when it is set and shorter, else a
    quarter of the poll interval (below statement_timeout, so a lock wait says it was a lock)."""
    bound = poll_interval_ms // 4
    return lab_setting_ms if 0 < lab_setting_ms < bound else bound


def stall_after_seconds(poll_interval_ms: int, session_timeout_ms: int = SESSION_TIMEOUT_MS) -> float:
    """How long a group may go without an assignment (or without progress while records wait)
    before it is stalled: the longest a correct rebalance can take (the rebalance timeout, which is
    max.poll.interval.ms) plus a session timeout for a member that died without leaving."""
    return (poll_interval_ms + session_timeout_ms) / 1000


@dataclass(frozen=True)
class Member:
    """One consumer of the group as it last reported."""
    name: str
    state: str                      # ConsumerState value
    fresh: bool                     # its heartbeat is recent
    assigned: tuple[int, ...]
    assigned_at: datetime | None    # when its assignment last changed (or its process started)
    progressed_at: datetime | None  # when its position last moved


@dataclass(frozen=True)
class GroupFacts:
    group_id: str
    partitions: int
    members: tuple[Member, ...]
    pending: int                    # records in the log past the group's committed offsets
    now: datetime
    stall_after: float              # seconds
    created_at: datetime | None = None
    recovery_started_at: datetime | None = None
    last_health: str | None = None  # the last transition written to the timeline


@dataclass
class Health:
    group_id: str
    state: str
    sentence: str
    since_seconds: float | None = None
    members_alive: int = 0
    members_held: int = 0           # frozen or stepping: held by the lab on purpose
    assigned: list[int] = field(default_factory=list)
    pending: int = 0
    stall_after: float = 0.0

    def as_dict(self) -> dict:
        return {"state": self.state, "sentence": self.sentence, "since_seconds": self.since_seconds,
                "members_alive": self.members_alive, "members_held": self.members_held,
                "assigned": self.assigned, "pending": self.pending, "stall_after_seconds": self.stall_after}


HELD_STATES = ("frozen", "stepping")
ALIVE_STATES = ("starting", "running")


def _latest(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None


def _records(n: int) -> str:
    return f"{n:,} record{'s' if n != 1 else ''}"


def classify(facts: GroupFacts) -> Health:
    """The group's health from its members' reports and the records waiting for it."""
    local = facts.group_id.split(".", 1)[-1]
    alive = [m for m in facts.members if m.state in ALIVE_STATES and m.fresh]
    held = [m for m in facts.members if m.state in HELD_STATES]
    assigned = sorted({p for m in alive for p in m.assigned})
    health = Health(facts.group_id, STABLE, "", members_alive=len(alive), members_held=len(held),
                    assigned=assigned, pending=facts.pending, stall_after=facts.stall_after)
    if not alive:
        health.state = EMPTY
        health.sentence = (f"Group {local}: {len(held)} member(s) held by the lab (frozen or stepping), none alive"
                           if held else f"Group {local} has no live member")
        return health
    # Any member's assignment changing (or a member starting or ending) starts a rebalance's clock.
    changed = _latest(facts.created_at, *(m.assigned_at for m in facts.members))
    since_change = (facts.now - changed).total_seconds() if changed else None
    progressed = _latest(changed, *(m.progressed_at for m in facts.members))
    since_progress = (facts.now - progressed).total_seconds() if progressed else None
    members = f"{len(alive)} member{'s' if len(alive) != 1 else ''} alive"
    wait = f"{_records(facts.pending)} wait" if facts.pending else "no record waits yet"
    recovering = facts.recovery_started_at is not None and (changed is None or facts.recovery_started_at >= changed
                                                             or facts.last_health in (STALLED, RECOVERING))
    if len(assigned) < facts.partitions:
        unowned = facts.partitions - len(assigned)
        what = "no partition assigned" if not assigned else f"{unowned} of {facts.partitions} partitions unassigned"
        if since_change is not None and since_change >= facts.stall_after:
            health.state, health.since_seconds = STALLED, since_change
            health.sentence = (f"Group {local} is stalled: {members}, {what} for {int(since_change)} s; {wait}. "
                               "No rebalance of the lab's consumers may take this long (max.poll.interval.ms + "
                               "session.timeout.ms): recover it")
            return health
        health.state = RECOVERING if recovering else REBALANCING
        health.since_seconds = since_change
        health.sentence = (f"Group {local} is {'recovering' if recovering else 'rebalancing'}: {members}, {what} "
                           f"for {int(since_change or 0)} s (stalled after {facts.stall_after:g} s)")
        return health
    if facts.pending and since_progress is not None and since_progress >= facts.stall_after:
        health.state, health.since_seconds = STALLED, since_progress
        health.sentence = (f"Group {local} is stalled: {members} with every partition assigned, {wait} and none "
                           f"was consumed for {int(since_progress)} s. Recover it")
        return health
    if recovering and facts.last_health in (STALLED, RECOVERING) and facts.pending:
        health.state, health.since_seconds = RECOVERING, since_change
        health.sentence = f"Group {local} is recovering: every partition assigned, {wait}"
        return health
    health.since_seconds = since_change
    health.sentence = f"Group {local} is stable: {members}, every partition assigned" + (
        f", {wait}" if facts.pending else "")
    return health
