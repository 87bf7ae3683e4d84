"""The JSON API's contract: bad bodies get 400 naming the field, unknown ids 404, JSON only."""
import threading

import psycopg
import pytest

from webapp.domain.waits import wait_until
from webapp.store.connection import CONTROL_SCHEMA, psycopg_conninfo


@pytest.mark.parametrize("body,field", [
    ({"account_id": "acc-1", "amount": "ten"}, "amount"),
    ({"account_id": "acc-1", "amount": "-3"}, "amount"),
    ({"account_id": "acc-1", "amount": "1.234"}, "amount"),
    ({"account_id": "acc-1", "amount_cents": 0}, "amount_cents"),
    ({"account_id": "", "amount": "1"}, "account_id"),
    ({"account_id": "acc-1", "amount": "1", "type": "debit"}, "type"),
    ({"account_id": "acc-1", "type": "set_status", "status": "MAYBE"}, "status"),
    ({"account_id": "acc-1", "amount": "1", "mode": "twice"}, "mode"),
    ({"account_id": "acc-1", "amount": "1", "mode": "burst", "count": 0}, "count"),
    ({"account_id": "acc-1", "amount": "1", "mode": "burst", "count": 10001}, "count"),
    ({"mode": "poison", "poison_kind": "cyanide"}, "poison_kind"),
    ({"account_id": "acc-1", "amount": "1", "idempotent": "perhaps"}, "idempotent"),
])
def test_publish_rejects_bad_fields_and_publishes_nothing(lab, body, field):
    response = lab.client.post("/api/v1/publish", json=body)
    assert response.status_code == 400
    assert response.get_json()["field"] == field
    assert all(p["log_end"] == 0 for p in lab.state()["partitions"])


def test_publish_to_an_unknown_account_is_refused_by_the_agent(lab):
    response = lab.client.post("/api/v1/publish", json={"account_id": "acc-77", "amount": "1"})
    assert response.status_code == 400
    assert "no account 'acc-77'" in response.get_json()["error"]


def test_resend_with_nothing_published_is_explained(lab):
    response = lab.client.post("/api/v1/publish", json={"mode": "resend"})
    assert response.status_code == 400
    assert "nothing published yet" in response.get_json()["error"]


def test_resend_publishes_the_same_event_id_again(lab):
    first = lab.credit("acc-1", 100)
    again = lab.publish(mode="resend")["records"][0]
    assert again["event_id"] == first["event_id"]
    assert lab.state()["verdict"]["transactions"] == 1


@pytest.mark.parametrize("path", ["/consumers/999999/kill", "/consumers/999999/arm", "/consumers/999999/step"])
def test_unknown_consumer_is_404(lab, path):
    response = lab.client.post(f"/api/v1{path}", json={})
    assert response.status_code == 404
    assert "no consumer 999999" in response.get_json()["error"]


def test_unknown_group_is_404(lab):
    assert lab.client.post("/api/v1/groups/nope/strategy", json={"strategy": "none"}).status_code == 404
    assert lab.client.post("/api/v1/groups/nope/reset-offsets", json={"mode": "earliest"}).status_code == 404


@pytest.mark.parametrize("path,body,field", [
    ("/consumers", {"strategy": "magic"}, "strategy"),
    ("/consumers", {"name": "Bad Name"}, "name"),
    ("/groups", {"group": "g2", "strategy": "sometimes"}, "strategy"),
    ("/groups/payments/strategy", {"strategy": ""}, "strategy"),
    ("/groups/payments/reset-offsets", {"mode": "back", "back": 0}, "back"),
    ("/groups/payments/reset-offsets", {"mode": "timestamp", "timestamp": "noon"}, "timestamp"),
    ("/groups/payments/reset-offsets", {"mode": "offset", "offsets": "[1]"}, "offsets"),
    ("/ttl", {"ttl_seconds": -1}, "ttl_seconds"),
    ("/ttl/cleanup", {"ttl_seconds": "soon"}, "ttl_seconds"),
    ("/lab/reset", {"partitions": 40}, "partitions"),
])
def test_other_bad_bodies_name_the_field(lab, path, body, field):
    response = lab.client.post(f"/api/v1{path}", json=body)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["field"] == field


def test_arm_rejects_an_unknown_point(lab):
    consumer = lab.start_consumer(name="c1")["consumer_id"]
    response = lab.client.post(f"/api/v1/consumers/{consumer}/arm", json={"point": "whenever"})
    assert response.status_code == 400 and response.get_json()["field"] == "point"


def test_a_consumer_started_with_a_crash_point_has_it_armed_before_it_runs_and_an_unknown_one_is_refused(lab):
    refused = lab.client.post("/api/v1/consumers", json={"name": "c0", "point": "whenever"})
    assert refused.status_code == 400 and refused.get_json()["field"] == "point"
    started = lab.start_consumer(name="c1", point="between-check-and-act", action="freeze")
    consumer = lab.client.get(f"/api/v1/consumers/{started['consumer_id']}").get_json()
    assert (consumer["armed_point"], consumer["armed_action"], consumer["armed_always"]) == \
        ("between-check-and-act", "freeze", False), consumer


def test_starting_a_consumer_with_another_strategy_than_its_group_is_refused(lab):
    response = lab.client.post("/api/v1/consumers", json={"strategy": "eventid-atomic"})
    assert response.status_code == 400
    assert "uses none" in response.get_json()["error"]


@pytest.mark.parametrize("data,content_type,message", [
    ("{not json", "application/json", "not valid JSON"),
    ("[1, 2]", "application/json", "JSON object"),
    ("account_id=acc-1", "application/x-www-form-urlencoded", "application/json"),
])
def test_body_must_be_a_json_object(lab, data, content_type, message):
    response = lab.client.post("/api/v1/publish", data=data, content_type=content_type)
    assert response.status_code == 400
    assert message in response.get_json()["error"]


def test_unknown_endpoint_and_method_answer_json(lab):
    assert lab.client.get("/api/v1/nothing").get_json()["error"] == "There is nothing at /api/v1/nothing."
    response = lab.client.get("/api/v1/publish")
    assert response.status_code == 405 and "not allowed" in response.get_json()["error"]


def test_no_agent_is_503(app_factory, services, lab_name):
    """A database no lab agent serves: controls answer 503 with the reason, not a hang."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    from webapp.store.connection import sqlalchemy_url
    from webapp.store.labs import ensure_control_schema

    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("DROP DATABASE IF EXISTS no_agent"))
        conn.execute(text("CREATE DATABASE no_agent"))
    engine.dispose()
    url = services.database_url.rsplit("/", 1)[0] + "/no_agent"
    other = create_engine(sqlalchemy_url(url), poolclass=NullPool)
    with other.begin() as conn:
        ensure_control_schema(conn)
    other.dispose()
    client = app_factory(DATABASE_URL=url, LAB_NAME=lab_name).test_client()
    response = client.post("/api/v1/publish", json={"account_id": "acc-1", "amount": "1"})
    assert response.status_code == 503
    assert "no lab agent is running" in response.get_json()["error"]


def test_state_judges_each_lane_against_the_same_log(lab):
    lab.post("/groups", {"group": "atomic", "strategy": "eventid-atomic", "lane": "atomic"})
    lab.start_consumer(name="a1", group="atomic")
    lab.credit("acc-4", 300)

    def lane_settled(state):
        [lane] = state["lanes"]
        return lane["verdict"]["status"] == "exactly-once" and lane
    lane = lab.wait(lane_settled, "the lane's verdict never settled", timeout=45)
    assert lane["lane"] == "atomic" and lane["groups"] == [{"group_id": f"{lab.lab.name}.atomic",
                                                             "strategy": "eventid-atomic"}]
    assert next(a for a in lane["accounts"] if a["id"] == "acc-4")["actual"] == 300
    # The lab's own copy has no consumer: the same log, judged there, is still pending.
    assert lab.state()["verdict"]["status"] == "pending"
    # The running summaries and the whole log judge alike, lab and lane (?exact=true: VERDICT_SQL).
    exact = lab.client.get("/api/v1/state?exact=true").get_json()
    summarized = lab.client.get("/api/v1/state").get_json()
    for key in ("accounts", "verdict", "lanes", "producer_duplicates"):
        assert summarized[key] == exact[key], key
    wrong = lab.client.get("/api/v1/state?exact=perhaps")
    assert wrong.status_code == 400 and wrong.get_json()["field"] == "exact"


@pytest.mark.long
def test_an_agent_that_does_not_finish_in_time_is_a_503_with_the_reason_not_bad_input(services, lab):
    """A busy agent (thirty attendees' steps queued) is no fault of the request's: not a 400 naming a
    field, but a 503 saying what happened to the command. The agent is kept busy for real: the
    test's transaction holds the lab's publish journal locked, so the first publish waits on it in
    the agent past the request's 30 s (still running) and the second waits in the queue behind it
    (pending at its deadline: withdrawn, never carried out)."""
    app, schema = lab.client.application, lab.lab.schema
    answers: dict[str, object] = {}

    def publish(which: str, cents: int) -> threading.Thread:
        def post() -> None:
            answers[which] = app.test_client().post("/api/v1/publish",
                                                    json={"account_id": "acc-1", "amount_cents": cents})
        thread = threading.Thread(target=post)
        thread.start()
        return thread

    with psycopg.connect(psycopg_conninfo(services.database_url), autocommit=True) as watcher:
        def commands(status: str) -> list[int]:
            return [row[0] for row in watcher.execute(
                f"SELECT id FROM {CONTROL_SCHEMA}.commands WHERE lab = %s AND verb = 'publish' AND status = %s "
                "ORDER BY id", [lab.lab.name, status]).fetchall()]

        def journaled() -> list[int]:
            return [row[0] for row in watcher.execute(f'SELECT amount_cents FROM "{schema}".published_events')]
        with psycopg.connect(psycopg_conninfo(services.database_url)) as locker:
            locker.execute(f'LOCK TABLE "{schema}".published_events IN ACCESS EXCLUSIVE MODE')
            first = publish("first", 101)
            running = wait_until(lambda: commands("running"), timeout=15, message="the agent never took the publish")
            second = publish("second", 202)
            pending = wait_until(lambda: commands("pending"), timeout=15,
                                 message="the second publish was never queued")
            first.join(timeout=60)
            second.join(timeout=60)
        # The lock is released (rolled back): the agent carries on with the first publish.
        still_running, withdrawn = answers["first"], answers["second"]
        assert still_running.status_code == 503 and still_running.get_json() == {
            "error": f"a lab agent took command {running[0]} and had not finished it within 30s: it is still running"}
        assert withdrawn.status_code == 503 and withdrawn.get_json() == {
            "error": f"no lab agent finished command {pending[0]} within 30s (it is pending); is the agent running?"}
        wait_until(lambda: journaled() == [101], timeout=30,
                   message=lambda: f"the agent never finished the first publish alone: {journaled()}")
        wait_until(lambda: commands("done") == running, timeout=30, message="the first publish never finished")
        assert commands("pending") == [] and journaled() == [101]  # the withdrawn one is never carried out
