"""The change feed's triggers on the control tables (store/lab_changes.py), on the real PostgreSQL:
a row that names a lab announces it at commit, and a consumer's write that changes nothing but its
heartbeat announces nothing (it lands twice a second per consumer)."""
from __future__ import annotations

import psycopg
import pytest

from webapp.domain.waits import wait_until
from webapp.store.connection import CONTROL_SCHEMA, psycopg_conninfo
from webapp.store.lab_changes import CHANNEL, QUIET_SESSION

C = CONTROL_SCHEMA


@pytest.fixture
def listener(services):
    """A connection that LISTENs on the change feed; ``heard()`` drains what it was sent."""
    conn = psycopg.connect(psycopg_conninfo(services.database_url), autocommit=True)
    conn.execute(f"LISTEN {CHANNEL}")

    def heard(lab: str, by: int | None = None) -> int:
        """Announcements of ``lab`` (by the backend whose pid is ``by``, when given)."""
        return sum(1 for pid in pids(lab) if by is None or pid == by)

    def pids(lab: str) -> list[int]:
        """The backends that announced ``lab``, one entry per announcement."""
        return [notify.pid for notify in conn.notifies(timeout=0.5) if notify.payload == lab]
    heard.pids = pids
    try:
        yield heard
    finally:
        conn.close()


@pytest.fixture
def writer(services):
    conn = psycopg.connect(psycopg_conninfo(services.database_url), autocommit=True)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def consumer_row(writer, lab_name):
    consumer_id = writer.execute(f"INSERT INTO {C}.consumers (lab, name, group_id, state, heartbeat_at) "
                                 "VALUES (%s, 'c1', 'g', 'running', now()) RETURNING id", [lab_name]).fetchone()[0]
    try:
        yield consumer_id
    finally:
        writer.execute(f"DELETE FROM {C}.consumers WHERE id = %s", [consumer_id])


def test_a_consumers_heartbeat_alone_announces_nothing_any_other_change_announces_its_lab(
        listener, writer, consumer_row, lab_name):
    listener(lab_name)  # the insert's announcement
    writer.execute(f"UPDATE {C}.consumers SET heartbeat_at = now() + interval '1 second' WHERE id = %s", [consumer_row])
    # The consumer's own write (webapp/consumer/control.py) sets every column to what it holds.
    writer.execute(f"UPDATE {C}.consumers SET state = state, positions = positions, heartbeat_at = now() "
                   "WHERE id = %s", [consumer_row])
    assert listener(lab_name) == 0
    writer.execute(f"UPDATE {C}.consumers SET positions = '{{\"0\": 3}}', heartbeat_at = now() WHERE id = %s",
                   [consumer_row])
    assert listener(lab_name) == 1


@pytest.mark.parametrize("table, row", [
    ("scenario_runs", "(scenario, lab, status, progress) VALUES ('01_naive_double_credit', %s, 'pending', '{}')"),
    ("attendees", "(class_code, name, name_key, lab) VALUES ('feed-test', 'Ana', 'ana', %s)"),
])
def test_a_guided_run_or_an_attendee_announces_its_lab(listener, writer, lab_name, table, row):
    writer.execute(f"INSERT INTO {C}.{table} {row}", [lab_name])
    try:
        assert listener(lab_name) == 1
    finally:
        writer.execute(f"DELETE FROM {C}.{table} WHERE lab = %s", [lab_name])
    assert listener(lab_name) == 1



def test_a_quiet_session_announces_nothing_from_a_lab_table_any_other_session_announces_its_lab(
        listener, writer, lab, lab_name):
    schema = lab.lab.schema
    writer.execute(QUIET_SESSION)
    writer.execute(f'UPDATE "{schema}".accounts SET balance = balance + 1 WHERE id = %s', ["acc-1"])
    assert listener(lab_name, by=writer.info.backend_pid) == 0
    with psycopg.connect(psycopg_conninfo(lab.client.application.config["DATABASE_URL"]), autocommit=True) as other:
        other.execute(f'UPDATE "{schema}".accounts SET balance = balance - 1 WHERE id = %s', ["acc-1"])
        assert listener(lab_name, by=other.info.backend_pid) == 1


def test_a_consumers_records_are_announced_by_its_reports_not_by_its_effect_transactions(listener, writer, lab,
                                                                                          lab_name):
    """A transaction that notifies takes PostgreSQL's cluster-wide notify lock at commit: the
    consumer's 200 effect transactions announce nothing, its reports (a few a second) do."""
    consumer_id = lab.start_consumer(name="c1")["consumer_id"]
    lab.wait_assigned(consumer_id)
    effects_pid, control_pid = (writer.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s",
        [f"lab {lab_name} c1 {which}"]).fetchone()[0] for which in ("effects", "control"))
    listener(lab_name)  # the start's announcements
    lab.publish(mode="burst", count=200, account_id="acc-1", amount_cents=100)
    lab.wait_consumer(consumer_id, lambda c: c["applied"] == 200, "the consumer never reported 200 applied",
                      timeout=60)
    collected = listener.pids(lab_name)
    by_effects = sum(1 for pid in collected if pid == effects_pid)
    by_reports = sum(1 for pid in collected if pid == control_pid)
    assert by_effects == 0
    assert 1 <= by_reports < 40, f"{by_reports} reports announced 200 records"


def test_an_offset_snapshot_that_found_nothing_moved_writes_and_announces_nothing(services, listener, lab, lab_name):
    """The agent snapshots every active lab's committed offsets each second: a snapshot equal to the
    last one writes nothing, so it announces nothing (nor queues a summary mark)."""
    from webapp.agent.periodic import snapshot_offsets_of
    from webapp.kafka.admin import admin_client

    consumer_id = lab.start_consumer(name="c1")["consumer_id"]
    lab.wait_assigned(consumer_id)
    lab.credit("acc-1", 100)
    lab.wait_caught_up()
    admin = admin_client(services.bootstrap_servers)
    with psycopg.connect(psycopg_conninfo(services.database_url), autocommit=True) as conn:
        schema = lab.lab.schema

        def written() -> list:
            return conn.execute(f'SELECT group_id, partition, committed, read_at FROM "{schema}".group_offsets '
                                "ORDER BY group_id, partition").fetchall()
        snapshot_offsets_of(conn, admin, [lab.lab])  # whatever the agent has not written yet
        listener(lab_name)
        before = written()
        snapshot_offsets_of(conn, admin, [lab.lab])
        assert listener(lab_name, by=conn.info.backend_pid) == 0
        assert written() == before
        lab.credit("acc-1", 100)
        group_id = lab.lab.group_id("payments")

        def committed() -> int:
            return sum(c or 0 for (c,) in conn.execute(
                f'SELECT committed FROM "{schema}".group_offsets WHERE group_id = %s', [group_id]).fetchall())
        wait_until(lambda: (snapshot_offsets_of(conn, admin, [lab.lab]), committed())[1] == 2, timeout=30,
                   message="the snapshot never wrote the offset that moved")
