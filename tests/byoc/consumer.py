"""An outside consumer for the tests of "your consumer": a learner's own code, written
with another client library than the lab's (kafka-python), run as its own OS process. It imports
nothing of the lab.

``python tests/byoc/consumer.py naive|idempotent --bootstrap B --topic T --group G --client-id C
--database-url URL``. Both apply each credit in one database transaction (the balance and a
``payments`` row) and then commit the offset asynchronously (a failed commit is covered by the
next). ``naive`` applies every record it gets; ``idempotent`` first claims the event's
``transaction_id`` in ``processed_transactions`` (INSERT ... ON CONFLICT DO NOTHING) in the same
transaction, and skips the effect when the key was there. A terminated database session is
reconnected and the record applied again from the start: nothing is committed before the effect.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import psycopg
from kafka import KafkaConsumer, TopicPartition, errors
from kafka.coordinator import base
from kafka.structs import OffsetAndMetadata

_handle_join_group_response = base.BaseCoordinator._handle_join_group_response


def _join_again_with_the_member_id(self, future, send_time, response):
    """Tansu answers a first JoinGroup (even v2) with MEMBER_ID_REQUIRED and a member id to join
    with (KIP-394's way, meant for v4+); kafka-python 2.0.6 does not expect it and gives up. Join
    again with that id, as a newer client does."""
    if errors.for_code(response.error_code) is errors.MemberIdRequiredError:
        self._generation = base.Generation(self._generation.generation_id, response.member_id, None)
        future.failure(errors.RebalanceInProgressError("join again with the member id the broker gave"))
        return
    _handle_join_group_response(self, future, send_time, response)


base.BaseCoordinator._handle_join_group_response = _join_again_with_the_member_id

CLAIM = ("INSERT INTO processed_transactions (transaction_id) VALUES (%s) "
         "ON CONFLICT (transaction_id) DO NOTHING")
EFFECT = "UPDATE accounts SET balance = balance + %s WHERE id = %s"
PAYMENT = ("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents) "
           "VALUES (%s, %s, %s, %s)")


def say(*parts) -> None:
    print(*parts, flush=True)


def apply(conn: psycopg.Connection, event: dict, idempotent: bool) -> str:
    with conn.transaction():
        if idempotent and conn.execute(CLAIM, [event["transaction_id"]]).rowcount == 0:
            return "skipped"
        conn.execute(EFFECT, [event["amount_cents"], event["account_id"]])
        conn.execute(PAYMENT, [event["event_id"], event["transaction_id"], event["account_id"],
                               event["amount_cents"]])
    return "applied"


def handle(url: str, conn: psycopg.Connection | None, value: bytes, idempotent: bool):
    """Apply one record, reconnecting as often as the database session is ended under it."""
    try:
        event = json.loads(value)
    except ValueError:
        return conn, "not json"
    if event.get("type") != "credit":
        return conn, "not a credit"
    while True:
        try:
            if conn is None or conn.closed:
                conn = psycopg.connect(url, autocommit=True)
            return conn, apply(conn, event, idempotent)
        except psycopg.OperationalError as error:
            say("database:", str(error).splitlines()[0], "- reconnecting")
            conn = None
            time.sleep(0.2)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=("naive", "idempotent"))
    for name in ("--bootstrap", "--topic", "--group", "--client-id", "--database-url"):
        parser.add_argument(name, required=True)
    # The lane's Kafka user, when the lab's learners' listener asks for one (SASL/PLAIN).
    parser.add_argument("--sasl-username")
    parser.add_argument("--sasl-password")
    args = parser.parse_args()
    signed_in = (dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_plain_username=args.sasl_username,
                      sasl_plain_password=args.sasl_password) if args.sasl_username else {})
    consumer = KafkaConsumer(args.topic, bootstrap_servers=args.bootstrap, group_id=args.group, **signed_in,
                             client_id=args.client_id, enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=6000, heartbeat_interval_ms=1000,
                             # JoinGroup v2: kafka-python 2.0.6 does not answer MEMBER_ID_REQUIRED (v4+).
                             api_version=(2, 0, 0))
    conn = None
    try:
        while True:
            for partition, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    conn, outcome = handle(args.database_url, conn, record.value, args.mode == "idempotent")
                    say(f"p{record.partition}@{record.offset}: {outcome}")
                    consumer.commit_async({TopicPartition(record.topic, record.partition):
                                           OffsetAndMetadata(record.offset + 1, None)},
                                          callback=lambda offsets, result: None if not isinstance(result, Exception)
                                          else say("commit failed:", result))
    finally:
        consumer.close(autocommit=False)
        if conn is not None:
            conn.close()


if __name__ == "__main__":
    sys.exit(main())
