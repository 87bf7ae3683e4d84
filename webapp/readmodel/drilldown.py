"""The drill-down: everything about one event (or one record): what the log holds, the journal's
rows, every delivery in every copy of the accounts, the effect rows of its transaction, its dedup
keys, and why, for an anomaly.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..store.schema import enter, quoted
from . import why as why_module
from .groups import effects_schemas


def event_drilldown(session: Session, lab: Lab, event_id: str | None = None,
                    position: tuple[int, int] | None = None) -> dict[str, Any]:
    """Everything about one event (or one record, by partition and offset): journal rows, every
    delivery in every copy of the accounts, the effect rows of its transaction, its dedup keys."""
    journal_where = "event_id = CAST(:event AS uuid)" if event_id else 'partition = :partition AND "offset" = :offset'
    params = {"event": event_id, "partition": position[0] if position else None,
              "offset": position[1] if position else None}
    # What the log holds: the record at that position, or every record of the event.
    log = [dict(r) for r in session.execute(text(
        'SELECT partition, "offset", "timestamp", key, headers, value, event_id::text AS event_id, transaction_id, '
        "type, account_id, amount_cents, status, balance_cents, score, invalid_reason, read_at "
        f"FROM log_records WHERE {journal_where} ORDER BY partition, \"offset\""), params).mappings()]
    if event_id is None and log and log[0]["event_id"]:
        event_id = params["event"] = log[0]["event_id"]
        journal_where = "event_id = CAST(:event AS uuid)"
    journal = [dict(r) for r in session.execute(text(
        "SELECT id, event_id::text AS event_id, transaction_id, type, account_id, amount_cents, status, mode, "
        f'idempotent_producer, partition, "offset", error, published_at FROM published_events WHERE {journal_where} '
        "ORDER BY id"), params).mappings()]
    if event_id is None and journal and journal[0]["event_id"]:
        event_id = params["event"] = journal[0]["event_id"]
    transaction_ids = sorted({j["transaction_id"] for j in journal + log if j["transaction_id"]})
    deliveries, effects, keys, why = [], [], [], []
    for schema in effects_schemas(session, lab):
        copy = "lab" if schema == lab.schema else lab.lane_of(schema)
        where = "event_id = CAST(:event AS uuid)" if event_id else 'partition = :partition AND "offset" = :offset'
        deliveries += [{"lane": copy, **r} for r in session.execute(text(
            f'SELECT id, group_id, consumer, partition, "offset", generation, attempt, strategy, outcome, reason, '
            f"delivered_at FROM {quoted(schema)}.deliveries WHERE {where} ORDER BY delivered_at, id"), params).mappings()]
        if transaction_ids:
            effects += [{"lane": copy, "table": "payments", **r} for r in session.execute(text(
                f"SELECT id::text AS id, event_id::text AS event_id, transaction_id, account_id, amount_cents, "
                f"applied_at AS at FROM {quoted(schema)}.payments WHERE transaction_id = ANY(:tx) ORDER BY applied_at"),
                {"tx": transaction_ids}).mappings()]
            keys += [{"lane": copy, "table": "processed_transactions", "key": k, "at": at} for k, at in session.execute(
                text(f"SELECT transaction_id, processed_at FROM {quoted(schema)}.processed_transactions "
                     "WHERE transaction_id = ANY(:tx)"), {"tx": transaction_ids})]
        if event_id:
            effects += [{"lane": copy, "table": "ledger", "id": "–", "transaction_id": None, **r} for r in session.execute(
                text(f"SELECT event_id::text AS event_id, account_id, amount_cents, recorded_at AS at "
                     f"FROM {quoted(schema)}.ledger WHERE event_id = CAST(:event AS uuid)"), params).mappings()]
            for table in ("processed_events", "seen_events"):  # the unique key table, and check-then-act's
                keys += [{"lane": copy, "table": table, "key": k, "at": at} for k, at in session.execute(
                    text(f"SELECT event_id::text, processed_at FROM {quoted(schema)}.{table} "
                         "WHERE event_id = CAST(:event AS uuid)"), params)]
        # Why, for an anomaly of this transaction in this copy: read from its ledger and the timeline.
        enter(session.connection(), schema)
        for transaction_id in transaction_ids:
            why += [{"lane": copy, **item} for item in why_module.explain_transaction(session, lab.schema, transaction_id)]
        enter(session.connection(), lab.schema)
    return {"event_id": event_id, "position": position, "log": log, "journal": journal,
            "transaction_ids": transaction_ids, "deliveries": deliveries, "effects": effects, "dedup_keys": keys,
            "why": why}
