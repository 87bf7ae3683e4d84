"""The parts a lab depends on, up or down, as the status bar, ``GET /api/v1/state`` and the
classroom board show them: PostgreSQL, the lab agent, the broker, the log reader and the
notification service, each with a sentence that says what is down, what that means for the lab,
and what to do (docs/operations/health.md).

How each is known, from a web process that holds no Kafka client:
- PostgreSQL: this process's own query (a query that fails is :func:`database_unreachable`);
- the lab agent: its row in ``agents``, beaten every 0.5 s (agent/periodic.py); down after
  AGENT_STALE_SECONDS without a beat;
- the broker: what the agent's own probe (a metadata request every second, 1.5 s timeout) last
  said; unknown while the agent is down;
- the log reader and the notification service: their rows in ``service_heartbeats``, beaten every
  SERVICE_BEAT_SECONDS (store/service_heartbeats.py); down after SERVICE_DOWN_AFTER_SECONDS.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..domain.vocabulary import SERVICE_DOWN_AFTER_SECONDS
from ..store.connection import CONTROL_SCHEMA
from ..store.service_heartbeats import LOG_READER, NOTIFICATION_SERVICE
from .health import AGENT_STALE_SECONDS, agent_health
from .partitions import log_ends

POSTGRES, AGENT, BROKER, LOG_READER_PART, NOTIFY_PART = "postgres", "agent", "broker", "log_reader", "notify"
PARTS = (POSTGRES, AGENT, BROKER, LOG_READER_PART, NOTIFY_PART)

# The freshest beat of each service (several hosts may each run one), and its age.
HEARTBEATS_SQL = text(
    f"SELECT DISTINCT ON (service) service, host, pid, "
    f"extract(epoch FROM now() - heartbeat_at) AS age FROM {CONTROL_SCHEMA}.service_heartbeats "
    "ORDER BY service, heartbeat_at DESC")
NOTIFYING_GROUPS_SQL = text("SELECT group_id FROM consumer_groups WHERE notify <> 'off' ORDER BY group_id")

DATABASE_TODO = ("start it again (docker compose: `docker compose up -d postgres`; `make run` stops the whole lab "
                 "when its database exits, so run it again): the agent, the consumers and this page reconnect by "
                 "themselves once it answers")


def _part(part: str, up: bool | None, sentence: str = "", todo: str = "") -> dict[str, Any]:
    """``up``: True, False, or None when it cannot be known now (the broker while no agent reports)."""
    return {"part": part, "up": up, "sentence": sentence, "todo": todo}


def driver_error(error: Exception) -> str:
    """A database error's first line as the driver said it (``connection refused``), without
    SQLAlchemy's links and statement."""
    cause = str(getattr(error, "orig", None) or error).strip()
    return cause.splitlines()[0][:200] if cause else type(error).__name__


def database_unreachable(error: str) -> list[dict[str, Any]]:
    """The parts as this process sees them when its own query to PostgreSQL failed: the database
    down, the rest unknown (they report through it)."""
    unknown = "unknown while PostgreSQL is unreachable: it reports through it"
    return [_part(POSTGRES, False, f"PostgreSQL is unreachable ({error}): the lab records nothing now. "
                  "The consumers cannot apply a record, so each waits and retries without committing its offset; "
                  "the log reader mirrors nothing and no panel can change. The records stay in Kafka",
                  DATABASE_TODO)] + [_part(part, None, unknown) for part in PARTS[1:]]


def _agent(agent: dict[str, Any]) -> dict[str, Any]:
    if agent and agent["age"] is not None and float(agent["age"]) < AGENT_STALE_SECONDS:
        return _part(AGENT, True)
    if not agent:
        said = "there is no lab agent (none has reported to this database)"
        todo = "start one: `make run`, or `docker compose up -d consumers`"
    else:
        said = (f"the lab agent (pid {agent['pid']} on {agent['host']}) is down, no heartbeat for over "
                f"{AGENT_STALE_SECONDS:g} s")
        todo = (f"if it is frozen, `kill -CONT {agent['pid']}` on {agent['host']}; if it died, start it again: "
                "`make run` (its launcher stops the whole lab when the agent exits), or `docker compose up -d consumers`")
    return _part(AGENT, False, f"{said}: no control works (publishing, consumers, faults, recovery), nobody "
                 "watches the broker, and consumers whose agent died stop themselves", todo)


def _broker(agent: dict[str, Any], agent_up: bool) -> dict[str, Any]:
    if not agent_up:
        return _part(BROKER, None, "unknown while no lab agent reports: the agent is the one that asks the broker")
    if agent["kafka_ok"]:
        return _part(BROKER, True)
    return _part(BROKER, False, f"Kafka is unreachable ({agent['kafka_error'] or 'no answer'}): nothing can be "
                 "published, the consumers can neither fetch nor commit offsets, and the log reader mirrors "
                 "nothing new; what the lab already recorded in PostgreSQL stays",
                 "start the broker again (docker compose: `docker compose up -d kafka`, its log is kept on its "
                 "volume); `make run` stops the whole lab when its embedded broker exits, and the embedded broker "
                 "keeps its log in memory only, so a new one starts with empty topics: reset the lab then")


def _mirrored_to(session: Session) -> str:
    """Where the mirror ends, per partition: what the partitions panel and the verdict stop at."""
    ends = log_ends(session, "")
    if not ends:
        return "nothing mirrored yet"
    return ", ".join(f"P{partition} at offset {end - 1}" for partition, end in sorted(ends.items()))


def _service(session: Session, lab: Lab | None, row: dict[str, Any] | None, part: str, name: str) -> dict[str, Any]:
    if row is not None and row["age"] is not None and float(row["age"]) < SERVICE_DOWN_AFTER_SECONDS:
        return _part(part, True)
    log_file = name.replace(" ", "-")
    if row is None:
        said = f"the {name} is not running (it has never reported, or it stopped)"
        todo = ("the lab agent starts it (or, in docker compose, "
                + ("`docker compose up -d notify`" if part == NOTIFY_PART else "`docker compose up -d consumers`") + ")")
    else:
        said = (f"the {name} (pid {row['pid']} on {row['host']}) is down, no heartbeat for over "
                f"{SERVICE_DOWN_AFTER_SECONDS:g} s")
        restarts = ("the lab agent restarts its own within a second when it exits (docker compose restarts its "
                    "notify service)" if part == NOTIFY_PART else
                    "the lab agent restarts it within a second when it exits")
        todo = (f"{restarts}; if it stays down: frozen, `kill -CONT {row['pid']}` on {row['host']}; else read "
                f"`logs/{log_file}.log` in the lab's data directory (`.lab` by default), or "
                + ("`docker compose logs notify`" if part == NOTIFY_PART else "`docker compose logs consumers`"))
    if part == LOG_READER_PART:
        mirrored = f" ({_mirrored_to(session)})" if lab is not None else ""
        meaning = (f"the partitions panel and the verdict stop at what it mirrored{mirrored}; "
                   "records published meanwhile wait in Kafka, and it mirrors them when it is back")
    elif lab is None:
        meaning = ("the consumers of groups that notify retry each call until it answers, and their partitions "
                   "wait meanwhile (lag grows)")
    else:
        groups = list(session.execute(NOTIFYING_GROUPS_SQL).scalars())
        meaning = (f"the consumers of {', '.join(groups)} retry each call until it answers, and their "
                   "partitions wait meanwhile (lag grows)" if groups
                   else "no group of this lab notifies now, so nothing waits on it yet")
    return _part(part, False, f"{said}: {meaning}", todo)


def service_health(session: Session | Connection, lab: Lab | None) -> list[dict[str, Any]]:
    """Each part with ``up`` (True, False, None for unknown) and, when not up, its sentence and what
    to do; in the order the status bar shows them (the first down part is the cause of the others).
    ``lab`` None (the classroom board, every lab at once): nothing read from a lab's schema."""
    agent = agent_health(session)
    agent_part = _agent(agent)
    beats = {row["service"]: dict(row) for row in session.execute(HEARTBEATS_SQL).mappings()}
    return [_part(POSTGRES, True), agent_part, _broker(agent, bool(agent_part["up"])),
            _service(session, lab, beats.get(LOG_READER), LOG_READER_PART, LOG_READER),
            _service(session, lab, beats.get(NOTIFICATION_SERVICE), NOTIFY_PART, NOTIFICATION_SERVICE)]


def down(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The parts known to be down, for the status bar."""
    return [part for part in parts if part["up"] is False]


def fingerprint(parts: list[dict[str, Any]]) -> str:
    """What changes when a part goes down or comes back (the sentences hold no ticking seconds)."""
    return ";".join(f"{part['part']}:{part['up']}:{part['sentence']}" for part in parts)
