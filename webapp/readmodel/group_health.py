"""Each consumer group's health as the dashboard, the status bar, the classroom board and
``GET /api/v1/state`` show it: stable, rebalancing, stalled, recovering or empty, with a sentence
that says what is stuck and why it matters (domain/group_health.py judges; store/group_health.py
reads the facts: the consumers' reports, the log end, the committed offsets).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from ..domain.group_health import STALLED
from ..domain.lab import Lab
from ..store.group_health import health_of_groups


def group_health(session: Session, lab: Lab) -> dict[str, dict[str, Any]]:
    """Per group id: its health (state, sentence, members alive, assigned partitions, records
    waiting, the stall threshold) and the Kafka group id its members join."""
    return {health.group_id: {**health.as_dict(), "kafka_group_id": row["kafka_group_id"] or health.group_id}
            for health, row in health_of_groups(session.connection().exec_driver_sql, lab)}


def stalled(session: Session, lab: Lab) -> list[dict[str, Any]]:
    """The stalled groups, for the status bar: each with its sentence."""
    return [{"group_id": group_id, **health} for group_id, health in group_health(session, lab).items()
            if health["state"] == STALLED]


def fingerprint(session: Session, lab: Lab) -> str:
    """What a change of health changes: each group's state, live members and assigned partitions
    (not the seconds, which tick while a group is stalled)."""
    return ";".join(f"{group_id}:{h['state']}:{h['members_alive']}:{len(h['assigned'])}"
                    for group_id, h in group_health(session, lab).items())
