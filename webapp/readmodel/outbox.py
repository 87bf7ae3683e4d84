"""What the Outbox panel, ``GET /api/v1/outbox`` and the "why" read of the transactional outbox:
pending and sent rows, the newest rows with where each publish landed, the relay's state, the
events it published more than once.

Every query runs in the lab's schema (the session's search_path), except the why's, which names
the lab's schema (``journal``) from an effects schema.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.vocabulary import RELAY_CRASH_POINTS
from ..store.outbox import PLAN

NEWEST = 8
RELAY_FRESH_SECONDS = 5.0

COUNTS_SQL = """
SELECT count(*) FILTER (WHERE published_at IS NULL) AS pending,
       count(*) FILTER (WHERE published_at IS NOT NULL) AS sent,
       (SELECT count(*) FROM source_payments) AS payments
FROM outbox
"""

NEWEST_SQL = """
SELECT o.id, o.event_id::text AS event_id, o.key, o.payload, (o.payload::jsonb->>'amount_cents')::bigint AS amount_cents,
       o.created_at, o.published_at, o.attempts,
       coalesce(p.publishes, 0) AS publishes, p.positions
FROM outbox o
LEFT JOIN LATERAL (SELECT count(*) AS publishes,
                          string_agg('P' || partition || '@' || coalesce("offset"::text, '?'), ' · ' ORDER BY id) AS positions
                   FROM outbox_publishes x WHERE x.outbox_id = o.id) p ON true
ORDER BY o.id DESC LIMIT :limit
"""

RELAY_SQL = """
SELECT state, pid, agent_id, starts, published, republished, last_event_id::text AS last_event_id,
       last_published_at, armed_point, armed_always, crashed_at, last_error,
       extract(epoch FROM now() - heartbeat_at) AS heartbeat_age
FROM relay_state WHERE id = 1
"""

# Events the relay published more than once: the same event id at two offsets of the log.
REPUBLISHED_SQL = """
SELECT event_id::text AS event_id, count(*) AS publishes,
       string_agg('P' || partition || '@' || coalesce("offset"::text, '?'), ' · ' ORDER BY id) AS positions
FROM outbox_publishes GROUP BY outbox_id, event_id HAVING count(*) > 1
ORDER BY max(id) DESC LIMIT :limit
"""

# Changes whenever the panel would: a new row, a row sent, a publish, the relay's state or fault;
# a heartbeat only when it goes stale (the relay stopped answering).
FINGERPRINT_SQL = """
SELECT concat_ws(':', (SELECT max(id) FROM outbox), (SELECT count(*) FROM outbox WHERE published_at IS NULL),
       (SELECT max(id) FROM outbox_publishes),
       (SELECT concat_ws('|', state, pid, armed_point, armed_always, starts, crashed_at, last_error,
                         CASE WHEN heartbeat_at IS NULL THEN 'none'
                              WHEN now() - heartbeat_at < interval '3 seconds' THEN 'fresh'
                              ELSE floor(extract(epoch FROM now() - heartbeat_at))::text END)
        FROM relay_state WHERE id = 1))
"""

# For the why of a duplicate: every publish of one event by the relay, and the crash point the
# relay said it was killed at while holding it.
REPUBLISH_OF_EVENT_SQL = """
SELECT p.partition, p."offset", p.pid,
       (SELECT t.detail->>'point' FROM {journal}.timeline t
        WHERE t.kind = 'outbox' AND t.detail->>'action' = 'crashed' AND t.detail->'event_ids' ? CAST(:event AS text)
        ORDER BY t.id DESC LIMIT 1) AS point
FROM {journal}.outbox_publishes p WHERE p.event_id = CAST(:event AS uuid) ORDER BY p.id
"""


def fingerprint(session: Session) -> str:
    return session.execute(text(FINGERPRINT_SQL)).scalar_one() or ""


def relay(session: Session) -> dict[str, Any]:
    """The relay as it last reported, with a label a person reads (``running``, ``crashed``,
    ``not answering``, ``stopped``, ``starting``, or ``not asked for`` before the first use)."""
    row = session.execute(text(RELAY_SQL)).mappings().first()
    if row is None:
        return {"state": "not asked for", "label": "not asked for: no payment written through the outbox yet",
                "published": 0, "republished": 0, "starts": 0, "armed_point": None, "armed_always": False,
                "pid": None, "crashed_at": None, "last_error": None, "heartbeat_age": None, "last_event_id": None}
    relay = dict(row)
    age = float(relay["heartbeat_age"]) if relay["heartbeat_age"] is not None else None
    relay["heartbeat_age"] = age
    if relay["state"] == "wanted":
        relay["label"] = "starting: waiting for a lab agent to start it"
    elif relay["state"] == "running" and (age is None or age > RELAY_FRESH_SECONDS):
        relay["label"] = f"not answering (pid {relay['pid']}, no heartbeat for {int(age or 0)} s)"
    elif relay["state"] == "running":
        relay["label"] = f"running (pid {relay['pid']})"
    elif relay["state"] == "crashed":
        relay["label"] = f"crashed at {relay['crashed_at']}: the agent restarts it"
    else:
        relay["label"] = relay["state"]
    return relay


def outbox(session: Session) -> dict[str, Any]:
    """Everything the Outbox panel shows."""
    counts = dict(session.execute(text(COUNTS_SQL)).mappings().one())
    return {**{key: int(value or 0) for key, value in counts.items()},
            "newest": [dict(r) for r in session.execute(text(NEWEST_SQL), {"limit": NEWEST}).mappings()],
            "republished_events": [dict(r) for r in session.execute(text(REPUBLISHED_SQL), {"limit": 5}).mappings()],
            "relay": relay(session), "plan": PLAN, "points": RELAY_CRASH_POINTS}


def republish_origin(session: Session, journal: str, event_id: str) -> str | None:
    """Why the log holds ``event_id`` twice, when the outbox relay published it twice; else None.
    ``journal`` is the lab's schema, quoted."""
    if session.execute(text("SELECT to_regclass(:t)"), {"t": f"{journal}.outbox_publishes"}).scalar() is None:
        return None
    rows = session.execute(text(REPUBLISH_OF_EVENT_SQL.format(journal=journal)), {"event": event_id}).mappings().all()
    if len(rows) < 2:
        return None
    first, again = rows[0], rows[1]
    point = again["point"] or first["point"] or "a crash point"
    return (f"the outbox relay published it twice: killed at {point} after publishing it "
            f"(P{first['partition']}@{first['offset']}) and before marking its outbox row sent, it was restarted "
            f"and its successor (pid {again['pid']}) found the row unsent and published it again "
            f"(P{again['partition']}@{again['offset']})")
