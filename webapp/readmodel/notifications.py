"""The Notifications panel's read model: per account, what the consumers sent (their ledger,
``notifications_sent``) and what the notification service received (its own table,
``notifications``), so "received" is the service's word, not the consumer's; each message the
customer got more than once, with why; each group's setting. All in the lab's schema.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text

from ..strategies.notification import NotifySettings

# Accounts are the lab's five plus any the service was told about (a caller may name another).
SUMMARY_SQL = """
WITH sent AS (
    SELECT account_id, count(*) AS sent, count(*) FILTER (WHERE idempotency_key IS NOT NULL) AS sent_with_key
    FROM notifications_sent GROUP BY account_id
), received AS (
    SELECT account_id, count(*) AS received, count(*) FILTER (WHERE NOT replayed) AS delivered,
           count(*) FILTER (WHERE replayed) AS replays,
           count(DISTINCT event_id) FILTER (WHERE NOT replayed) AS events
    FROM notifications GROUP BY account_id
), accounts_seen AS (
    SELECT id AS account_id FROM accounts UNION SELECT account_id FROM sent UNION SELECT account_id FROM received
)
SELECT a.account_id, coalesce(s.sent, 0) AS sent, coalesce(s.sent_with_key, 0) AS sent_with_key,
       coalesce(r.received, 0) AS received, coalesce(r.delivered, 0) AS delivered,
       coalesce(r.delivered - r.events, 0) AS duplicates, coalesce(r.replays, 0) AS replays
FROM accounts_seen a LEFT JOIN sent s USING (account_id) LEFT JOIN received r USING (account_id)
ORDER BY a.account_id
"""

GROUPS_SQL = ("SELECT group_id, strategy, notify, notify_idempotency_key FROM consumer_groups "
              "ORDER BY created_at, group_id")

# Messages the customer got more than once (delivered, not replayed), newest first.
DUPLICATED_SQL = """
SELECT event_id::text AS event_id, account_id, count(*) AS delivered, min(received_at) AS first_at,
       max(received_at) AS last_at
FROM notifications WHERE NOT replayed
GROUP BY event_id, account_id HAVING count(*) > 1
ORDER BY max(received_at) DESC LIMIT :limit
"""

SENDS_SQL = """
SELECT consumer, generation, idempotency_key IS NOT NULL AS keyed, mode, status, replayed, sent_at
FROM notifications_sent WHERE event_id = CAST(:event_id AS uuid) ORDER BY id
"""

# The consumers' crashes between a message's first and last call.
CRASHES_SQL = """
SELECT summary FROM timeline
WHERE kind = 'crashed' AND at BETWEEN :since AND :until AND detail->>'consumer' = ANY(:consumers)
ORDER BY at, id
"""

# Changes whenever a call is recorded, the service receives one, or a group's setting changes.
FINGERPRINT_SQL = """
SELECT concat_ws(':', (SELECT max(id) FROM notifications), (SELECT max(id) FROM notifications_sent),
       (SELECT md5(coalesce(string_agg(concat_ws(':', group_id, notify, notify_idempotency_key), ','
                                       ORDER BY group_id), '')) FROM consumer_groups))
"""

DUPLICATES_SHOWN = 5


def fingerprint(conn) -> str:
    return conn.execute(text(FINGERPRINT_SQL)).scalar_one()


def group_settings(conn) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in conn.execute(text(GROUPS_SQL))]


def accounts(conn) -> list[dict[str, Any]]:
    return [dict(row._mapping) for row in conn.execute(text(SUMMARY_SQL))]


def duplicates(conn, limit: int = DUPLICATES_SHOWN) -> list[dict[str, Any]]:
    """Each message delivered more than once, with the calls behind it and one sentence of why."""
    found = []
    for row in conn.execute(text(DUPLICATED_SQL), {"limit": limit}).mappings():
        sends = [dict(s._mapping) for s in conn.execute(text(SENDS_SQL), {"event_id": row["event_id"]})]
        crashes = []
        if sends:
            crashes = list(conn.execute(text(CRASHES_SQL), {
                "since": sends[0]["sent_at"], "until": sends[-1]["sent_at"],
                "consumers": sorted({s["consumer"] for s in sends})}).scalars())
        found.append({**dict(row), "sends": sends, "why": why(dict(row), sends, crashes)})
    return found


def why(row: dict[str, Any], sends: list[dict[str, Any]], crashes: list[str]) -> str:
    """One sentence: who called, with or without a key, and what happened in between."""
    times = f"{row['delivered']} times"
    if not sends:
        return (f"{row['account_id']} got the message for event {row['event_id'][:8]}… {times}, from calls no "
                "consumer of this lab recorded (another client of the service)")
    callers = ", then ".join(f"{s['consumer']} (generation {s['generation']}, {s['mode']})" for s in sends)
    keyed = [s for s in sends if s["keyed"]]
    key_part = ("without an Idempotency-Key, so the service could not tell the repeat from a new payment"
                if not keyed else f"{len(keyed)} of {len(sends)} calls with the key")
    # What the crash undid depends on where the call was: inside the transaction (before-commit)
    # the credit rolled back and the message stayed; after it (after-commit) the credit had
    # committed, only the offset commit was lost, and the record came back all the same.
    undone = ("the credit had committed, the offset had not: the record came back"
              if sends[0]["mode"] == "after-commit" else "the transaction rolled back, the message stayed")
    between = f"; in between, {'; '.join(crashes)}: {undone}" if crashes else ""
    return (f"{row['account_id']} got the message for event {row['event_id'][:8]}… {times}: called by {callers}, "
            f"{key_part}{between}")


def settings_by_group(conn) -> dict[str, NotifySettings]:
    """Each group's notification setting, by group id."""
    return {row["group_id"]: NotifySettings(row["notify"], bool(row["notify_idempotency_key"]))
            for row in group_settings(conn)}


def settings_for_strategy(conn, strategy: str) -> NotifySettings:
    """The setting the SQL view shows with a strategy's plan: the first group using the strategy that
    notifies (off when none does)."""
    return next((NotifySettings(row["notify"], bool(row["notify_idempotency_key"])) for row in group_settings(conn)
                 if row["strategy"] == strategy and row["notify"] != "off"), NotifySettings())
