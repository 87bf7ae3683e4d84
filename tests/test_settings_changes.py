"""Changes of what a consumer applies are notified to it, and acknowledged (webapp/store/settings_changes.py).

The consumer no longer reads its settings before every record; a change made before a record was
polled still applies to that record: the triggers NOTIFY at the change's commit, whoever makes it,
the consumer looks at its control connection before each record, and an operation returns once
the running consumers have read the change. Real consumer processes on the real broker.
"""
from __future__ import annotations

import psycopg
import pytest
from confluent_kafka import Producer

from webapp.domain import events
from webapp.domain.waits import wait_until
from webapp.store.connection import CONTROL_SCHEMA, connect


def start(lab, name="c1") -> int:
    consumer_id = lab.start_consumer(name=name)["consumer_id"]
    lab.wait_assigned(consumer_id)
    return consumer_id


@pytest.fixture
def database(services):
    """An autocommit connection of the test's own: a person in psql."""
    conn = connect(services.database_url, autocommit=True)
    yield conn
    conn.close()


def notified(conn: psycopg.Connection, timeout: float = 5.0) -> list[str]:
    """The payloads of the settings notifications ``conn`` receives within ``timeout``."""
    return [n.payload for n in conn.notifies(timeout=timeout, stop_after=1) if n.channel == "lab_settings"]


@pytest.mark.parametrize("change", [
    "UPDATE {control}.consumers SET armed_point = 'before-effect', armed_action = 'crash' WHERE lab = %(lab)s",
    "UPDATE {control}.consumers SET step_mode = true WHERE lab = %(lab)s",
    "UPDATE {schema}.consumer_groups SET strategy = 'eventid-atomic'",
    "INSERT INTO {schema}.settings (key, value) VALUES ('lock_timeout_ms', '250') "
    "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
    "DELETE FROM {control}.consumers WHERE lab = %(lab)s",
])
def test_every_change_of_what_a_consumer_applies_is_notified_with_its_lab(lab, database, services, change):
    lab.start_consumer(name="c1")  # a control row to change
    listener = connect(services.database_url, autocommit=True)
    try:
        listener.execute("LISTEN lab_settings")
        database.execute(change.format(control=CONTROL_SCHEMA, schema=f'"{lab.lab.schema}"'), {"lab": lab.lab.name})
        assert notified(listener) == [lab.lab.name]
    finally:
        listener.close()


def test_a_consumers_report_is_not_a_change_to_notify(lab, database, services):
    lab.start_consumer(name="c1")
    listener = connect(services.database_url, autocommit=True)
    try:
        listener.execute("LISTEN lab_settings")
        database.execute(f"UPDATE {CONTROL_SCHEMA}.consumers SET heartbeat_at = now(), applied = applied + 1 "
                         "WHERE lab = %s", [lab.lab.name])
        assert notified(listener, timeout=0.5) == []
    finally:
        listener.close()


def test_a_fault_armed_by_hand_applies_to_the_next_credit_once_the_consumer_has_read_it(lab, database, services):
    # No operation waits for the consumer here. PostgreSQL forwards the UPDATE's notification to the
    # consumer's listening session after the commit returns, usually within milliseconds; on a loaded
    # machine a credit produced right after once reached the consumer first (a CI run). What holds:
    # once the consumer has acknowledged reading its settings since the change, the next credit
    # meets the fault.
    c1 = start(lab)
    producer = Producer({"bootstrap.servers": services.bootstrap_servers, "acks": "all", "linger.ms": 0})
    event = events.credit("acc-1", 700)
    database.execute(f"UPDATE {CONTROL_SCHEMA}.consumers SET armed_point = 'before-effect', armed_action = 'crash' "
                     "WHERE id = %s", [c1])
    changed_at = database.execute("SELECT clock_timestamp()").fetchone()[0]
    wait_until(lambda: database.execute(f"SELECT settings_seen_at >= %s FROM {CONTROL_SCHEMA}.consumers WHERE id = %s",
                                        [changed_at, c1]).fetchone()[0],
               timeout=10, message="the consumer never read its settings after the fault was armed")
    producer.produce(lab.lab.topic, value=event.encode(), key=event.key)
    assert producer.flush(10) == 0, "the credit was not acknowledged"
    crashed = lab.wait_consumer(c1, lambda c: c["state"] == "crashed", "did not crash on the next credit")
    assert crashed["step_at"] == "before-effect"
    assert lab.account("acc-1")["actual"] == 0


def test_an_operation_returns_once_the_running_consumers_have_read_the_change(lab, database):
    c1 = start(lab)
    result = lab.post(f"/consumers/{c1}/arm", {"point": "after-commit", "action": "crash"})
    assert "not_yet_seen_by" not in result
    # The fault's timeline entry is stamped with the operation's transaction time, before its commit.
    seen_after = database.execute(
        f"SELECT settings_seen_at > (SELECT max(at) FROM \"{lab.lab.schema}\".timeline WHERE kind = 'fault') "
        f"FROM {CONTROL_SCHEMA}.consumers WHERE id = %s", [c1]).fetchone()[0]
    assert seen_after, "the consumer's last read of its settings is older than the change"


def test_a_consumer_waiting_on_a_lock_is_named_and_applies_the_change_from_its_next_record(lab, client, database,
                                                                                          services):
    start(lab)
    group = lab.lab.group_id("payments")
    holder = connect(services.database_url, autocommit=False)
    try:
        holder.execute(f'SELECT 1 FROM "{lab.lab.schema}".accounts WHERE id = %s FOR UPDATE', ["acc-1"])
        first = lab.credit("acc-1", 100)
        wait_until(lambda: database.execute(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = %s AND wait_event_type = 'Lock'",
            [f"lab {lab.lab.name} c1 effects"]).fetchone(), timeout=30,
            message="the consumer never waited on the account's lock")
        result = lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
        assert result["not_yet_seen_by"] == ["c1"], result
        form = client.post("/controls/groups/strategy", data={"group": "payments", "strategy": "business-key"})
        assert "Not yet read by c1 (busy with a record)" in form.get_data(as_text=True)
    finally:
        holder.rollback()
        holder.close()
    second = lab.credit("acc-1", 200)
    lab.wait(lambda s: lab.account("acc-1")["actual"] == 300, "both credits were not applied")
    strategies = dict(database.execute(
        f'SELECT "offset", strategy FROM "{lab.lab.schema}".deliveries WHERE group_id = %s AND partition = %s',
        [group, first["partition"]]).fetchall())
    assert strategies[first["offset"]] == "none", "the record polled before the switch keeps its strategy"
    assert strategies[second["offset"]] == "business-key", "the next record is applied with the latest one"
