"""The lab agent's health as the dashboard shows it: the newest report of an agent (whether it
reaches Kafka), and how old a report may be and still count (AGENT_STALE_SECONDS).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.vocabulary import AGENT_FRESH_SECONDS
from ..store.connection import CONTROL_SCHEMA

C = CONTROL_SCHEMA


def agent_health(session: Session) -> dict[str, Any]:
    """The report that matters most: among agents that reported lately, one that cannot reach Kafka
    (several agents may serve one database); else the newest report."""
    row = session.execute(text(
        f"SELECT id, host, pid, kafka_ok, kafka_error, extract(epoch FROM now() - heartbeat_at) AS age "
        f"FROM {C}.agents "
        "ORDER BY heartbeat_at > now() - make_interval(secs => :fresh) DESC, kafka_ok, heartbeat_at DESC LIMIT 1"),
        {"fresh": AGENT_FRESH_SECONDS}).mappings().first()
    return dict(row) if row else {}


# The agent beats every 0.5 s (agent/periodic.py): six beats missed is no slow beat on a busy
# machine but an agent gone or frozen, and the status bar (polled once a second) says so within
# about four seconds (within 5 s). Its commands' leases and its consumers' freshness keep
# AGENT_FRESH_SECONDS: a status shown a little early costs nothing, a command failed early does.
AGENT_STALE_SECONDS = 3.0
