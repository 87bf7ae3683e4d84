"""The dashboard's controls: HTML forms over the operation registry, on the real lab agent.

A good request answers with its form and a notice; bad input answers 422 with the error next
to the named field and changes nothing; CSRF and LAB_TOKEN guard every form.
"""
from __future__ import annotations

import re

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from webapp.domain.lab import Lab
from webapp.store import consumers
from webapp.store.connection import sqlalchemy_url
from webapp.store.labs import create_database_state, ensure_control_schema


def journal_count(lab) -> int:
    return sum(p["log_end"] for p in lab.state()["partitions"])


def lab_commands(app, lab) -> list[tuple]:
    """Every command the web side queued for this lab's agent, as (id, verb, status)."""
    from webapp.web.db import db
    with app.app_context(), db.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(
            "SELECT id, verb, status FROM lab_control.commands WHERE lab = :lab ORDER BY id"), {"lab": lab.lab.name})]


def control_rows(engine, lab_name: str) -> dict[str, list]:
    """The control rows an operation could change: fault proxies, the lab's commands and consumers."""
    with engine.connect() as conn:
        return {"fault_proxies": [tuple(r) for r in conn.execute(text(
                    "SELECT name, version FROM lab_control.fault_proxies ORDER BY name"))],
                "fault_proxy_labs": [tuple(r) for r in conn.execute(text(
                    "SELECT proxy, lab, blocked_commits FROM lab_control.fault_proxy_labs ORDER BY proxy, lab"))],
                "commands": [tuple(r) for r in conn.execute(text(
                    "SELECT id, verb, status FROM lab_control.commands WHERE lab = :lab ORDER BY id"), {"lab": lab_name})],
                "consumers": [tuple(r) for r in conn.execute(text(
                    "SELECT id, name, state, pid, positions, assigned FROM lab_control.consumers WHERE lab = :lab "
                    "ORDER BY id"), {"lab": lab_name})]}


def test_publish_form_publishes_and_says_where(client, lab):
    response = client.post("/controls/publish", data={"mode": "normal", "type": "credit", "account_id": "acc-2",
                                                      "amount": "12.50", "idempotent": "on"})
    html = response.get_data(as_text=True)
    assert response.status_code == 200
    assert "Published 1 normal record(s): P" in html and 'id="form-publish"' in html
    assert lab.account("acc-2")["expected"] == 1250
    # The form keeps what was typed, so the next click publishes the same again.
    assert 'value="12.50"' in html


def test_publish_form_burst_uses_count(client, lab):
    response = client.post("/controls/publish", data={"mode": "burst", "type": "credit", "account_id": "acc-1",
                                                      "amount": "1", "count": "4"})
    assert response.status_code == 200
    assert journal_count(lab) == 4


@pytest.mark.parametrize("form,field", [
    ({"mode": "normal", "type": "credit", "account_id": "acc-1", "amount": "ten"}, "amount"),
    ({"mode": "normal", "type": "credit", "account_id": "acc-1", "amount": "-3"}, "amount"),
    ({"mode": "burst", "type": "credit", "account_id": "acc-1", "amount": "1", "count": "0"}, "count"),
    ({"mode": "normal", "type": "set_status", "account_id": "acc-1", "status": "MAYBE"}, "status"),
    ({"mode": "normal", "type": "credit", "account_id": "acc-77", "amount": "1"}, "account_id"),  # the agent refuses it
    ({"mode": "twice", "account_id": "acc-1", "amount": "1"}, "mode"),
])
def test_bad_publish_input_shows_the_error_next_to_its_field_and_publishes_nothing(client, lab, form, field):
    response = client.post("/controls/publish", data=form)
    html = response.get_data(as_text=True)
    assert response.status_code == 422
    assert f'id="publish-{field}-error"' in html
    assert re.search(rf'id="publish-{field}"[^>]*aria-invalid="true"', html)
    assert journal_count(lab) == 0


@pytest.mark.parametrize("term, field, refusal", [
    ({"acks": "1"}, "acks", "`acks` must be set to `all` when `enable.idempotence` is true"),
    ({"retries": "0"}, "retries", "`retries` must be set &gt;= 1 when `enable.idempotence` is true"),
    ({"max_in_flight": "6"}, "max_in_flight", "`max.in.flight` must be set &lt;= 5 when `enable.idempotence` is true"),
])
def test_the_producer_form_shows_librdkafka_refusing_an_idempotent_producer_without_its_terms(
        client, lab, term, field, refusal):
    """The idempotent producer's terms (source text 000: acks=all, retries > 0, ordering through
    max.in.flight): asked for on the form, the producer is never created and librdkafka's own
    reason shows next to the field; on a plain producer the same setting is taken."""
    form = {"mode": "normal", "type": "credit", "account_id": "acc-1", "amount": "1", "idempotent": "on", **term}
    response = client.post("/controls/publish", data=form)
    html = response.get_data(as_text=True)
    assert response.status_code == 422, html
    error = re.search(rf'id="publish-{field}-error"[^>]*>(.*?)</p>', html, re.S)
    assert error and "librdkafka refuses to create this producer" in error[1] and refusal in error[1], html
    assert journal_count(lab) == 0
    plain = client.post("/controls/publish", data={**form, "idempotent": "off"})
    assert plain.status_code == 200 and "Published 1 normal record(s)" in plain.get_data(as_text=True)
    assert journal_count(lab) == 1


def test_consumer_form_and_buttons_drive_a_real_process(client, lab):
    response = client.post("/controls/consumers", data={"group": "payments", "strategy": "none", "name": "c9"})
    assert response.status_code == 200 and "Started consumer c9" in response.get_data(as_text=True)
    consumer = next(c for c in lab.state()["consumers"] if c["name"] == "c9")
    lab.wait_assigned(consumer["id"])
    base = f"/controls/consumers/{consumer['id']}"

    response = client.post(f"{base}/arm", data={"fault": "crash|always|after-effect-before-commit"})
    assert response.status_code == 200 and "crash armed at after-effect-before-commit (every time)" in \
        response.get_data(as_text=True)
    assert lab.consumer(consumer["id"])["armed_point"] == "after-effect-before-commit"
    assert lab.consumer(consumer["id"])["armed_always"] is True
    assert client.post(f"{base}/arm", data={"fault": ""}).status_code == 200
    assert lab.consumer(consumer["id"])["armed_point"] is None

    # Stepping a consumer that is not in step mode: a clear refusal, nothing changes.
    response = client.post(f"{base}/step", data={})
    assert response.status_code == 422 and "not in step mode" in response.get_data(as_text=True)

    assert client.post(f"{base}/freeze", data={}).status_code == 200
    lab.wait_state(consumer["id"], "frozen")
    assert client.post(f"{base}/thaw", data={}).status_code == 200
    lab.wait_state(consumer["id"], "running")
    assert client.post(f"{base}/stop", data={}).status_code == 200
    lab.wait_state(consumer["id"], "stopped")


def test_blocking_commits_without_a_fault_proxy_says_so_and_changes_nothing(agentless_database, app_factory,
                                                                             lab_name):
    """In a database of its own, where no fault proxy ever reported (the session's database may
    hold a fresh report of test_faultproxy.py's proxy, depending on the order the tests run)."""
    app = app_factory(LAB_NAME=lab_name, DATABASE_URL=agentless_database)
    client = app.test_client()
    engine = create_engine(agentless_database, poolclass=NullPool)
    try:
        with engine.begin() as conn:  # the control row a started consumer has; its process plays no part here
            consumer_id = consumers.create(conn, lab_name, "c1", Lab(lab_name).group_id("payments"), "no-agent")
        assert client.get("/api/v1/fault-proxy").get_json()["running"] is False
        before = control_rows(engine, lab_name)
        response = client.post(f"/controls/consumers/{consumer_id}/commits-blocked", data={"blocked": "true"})
        assert response.status_code == 503
        assert "no fault proxy is running" in response.get_data(as_text=True)
        assert client.get("/api/v1/fault-proxy").get_json()["commits_blocked_of"] == {}
        # Nothing changed: no fault proxy row (no block recorded), no command, the consumer's row as
        # it was, no fault on the timeline.
        assert control_rows(engine, lab_name) == before
        assert before["fault_proxies"] == before["fault_proxy_labs"] == before["commands"] == []
        with engine.connect() as conn:
            assert conn.execute(text(f'SELECT count(*) FROM "{Lab(lab_name).schema}".timeline '
                                     "WHERE kind = 'fault'")).scalar_one() == 0
    finally:
        engine.dispose()


def test_unknown_consumer_is_a_404_notice(client, lab):
    response = client.post("/controls/consumers/999999/kill", data={})
    assert response.status_code == 404
    assert "no consumer 999999" in response.get_data(as_text=True)


def test_bad_arm_value_is_refused(client, lab):
    consumer = lab.start_consumer(strategy="none")
    response = client.post(f"/controls/consumers/{consumer['consumer_id']}/arm", data={"fault": "crash|once|nowhere"})
    assert response.status_code == 422 and "point" in response.get_data(as_text=True)
    assert lab.consumer(consumer["consumer_id"])["armed_point"] is None


def test_strategy_switch_and_unknown_group(client, lab):
    response = client.post("/controls/groups/strategy", data={"group": "payments", "strategy": "eventid-atomic"})
    assert response.status_code == 200
    assert "now uses eventid-atomic" in response.get_data(as_text=True)
    assert lab.state()["groups"][0]["strategy"] == "eventid-atomic"

    response = client.post("/controls/groups/strategy", data={"group": "nope", "strategy": "none"})
    assert response.status_code == 404
    assert "no group" in response.get_data(as_text=True)
    response = client.post("/controls/groups/strategy", data={"group": "payments", "strategy": "magic"})
    assert response.status_code == 422 and 'id="strategy-strategy-error"' in response.get_data(as_text=True)
    assert lab.state()["groups"][0]["strategy"] == "eventid-atomic"


def test_offset_reset_form_validates_before_acting(app, client, lab):
    # Committed offsets to keep: three credits applied and committed, then the consumer stopped.
    records = [lab.credit("acc-1", 100) for _ in range(3)]
    consumer_id = lab.start_consumer(strategy="none")["consumer_id"]
    lab.wait_caught_up()
    lab.post(f"/consumers/{consumer_id}/stop")
    lab.wait_state(consumer_id, "stopped")
    before = lab.state()
    committed = {p["partition"]: p["committed"] for p in before["partitions"]}
    assert sum(o or 0 for c in committed.values() if c for o in c.values()) == len(records), committed
    commands_before = lab_commands(app, lab)
    for form, field in (({"group": "payments", "mode": "back", "back": "0"}, "back"),
                        ({"group": "payments", "mode": "offset", "offsets": "0:x"}, "offsets"),
                        ({"group": "payments", "mode": "timestamp", "timestamp": "yesterday"}, "timestamp")):
        response = client.post("/controls/groups/reset-offsets", data=form)
        assert response.status_code == 422, form
        assert f'id="offsets-{field}-error"' in response.get_data(as_text=True)
    # Refused before acting: no command reached the agent, the group's committed offsets and its
    # consumers are as they were.
    assert lab_commands(app, lab) == commands_before
    after = lab.state()
    assert {p["partition"]: p["committed"] for p in after["partitions"]} == committed
    assert [(c["id"], c["state"], c["positions"]) for c in after["consumers"]] == \
        [(c["id"], c["state"], c["positions"]) for c in before["consumers"]]


def test_a_lane_gets_its_own_group_accounts_and_consumer(client, lab):
    response = client.post("/controls/lanes", data={"lane": "atomic", "strategy": "eventid-atomic"})
    assert response.status_code == 200, response.get_data(as_text=True)
    groups = {g["group_id"]: g for g in lab.state()["groups"]}
    assert groups[f"{lab.lab.name}.atomic"]["effects_schema"] == lab.lab.lane_schema("atomic")
    html = client.get("/panels/lanes").get_data(as_text=True)
    assert 'data-lane="atomic"' in html
    response = client.post("/controls/lanes", data={"lane": "Bad Name", "strategy": "none"})
    assert response.status_code == 422 and 'id="lane-lane-error"' in response.get_data(as_text=True)


def test_the_answer_to_a_form_is_never_an_older_load_of_its_panel(app_factory, lab_name, lab):
    """With every load counting as slow (LIVE_STALE_AFTER_SECONDS), a poll may get a panel's last
    load, marked; the answer to the form just sent, and a panel without the note, never."""
    client = app_factory(LAB_NAME=lab_name, LIVE_STALE_AFTER_SECONDS=1e-9).test_client()
    listed = '<option value="fresh"'  # the group forms list the new lane's group by its short name
    assert listed not in client.get("/panels/group_controls").get_data(as_text=True)
    assert 'data-lane="fresh"' not in client.get("/panels/lanes").get_data(as_text=True)
    response = client.post("/controls/lanes", data={"lane": "fresh", "strategy": "eventid-atomic"})
    assert response.status_code == 200
    assert listed in response.get_data(as_text=True), "the form's answer lists the group it created"
    # group_controls has no room for the note: always loaded in the request. Lanes has: marked.
    assert listed in client.get("/panels/group_controls").get_data(as_text=True)
    lanes = client.get("/panels/lanes").get_data(as_text=True)
    assert "data-stale" in lanes and 'data-lane="fresh"' not in lanes


def test_ttl_settings_and_cleanup(client, lab):
    response = client.post("/controls/ttl", data={"ttl_seconds": "abc", "ttl_schedule_seconds": ""})
    assert response.status_code == 422 and 'id="ttl-ttl_seconds-error"' in response.get_data(as_text=True)
    response = client.post("/controls/ttl", data={"ttl_seconds": "60", "ttl_schedule_seconds": ""})
    assert response.status_code == 200 and "TTL 1 min, cleanup on demand" in response.get_data(as_text=True)
    response = client.post("/controls/ttl/cleanup", data={})
    assert response.status_code == 200 and "Cleanup deleted 0 key(s)" in response.get_data(as_text=True)
    assert "TTL 1 min" in client.get("/panels/dedup").get_data(as_text=True)


def test_reset_needs_the_lab_name_typed(client, lab):
    lab.credit("acc-1", 100)
    response = client.post("/controls/lab/reset", data={"confirm": "yes", "partitions": "3"})
    assert response.status_code == 422 and 'id="reset-confirm-error"' in response.get_data(as_text=True)
    assert journal_count(lab) == 1
    response = client.post("/controls/lab/reset", data={"confirm": lab.lab.name, "partitions": "3"})
    assert response.status_code == 200
    assert f"Lab {lab.lab.name} reset: 3 partitions" in response.get_data(as_text=True)
    assert journal_count(lab) == 0


def test_csrf_is_enforced_on_forms(app_factory, lab, lab_name):
    protected = app_factory(LAB_NAME=lab_name, WTF_CSRF_ENABLED=True)
    client = protected.test_client()
    response = client.post("/controls/publish", data={"account_id": "acc-1", "amount": "1"})
    assert response.status_code == 400
    assert "CSRF" in response.get_data(as_text=True)
    # With the token the page carries, the same form goes through.
    page = client.get("/").get_data(as_text=True)
    token = re.search(r'name="csrf-token" content="([^"]+)"', page).group(1)
    response = client.post("/controls/publish", data={"account_id": "acc-1", "amount": "1"},
                           headers={"X-CSRFToken": token})
    assert response.status_code == 200
    assert journal_count(lab) == 1


def test_lab_token_guards_the_controls(app_factory, lab, lab_name):
    guarded = app_factory(LAB_NAME=lab_name, LAB_TOKEN="s3cret-token-of-the-lab")
    client = guarded.test_client()
    assert 'Sign in</a> to use the controls' in client.get("/").get_data(as_text=True)
    response = client.post("/controls/publish", data={"account_id": "acc-1", "amount": "1"})
    assert response.status_code == 302 and "/sign-in" in response.headers["Location"]
    assert client.post("/sign-in", data={"token": "wrong"}).status_code == 401
    assert client.post("/sign-in", data={"token": "s3cret-token-of-the-lab", "next": "/"}).status_code == 302
    response = client.post("/controls/publish", data={"account_id": "acc-1", "amount": "1"})
    assert response.status_code == 200
    assert journal_count(lab) == 1


@pytest.fixture
def agentless_database(services, lab_name):
    """A second database on the same PostgreSQL, with a lab in it and no lab agent serving it."""
    name = f"noagent_{lab_name}"
    admin = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool, isolation_level="AUTOCOMMIT")
    url = make_url(sqlalchemy_url(services.database_url)).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url, poolclass=NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        with engine.begin() as conn:
            ensure_control_schema(conn)
            create_database_state(conn, Lab(lab_name), 3)
        yield url
    finally:
        engine.dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_no_agent_shows_a_banner_and_changes_nothing(agentless_database, app_factory, lab_name):
    app = app_factory(LAB_NAME=lab_name, DATABASE_URL=agentless_database)
    client = app.test_client()
    engine = create_engine(agentless_database, poolclass=NullPool)
    try:
        before_rows, before_state = control_rows(engine, lab_name), client.get("/api/v1/state").get_json()
        response = client.post("/controls/publish", data={"account_id": "acc-1", "amount": "1"})
        assert response.status_code == 503
        assert "No lab agent is running" in response.get_data(as_text=True)
        response = client.post("/controls/consumers", data={"group": "payments"})
        assert response.status_code == 503
        assert "no lab agent" in client.get("/panels/status").get_data(as_text=True)
        # Nothing changed: no command left queued for an agent that is not there, no consumer row,
        # nothing published, the accounts and the group's offsets as they were.
        assert control_rows(engine, lab_name) == before_rows
        assert before_rows["commands"] == [] and before_rows["consumers"] == []
        after_state = client.get("/api/v1/state").get_json()
        for key in ("consumers", "partitions", "accounts", "groups"):
            assert after_state[key] == before_state[key], key
        assert all(not p["log_end"] for p in after_state["partitions"]), after_state["partitions"]
        with engine.connect() as conn:
            assert conn.execute(text(f'SELECT count(*) FROM "{Lab(lab_name).schema}".published_events')).scalar_one() == 0
    finally:
        engine.dispose()
