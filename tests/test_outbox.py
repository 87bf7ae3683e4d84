"""The transactional outbox, on real parts: the payments service's one transaction in PostgreSQL,
the relay process the session's lab agent keeps running, Tansu, the log reader and consumer
processes.

- one transaction: a payment that fails leaves no outbox row, an outbox row that fails leaves no
  payment;
- the relay publishes each row once and marks it sent;
- killed after publishing and before marking, the restarted relay publishes the row again: the
  log holds the same event id twice, `none` credits twice, `eventid-atomic` absorbs it;
- killed before publishing, the restarted relay publishes the row once.
"""
from __future__ import annotations

import os

import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from support import LabDriver
from webapp.domain.waits import wait_until
from webapp.store import outbox as store
from webapp.store import schema
from webapp.web.db import db

CREDIT = 10_000  # cents: R$ 100.00


def rows(app, lab: LabDriver, sql: str, **params) -> list:
    with app.app_context(), schema.connect_in(db.engine, lab.lab.schema) as conn:
        return conn.execute(text(sql), params).all()


def scalar(app, lab: LabDriver, sql: str, **params):
    return rows(app, lab, sql, **params)[0][0]


def outbox_state(lab: LabDriver) -> dict:
    response = lab.client.get("/api/v1/outbox")
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()


def wait_outbox(lab: LabDriver, condition, message: str, timeout: float = 30.0) -> dict:
    last: dict = {}

    def check():
        last.clear()
        last.update(outbox_state(lab))
        return condition(last) and last
    return wait_until(check, timeout=timeout, interval=0.2, message=lambda: f"{message}; last outbox: {last}")


def records_of(app, lab: LabDriver, event_id: str) -> list:
    """The log's records of one event (the log reader's mirror), in log order."""
    return rows(app, lab, 'SELECT partition, "offset", headers FROM log_records WHERE event_id = CAST(:e AS uuid) '
                          'ORDER BY partition, "offset"', e=event_id)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# --- the payments service's one transaction -------------------------------------------------

def test_a_payment_that_fails_writes_no_outbox_row(app, lab):
    first = lab.post("/outbox/publish", {"account_id": "acc-1", "amount_cents": CREDIT, "transaction_id": "PIX-OB-1"})
    assert first["payload"]["event_id"] == first["event_id"] and first["payload"]["amount_cents"] == CREDIT

    response = lab.client.post("/api/v1/outbox/publish",
                               json={"account_id": "acc-1", "amount_cents": 555, "transaction_id": "PIX-OB-1"})
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["field"] == "transaction_id"
    assert "no outbox row was written" in response.get_json()["error"]

    unknown = lab.client.post("/api/v1/outbox/publish", json={"account_id": "acc-404", "amount_cents": 1})
    assert unknown.status_code == 400 and unknown.get_json()["field"] == "account_id"

    assert scalar(app, lab, "SELECT count(*) FROM source_payments") == 1
    outbox = rows(app, lab, "SELECT event_id::text, payload FROM outbox")
    assert [row[0] for row in outbox] == [first["event_id"]]


def test_an_outbox_row_that_fails_takes_its_payment_with_it(app, lab):
    """The payment is written first; when its outbox row cannot be (the event id is in the outbox
    already), the whole transaction rolls back and the payment is gone too."""
    taken = lab.post("/outbox/publish", {"account_id": "acc-2", "amount_cents": 700})
    with app.app_context():
        with pytest.raises(IntegrityError, match="outbox_event_id_key"):
            with schema.begin_in(db.engine, lab.lab.schema) as conn:
                store.write_payment(conn, {"transaction_id": "PIX-OB-ORPHAN", "event_id": taken["event_id"],
                                           "account_id": "acc-2", "amount_cents": 700}, "acc-2", "{}")
    assert scalar(app, lab, "SELECT count(*) FROM source_payments WHERE transaction_id = 'PIX-OB-ORPHAN'") == 0
    assert scalar(app, lab, "SELECT count(*) FROM outbox") == 1


# --- the relay ------------------------------------------------------------------------------

def test_the_relay_publishes_each_row_once_and_marks_it_sent(app, lab):
    written = [lab.post("/outbox/publish", {"account_id": "acc-3", "amount_cents": cents}) for cents in (100, 200)]
    sent = wait_outbox(lab, lambda o: o["sent"] == 2 and o["pending"] == 0, "the relay never marked both rows sent")
    assert sent["relay"]["state"] == "running" and sent["relay"]["published"] == 2
    assert sent["relay"]["republished"] == 0 and sent["republished_events"] == []
    for payment in written:
        records = wait_until(lambda: records_of(app, lab, payment["event_id"]), timeout=15,
                             message="the log reader never mirrored the relay's record")
        assert len(records) == 1
        assert ["source", "outbox-relay"] in records[0][2]
    assert [row["attempts"] for row in sent["newest"]] == [1, 1]
    kinds = [row[0] for row in rows(app, lab, "SELECT detail->>'action' FROM timeline WHERE kind = 'outbox' ORDER BY id")]
    assert kinds.count("written") == 2 and "started" in kinds and "published" in kinds and "marked" in kinds


def test_killed_after_publish_before_mark_the_relay_publishes_again_none_doubles_eventid_atomic_absorbs(app, lab):
    lab.post("/groups", {"group": "atomic", "strategy": "eventid-atomic", "lane": "atomic"})
    naive = lab.start_consumer(group="payments", name="c1")
    atomic = lab.start_consumer(group="atomic", name="a1")
    lab.wait_assigned(naive["consumer_id"])
    lab.wait_assigned(atomic["consumer_id"])
    # The relay runs before the fault is armed: arming it creates the lab's relay row.
    armed = lab.post("/outbox/relay/arm", {"point": "relay-after-publish-before-mark"})
    assert armed["relay"]["armed_point"] == "relay-after-publish-before-mark"
    first_pid = wait_outbox(lab, lambda o: o["relay"]["state"] == "running", "no relay started")["relay"]["pid"]

    payment = lab.post("/outbox/publish", {"account_id": "acc-1", "amount_cents": CREDIT})
    done = wait_outbox(lab, lambda o: o["sent"] == 1 and o["relay"]["republished"] == 1,
                       "the restarted relay never published the unmarked row again", timeout=45)
    assert not pid_alive(first_pid), "the armed relay process is still alive"
    assert done["relay"]["pid"] != first_pid and done["relay"]["starts"] >= 2
    assert done["relay"]["crashed_at"] == "relay-after-publish-before-mark" and done["relay"]["armed_point"] is None
    assert done["newest"][0]["attempts"] == 2 and done["republished_events"][0]["event_id"] == payment["event_id"]

    records = wait_until(lambda: len(records_of(app, lab, payment["event_id"])) == 2 and records_of(app, lab, payment["event_id"]),
                         timeout=15, message="the log does not hold the event twice")
    assert len({(p, o) for p, o, _ in records}) == 2
    lab.wait_caught_up(timeout=45)
    lab.wait(lambda s: s["lanes"] and all(l["verdict"]["records_pending"] == 0 for l in s["lanes"]),
             "the atomic lane never consumed both records", timeout=45)
    state = lab.state()
    assert next(a for a in state["accounts"] if a["id"] == "acc-1")["actual"] == 2 * CREDIT
    assert state["verdict"]["duplicates_applied"] == 1
    why = state["verdict"]["anomalies"][0]["why"]
    assert "outbox relay published it twice" in why and "relay-after-publish-before-mark" in why, why
    lane = next(l for l in state["lanes"] if l["lane"] == "atomic")
    assert lane["verdict"]["duplicates_applied"] == 0 and lane["verdict"]["redeliveries_absorbed"] == 1, lane


def test_killed_before_publish_the_restarted_relay_publishes_the_row_once(app, lab):
    lab.post("/outbox/relay/arm", {"point": "relay-before-publish"})
    payment = lab.post("/outbox/publish", {"account_id": "acc-4", "amount_cents": 300})
    done = wait_outbox(lab, lambda o: o["sent"] == 1, "the restarted relay never published the row", timeout=45)
    assert done["relay"]["crashed_at"] == "relay-before-publish" and done["relay"]["starts"] >= 2
    assert done["relay"]["published"] == 1 and done["relay"]["republished"] == 0
    records = wait_until(lambda: records_of(app, lab, payment["event_id"]), timeout=15,
                         message="the log reader never mirrored the relay's record")
    assert len(records) == 1


def test_arming_the_relay_refuses_an_unknown_point(lab):
    response = lab.client.post("/api/v1/outbox/relay/arm", json={"point": "after-commit"})
    assert response.status_code == 400 and response.get_json()["field"] == "point"


def test_a_lab_reset_ends_its_relay_and_a_new_payment_starts_another(app, lab):
    lab.post("/outbox/publish", {"account_id": "acc-5", "amount_cents": 100})
    first = wait_outbox(lab, lambda o: o["sent"] == 1 and o["relay"]["state"] == "running", "no relay ran")["relay"]
    lab.post("/lab/reset", {"partitions": 1})
    wait_until(lambda: not pid_alive(first["pid"]), timeout=30, message="the relay of the reset lab still runs")
    assert outbox_state(lab)["relay"]["state"] == "not asked for"

    lab.post("/outbox/publish", {"account_id": "acc-5", "amount_cents": 200})
    again = wait_outbox(lab, lambda o: o["sent"] == 1 and o["relay"]["state"] == "running",
                        "no relay started for the reset lab")["relay"]
    assert again["pid"] != first["pid"] and again["starts"] == 1
