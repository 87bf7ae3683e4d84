"""Statements on ``lab_control.commands``: the queue between the web (and CLI) and the lab agents.

A command is ``pending`` until an agent claims it (``running``, with ``claimed_by`` and a lease the
claiming agent renews with each heartbeat), then ``done`` or ``failed``. The web inserts and reads;
the agents claim, renew, finish and reap (agent/queue.py holds the policy).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, and_, func, literal, or_, select, update

from .tables import agents as AGENTS
from .tables import commands as T

CHANNEL = "lab_commands"
# NOTIFYed with a command's id when it is done or failed, on commit: whoever waits for it wakes then.
DONE_CHANNEL = "lab_command_done"

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
# How long a patient waiter (a guided step) waits for a command queued at a live agent or being
# carried out; a command still pending after it is failed by the reaper (nobody waits for it).
PATIENCE_SECONDS = 600.0


def _seconds(seconds: float):
    return literal(timedelta(seconds=seconds))


@dataclass(frozen=True)
class Claimed:
    id: int
    lab: str
    verb: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Orphan:
    """A command left behind by an agent: its id, whom it waited for or was claimed by, the status,
    and that agent's heartbeat age in seconds (None: the agent has no row any more)."""
    id: int
    lab: str
    verb: str
    status: str
    agent_id: str | None
    age: float | None


# --- the web's side -------------------------------------------------------------------------

def insert(conn: Connection, lab: str, verb: str, args: dict[str, Any], agent_id: str | None) -> int:
    """A pending command, and a NOTIFY that wakes the agents when the transaction commits."""
    command_id = conn.execute(T.insert().values(lab=lab, verb=verb, args=args, agent_id=agent_id, status=PENDING)
                              .returning(T.c.id)).scalar_one()
    conn.execute(select(func.pg_notify(CHANNEL, str(command_id))))
    return command_id


def outcome(conn: Connection, command_id: int) -> tuple[str, dict[str, Any] | None, str | None]:
    """(status, result, error) of one command."""
    return tuple(conn.execute(select(T.c.status, T.c.result, T.c.error).where(T.c.id == command_id)).one())


def withdraw(conn: Connection, command_id: int, reason: str) -> bool:
    """Fail a command no agent has claimed yet, so it never runs late; False when one already has."""
    return bool(conn.execute(update(T).where(T.c.id == command_id, T.c.status == PENDING)
                             .values(status=FAILED, error=reason, finished_at=func.now())).rowcount)


# --- the agents' side -----------------------------------------------------------------------

# Commands that only hand work over to a thread of the agent and answer at once (a guided click,
# whose step then enqueues the lab's commands itself): outside their lab's order, neither waiting
# for its running command nor holding its next one.
HAND_OVERS = ("scenario.step",)

# Claims of every agent and worker thread take turns (a transaction-level advisory lock): two
# claims at once could otherwise both see a lab idle and take two of its commands side by side.
CLAIM_LOCK = 0x1AB_C1A1


def claim(conn: Connection, agent_id: str, lease_seconds: float) -> Claimed | None:
    """The oldest pending command this agent may take (addressed to it or to any agent), now running
    under its lease; None when there is none.

    A lab's commands run one at a time and in their order: a command is taken only when it is its
    lab's oldest pending one (of those this agent may take) and no command of its lab is running.
    A command addressed to this agent waits only for this agent's own command of its lab: another
    agent's running command may be the one waiting for it (a reset stopping the consumers this
    agent runs). A hand-over (HAND_OVERS) is outside its lab's order."""
    conn.execute(select(func.pg_advisory_xact_lock(CLAIM_LOCK)))
    running, earlier = T.alias("running"), T.alias("earlier")
    for_me = or_(T.c.agent_id.is_(None), T.c.agent_id == agent_id)
    lab_busy = select(running.c.id).where(
        running.c.lab == T.c.lab, running.c.status == RUNNING, running.c.verb.not_in(HAND_OVERS),
        or_(T.c.agent_id.is_(None), running.c.claimed_by == agent_id)).exists()
    queued_before = select(earlier.c.id).where(
        earlier.c.lab == T.c.lab, earlier.c.status == PENDING, earlier.c.id < T.c.id, earlier.c.verb.not_in(HAND_OVERS),
        or_(earlier.c.agent_id.is_(None), earlier.c.agent_id == agent_id)).exists()
    in_turn = or_(T.c.verb.in_(HAND_OVERS), and_(~lab_busy, ~queued_before))
    oldest = (select(T.c.id).where(T.c.status == PENDING, for_me, in_turn)
              .order_by(T.c.id).limit(1).with_for_update(skip_locked=True).scalar_subquery())
    row = conn.execute(update(T).where(T.c.id == oldest)
                       .values(status=RUNNING, claimed_by=agent_id, lease_expires_at=func.now() + _seconds(lease_seconds))
                       .returning(T.c.id, T.c.lab, T.c.verb, T.c.args)).first()
    return Claimed(*row) if row else None


@dataclass(frozen=True)
class Place:
    """Where a command stands: its status and verb and, while it is pending, the unfinished (pending
    or running) commands created before it, of other labs and of its own lab."""
    status: str
    verb: str
    ahead_other_labs: int
    ahead_same_lab: int


def place(conn: Connection, command_id: int) -> Place:
    """The command's place in the queue (see :class:`Place`)."""
    status, verb, lab = conn.execute(select(T.c.status, T.c.verb, T.c.lab).where(T.c.id == command_id)).one()
    if status != PENDING:
        return Place(status, verb, 0, 0)
    other_labs, same_lab = conn.execute(
        select(func.count().filter(T.c.lab != lab), func.count().filter(T.c.lab == lab))
        .where(T.c.id < command_id, T.c.status.in_((PENDING, RUNNING)))).one()
    return Place(status, verb, other_labs, same_lab)


def renew_leases(conn: Connection, agent_id: str, lease_seconds: float) -> int:
    return conn.execute(update(T).where(T.c.status == RUNNING, T.c.claimed_by == agent_id)
                        .values(lease_expires_at=func.now() + _seconds(lease_seconds))).rowcount


def finish(conn: Connection, command_id: int, result: dict[str, Any]) -> None:
    conn.execute(update(T).where(T.c.id == command_id)
                 .values(status=DONE, result=result, finished_at=func.now(), lease_expires_at=None))
    announce_done(conn, command_id)


def announce_done(conn: Connection, command_id: int) -> None:
    """Wake the waiters of ``command_id`` when this transaction commits (command_channel.wait_for)."""
    conn.execute(select(func.pg_notify(DONE_CHANNEL, str(command_id))))


def fail(conn: Connection, command_id: int, error: str, kind: str, *, only_if: str | None = None) -> bool:
    """Mark a command failed with its reason; ``only_if``: only while it still has that status."""
    where = [T.c.id == command_id] + ([T.c.status == only_if] if only_if else [])
    failed = bool(conn.execute(update(T).where(*where).values(status=FAILED, error=error, result={"kind": kind},
                                                               finished_at=func.now(), lease_expires_at=None)).rowcount)
    if failed:
        announce_done(conn, command_id)
    return failed


def _orphans(conn: Connection, where, who) -> list[Orphan]:
    age = func.extract("epoch", func.now() - AGENTS.c.heartbeat_at)
    query = (select(T.c.id, T.c.lab, T.c.verb, T.c.status, who, age)
             .select_from(T.outerjoin(AGENTS, AGENTS.c.id == who)).where(where).order_by(T.c.id))
    return [Orphan(r[0], r[1], r[2], r[3], r[4], None if r[5] is None else float(r[5])) for r in conn.execute(query)]


def expired_leases(conn: Connection) -> list[Orphan]:
    """Running commands whose claiming agent stopped renewing their lease."""
    return _orphans(conn, and_(T.c.status == RUNNING, T.c.lease_expires_at < func.now()), T.c.claimed_by)


def waiting_for_dead_agents(conn: Connection, fresh: float) -> list[Orphan]:
    """Pending commands addressed to an agent that has not reported for ``fresh`` s (or has no row)."""
    silent = or_(AGENTS.c.id.is_(None), AGENTS.c.heartbeat_at <= func.now() - _seconds(fresh))
    return _orphans(conn, and_(T.c.status == PENDING, T.c.agent_id.is_not(None), silent), T.c.agent_id)


def of_agents(conn: Connection, agent_ids: list[str]) -> list[Orphan]:
    """Pending commands addressed to, and running commands claimed by, any of ``agent_ids``."""
    if not agent_ids:
        return []
    where = or_(and_(T.c.status == PENDING, T.c.agent_id.in_(agent_ids)),
                and_(T.c.status == RUNNING, T.c.claimed_by.in_(agent_ids)))
    who = func.coalesce(T.c.claimed_by, T.c.agent_id)
    return _orphans(conn, where, who)


def unclaimed(conn: Connection, older_than: float) -> list[Orphan]:
    """Commands for any agent that stayed pending ``older_than`` seconds: no agent was there to take them."""
    return _orphans(conn, and_(T.c.status == PENDING, T.c.agent_id.is_(None),
                               T.c.created_at < func.localtimestamp() - _seconds(older_than)), T.c.agent_id)
