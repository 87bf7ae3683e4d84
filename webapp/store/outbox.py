"""The transactional outbox: the payments service's transaction, the relay's loop, the relay's row.

The SQL is teaching content: the same constants run (the web's ``publish_via_outbox``, the relay
process in webapp/outbox/relay.py) and are shown on screen (``PLAN``, the Outbox panel). Every
statement takes ``%(name)s`` parameters, so psycopg (the relay) and SQLAlchemy's
``exec_driver_sql`` (the web) run the same text. Each function takes a connection that already
works in the lab's schema (``store.schema``), except where it names the schema itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

# --- the payments service: one PostgreSQL transaction --------------------------------------

INSERT_PAYMENT = """INSERT INTO source_payments (transaction_id, event_id, account_id, amount_cents)
VALUES (%(transaction_id)s, %(event_id)s, %(account_id)s, %(amount_cents)s) RETURNING id"""

INSERT_OUTBOX = """INSERT INTO outbox (event_id, key, payload)
VALUES (%(event_id)s, %(key)s, %(payload)s) RETURNING id"""

# The constraint a second payment with the same business id hits (the whole transaction rolls back).
PAYMENT_UNIQUE = "source_payments_transaction_id_key"

# --- the relay: claim, publish, mark ------------------------------------------------------

# Unsent rows in outbox order; SKIP LOCKED: a second relay takes the next rows instead of waiting.
CLAIM = """SELECT id, event_id::text, key, payload,
       (SELECT count(*) FROM outbox_publishes p WHERE p.outbox_id = outbox.id) AS published_before
FROM outbox WHERE published_at IS NULL
ORDER BY id LIMIT %(batch)s
FOR UPDATE SKIP LOCKED"""

# Written on the relay's second connection, committed at once: the evidence of each publish
# survives a relay killed before it marks the row sent.
RECORD_PUBLISH = """INSERT INTO outbox_publishes (outbox_id, event_id, attempt, partition, "offset", pid)
VALUES (%(outbox_id)s, %(event_id)s, %(attempt)s, %(partition)s, %(offset)s, %(pid)s)"""

MARK_SENT = """UPDATE outbox SET published_at = now(),
       attempts = (SELECT count(*) FROM outbox_publishes p WHERE p.outbox_id = outbox.id)
WHERE id = ANY(%(ids)s)"""


@dataclass(frozen=True)
class PlanStep:
    """One line of the plan on screen: a statement (``sql``), a transaction boundary, a Kafka call
    or a crash point of the relay (``point``)."""
    kind: str   # begin | sql | commit | kafka | point
    text: str
    who: str    # payments service | relay


PLAN = (
    PlanStep("begin", "BEGIN", "payments service"),
    PlanStep("sql", INSERT_PAYMENT, "payments service"),
    PlanStep("sql", INSERT_OUTBOX, "payments service"),
    PlanStep("commit", "COMMIT  -- the payment and its event, or neither: no dual write", "payments service"),
    PlanStep("begin", "BEGIN", "relay"),
    PlanStep("sql", CLAIM, "relay"),
    PlanStep("point", "relay-before-publish", "relay"),
    PlanStep("kafka", "producer.produce(topic, key, payload) for each row; producer.flush()  -- wait for every "
                      "delivery report", "relay"),
    PlanStep("sql", RECORD_PUBLISH + "  -- on a second connection, committed now", "relay"),
    PlanStep("point", "relay-after-publish-before-mark", "relay"),
    PlanStep("sql", MARK_SENT, "relay"),
    PlanStep("commit", "COMMIT  -- killed before this, the rows stay unsent: the next relay publishes them again",
             "relay"),
)

# --- the relay's row ---------------------------------------------------------------------

# Asking for a relay: a row the agents look for (webapp/agent/relays.py).
WANT_RELAY = "INSERT INTO relay_state (id) VALUES (1) ON CONFLICT (id) DO NOTHING"

ARM = """INSERT INTO relay_state (id, armed_point, armed_always) VALUES (1, %(point)s, %(always)s)
ON CONFLICT (id) DO UPDATE SET armed_point = EXCLUDED.armed_point, armed_always = EXCLUDED.armed_always"""

ARMED = "SELECT armed_point, armed_always FROM relay_state WHERE id = 1"

DISARM = "UPDATE relay_state SET armed_point = NULL WHERE id = 1 AND NOT armed_always"

STARTED = """INSERT INTO relay_state (id, state, pid, agent_id, starts, heartbeat_at) VALUES (1, 'running', %(pid)s, %(agent)s, 1, now())
ON CONFLICT (id) DO UPDATE SET state = 'running', pid = EXCLUDED.pid, agent_id = coalesce(EXCLUDED.agent_id, relay_state.agent_id),
    starts = relay_state.starts + 1, heartbeat_at = now(), last_error = NULL
RETURNING starts, (SELECT count(*) FROM outbox WHERE published_at IS NULL) AS unsent"""

BEAT = "UPDATE relay_state SET heartbeat_at = now(), last_error = %(error)s WHERE id = 1 RETURNING id"

COUNT_PUBLISH = """UPDATE relay_state SET published = published + %(published)s, republished = republished + %(republished)s,
    last_event_id = %(event_id)s, last_published_at = now(), heartbeat_at = now() WHERE id = 1"""

CRASHING = "UPDATE relay_state SET state = 'crashed', crashed_at = %(point)s, heartbeat_at = now() WHERE id = 1"

STOPPED = "UPDATE relay_state SET state = 'stopped', heartbeat_at = now() WHERE id = 1 AND pid = %(pid)s"

# For an agent: the labs whose relay_state row exists (a relay was asked for). Lanes are copies of
# the accounts, not labs: they have no relay.
LABS_WANTING_A_RELAY = r"""SELECT n.nspname FROM pg_namespace n
WHERE n.nspname LIKE 'lab\_%' AND n.nspname NOT LIKE '%\_\_%'
  AND EXISTS (SELECT 1 FROM pg_class c WHERE c.relnamespace = n.oid AND c.relname = 'relay_state')"""

# An agent takes a lab's relay when nobody runs it, or its agent stopped beating (a row written
# only then: this runs every second); true when the relay is this agent's.
CLAIM_RELAY = """WITH taken AS (
    UPDATE {schema}.relay_state SET agent_id = %(agent)s
    WHERE id = 1 AND (agent_id IS NULL OR agent_id <> ALL(%(live)s)) RETURNING agent_id)
SELECT coalesce((SELECT agent_id FROM taken), (SELECT agent_id FROM {schema}.relay_state WHERE id = 1)) = %(agent)s"""


def write_payment(conn: Connection, event_fields: dict[str, Any], key: str, payload: str) -> tuple[int, int]:
    """The payments service's transaction (the caller's): the payment, its outbox row, and the
    wish for a relay. (payment id, outbox id); a repeated transaction id raises IntegrityError."""
    payment_id = conn.exec_driver_sql(INSERT_PAYMENT, event_fields).scalar_one()
    outbox_id = conn.exec_driver_sql(INSERT_OUTBOX, {"event_id": event_fields["event_id"], "key": key,
                                                     "payload": payload}).scalar_one()
    conn.exec_driver_sql(WANT_RELAY)
    return payment_id, outbox_id


def arm(conn: Connection, point: str | None, always: bool) -> None:
    conn.exec_driver_sql(ARM, {"point": point, "always": always})
