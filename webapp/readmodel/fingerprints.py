"""Change fingerprints: cheap facts (a few index lookups) that change whenever something a panel
shows changes, so the live dashboard re-renders a panel only when it would look different.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..domain.vocabulary import DEDUP_TABLES
from ..store import explorations
from ..store.connection import CONTROL_SCHEMA
from ..store.consumers import LIVE_STATES
from ..store.schema import quoted
from . import group_health, notifications, outbox, scale, service_health
from .consumers import commit_blocks
from .groups import effects_schemas
from .health import AGENT_STALE_SECONDS, agent_health

C = CONTROL_SCHEMA


FINGERPRINT_SQL = """
SELECT
  (SELECT oid::text FROM pg_namespace WHERE nspname = current_schema()) AS schema,
  -- what the lab asked to publish, and what the log holds (the reader's newest batch)
  concat_ws(':', (SELECT coalesce(max(id), 0) FROM published_events),
            (SELECT max(read_at) FROM log_records)) AS journal,
  (SELECT coalesce(max(id), 0) FROM timeline) AS timeline,
  (SELECT md5(coalesce(string_agg(concat_ws(':', group_id, strategy, effects_schema, batch_size, commit_mode, static_membership), ',' ORDER BY group_id), ''))
     FROM consumer_groups) AS groups,
  (SELECT md5(coalesce(string_agg(concat_ws(':', group_id, partition, committed), ',' ORDER BY group_id, partition), ''))
     FROM group_offsets) AS offsets,
  (SELECT md5(coalesce(string_agg(key || '=' || value::text, ',' ORDER BY key), '')) FROM settings) AS settings
"""

# Heartbeats land every second; only a stale one (a frozen process) changes what the consumers
# panel shows, so a fresh heartbeat, or a dead process's last one, does not count as a change.
CONSUMERS_FINGERPRINT_SQL = f"""
SELECT md5(coalesce(string_agg(concat_ws('|', id, name, group_id, pid, state, armed_point, armed_action, armed_always,
       step_mode, step_at, assigned::text, positions::text, applied_positions::text, generation, applied, absorbed,
       dead_lettered, commit_failures, last_error, exit_code,
       CASE WHEN heartbeat_at IS NULL OR state <> ALL(:live) THEN 'none'
            WHEN now() - heartbeat_at < interval '3 seconds' THEN 'fresh'
            ELSE floor(extract(epoch FROM now() - heartbeat_at))::text END), ',' ORDER BY id), ''))
FROM {C}.consumers WHERE lab = :lab
"""

# Effects, deliveries and dedup keys of one schema. Effects and ledger rows are written in the
# delivery's transaction, so the newest delivery id covers them; a dedup key can be committed
# alone (eventid-split), and TTL cleanup deletes the oldest keys, hence min and max.
EFFECTS_FINGERPRINT_SQL = (
    "SELECT concat_ws(':', (SELECT max(id) FROM {s}.deliveries), (SELECT max(id) FROM {s}.payments), "
    + ", ".join(f"(SELECT max(processed_at) FROM {{s}}.{table}), (SELECT min(processed_at) FROM {{s}}.{table})"
                for table in DEDUP_TABLES) + ")")
# The oldest key of every dedup table: the same arithmetic as dedup_tables, so the age shown and the
# age fingerprinted agree.
OLDEST_KEY_AGE_SQL = ("SELECT extract(epoch FROM now() - least("
                      + ", ".join(f"(SELECT min(processed_at) FROM {table})" for table in DEDUP_TABLES) + "))")


def fingerprint_parts(session: Session, lab: Lab) -> dict[str, Any]:
    """Cheap facts that change whenever something a panel shows changes (a few index lookups)."""
    parts = dict(session.execute(text(FINGERPRINT_SQL)).mappings().one())
    parts["consumers"] = (session.execute(text(CONSUMERS_FINGERPRINT_SQL),
                                          {"lab": lab.name, "live": list(LIVE_STATES)}).scalar_one()
                          + "|" + ",".join(sorted(commit_blocks(session, lab))))  # a block set or ended
    agent = agent_health(session)
    parts["agent"] = (bool(agent) and agent["age"] is not None and float(agent["age"]) < AGENT_STALE_SECONDS,
                      agent.get("kafka_ok"), agent.get("kafka_error"))
    parts["effects"] = ";".join(
        session.execute(text(EFFECTS_FINGERPRINT_SQL.format(s=quoted(schema)))).scalar_one() or ""
        for schema in effects_schemas(session, lab))
    oldest_age = session.execute(text(OLDEST_KEY_AGE_SQL)).scalar_one()
    parts["oldest_key_age"] = float(oldest_age) if oldest_age is not None else None
    # A group stalls when nothing changes for long enough: its health is a part of its own.
    parts["group_health"] = group_health.fingerprint(session, lab)
    # Each part the lab depends on, up or down (the status bar).
    parts["services"] = service_health.fingerprint(service_health.service_health(session, lab))
    parts["outbox"] = outbox.fingerprint(session)
    parts["notifications"] = notifications.fingerprint(session)
    parts.update(scale.fingerprint_parts(session))  # load runs, dedup tables at scale
    parts["explorations"] = explorations.fingerprint(session.connection(), lab.name)  # the explorer's runs
    return parts
