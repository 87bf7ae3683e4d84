"""An attendee's own code as an adversary: what the lab hands a learner ("Your consumer": a database
URL, Kafka credentials, a browser session) reaches that learner's lane and nothing else.

Each test does what a learner's code or browser could try, against the real PostgreSQL and the real
web app, and asserts it is refused while the learner's own lane keeps working. The Kafka side (the
gateway's SASL and authorization) is tests/test_gateway.py's.
"""
from __future__ import annotations

import csv
import io
import json
import re
import threading

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

import support
from support import CLASS_TOKEN
from webapp.domain.lab import Lab
from webapp.domain.vocabulary import LANE_TABLES
from webapp.domain.waits import wait_until
from webapp.store import outside
from webapp.web.db import db


def lane_url(lab) -> str:
    created = lab.client.post("/api/v1/yours", json={"lane": "mine"})
    assert created.status_code == 201, created.get_json()
    return created.get_json()["database_url"]


# --- PostgreSQL: who may sign in ------------------------------------------------------------------

def test_every_role_proves_its_password_the_superuser_s_too(lab, services):
    url = lane_url(lab)
    assert psycopg.connect(url).close() is None, "the lane's own URL signs in"
    server = make_url(services.database_url)
    role = make_url(url).username
    for user, password in (("postgres", None), ("postgres", "wrong"), (role, "wrong"), (role, None)):
        given = {"password": password} if password is not None else {}
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(host=server.host, port=server.port, dbname="postgres", user=user, connect_timeout=5,
                            **given).close()
        assert "password" in str(refused.value), (user, str(refused.value))


def test_the_lab_connects_as_an_owner_role_that_is_no_superuser(app, lab):
    with app.app_context(), db.engine.connect() as conn:
        user, superuser = conn.execute(text("SELECT current_user, rolsuper FROM pg_roles WHERE rolname = current_user")).one()
    assert (user, superuser) == ("lab_owner", False)
    lane_url(lab)   # it makes a lane's role and grants it the lane, as no superuser


def test_lane_passwords_are_kept_encrypted_and_hashed_never_in_plain_text(app, lab, services):
    info = lab.client.post("/api/v1/yours", json={"lane": "mine"}).get_json()
    database_password = make_url(info["database_url"]).password
    with app.app_context(), db.engine.connect() as conn:
        row = conn.execute(text("SELECT * FROM lab_control.outside_roles WHERE role = :r"),
                           {"r": info["role"]}).mappings().one()
    with psycopg.connect(services.postgres.conninfo) as superuser:   # pg_authid is the superuser's to read
        stored_by_postgres = superuser.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                                               [info["role"]]).fetchone()[0]
    kept = json.dumps({key: str(value) for key, value in row.items()})
    assert database_password not in kept and info.get("sasl_password", "-" * 32) not in kept, kept
    assert stored_by_postgres.startswith("SCRAM-SHA-256$"), "PostgreSQL keeps a SCRAM verifier, not the password"
    # A reset keeps the URL a learner copied valid (the same credentials, decrypted again).
    again = lab.client.get("/api/v1/yours?lane=mine").get_json()
    assert again["database_url"] == info["database_url"]


# --- PostgreSQL: what a lane role may touch -------------------------------------------------------

def test_the_lane_role_writes_its_four_tables_and_cannot_touch_its_grade_or_summaries(app, lab):
    url = lane_url(lab)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 'acc-1'")
        # This INSERT fires the verdict queue's trigger, which writes a table the role may not: it
        # runs as its owner, or the learner's own payment would be refused.
        conn.execute("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents) "
                     "VALUES (gen_random_uuid(), 'tx-adversary', 'acc-1', 1)")
        conn.execute("INSERT INTO processed_events (event_id) VALUES (gen_random_uuid())")
        conn.execute("INSERT INTO processed_transactions (transaction_id) VALUES ('tx-adversary')")
        for table in LANE_TABLES:
            conn.execute(f"SELECT count(*) FROM {table}")
        grade_and_summaries = ("scores", "verdict_totals", "verdict_keys", "verdict_changes", "ledger", "ledger_sums",
                               "deliveries", "log_records", "expected_credits", "timeline", "consumer_groups",
                               "group_offsets", "chart_effects", "chart_truth", "settings")
        for table in grade_and_summaries:
            for statement in (f"SELECT * FROM {table}", f"DELETE FROM {table}"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)
        for forbidden in ("CREATE TABLE mine_own (id int)", "CREATE TEMP TABLE scratch (id int)",
                          "SELECT lo_create(0)", "SELECT lo_creat(-1)", "SELECT lo_from_bytea(0, 'x')",
                          "SET temp_file_limit = -1", "SELECT * FROM lab_control.outside_roles",
                          "CREATE FUNCTION mine() RETURNS int LANGUAGE sql AS 'SELECT 1'"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(forbidden)
        settings = {name: conn.execute(f"SHOW {name}").fetchone()[0]
                    for name in ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
                                 "temp_file_limit")}
    assert settings == {"statement_timeout": "30s", "lock_timeout": "5s", "idle_in_transaction_session_timeout": "1min",
                        "temp_file_limit": "16MB"}, settings


def test_the_lane_role_holds_at_most_its_connection_limit(app, lab):
    url = lane_url(lab)
    most = app.config["LAB_LANE_CONNECTION_LIMIT"]
    held = []
    try:
        for _ in range(most):
            held.append(psycopg.connect(url))
        with pytest.raises(psycopg.OperationalError) as refused:
            held.append(psycopg.connect(url))
        assert "too many connections for role" in str(refused.value)
    finally:
        for conn in held:
            conn.close()


@pytest.mark.parametrize("overrun", ["idle in a transaction", "one long statement"])
def test_a_lane_session_past_its_bounds_is_ended_even_when_it_lifted_them(app, lab, overrun):
    """The role's timeouts are defaults its session may SET away; the agent's round ends such a
    session anyway (here called with short bounds, as the agent calls it with LANE_* ones)."""
    url = lane_url(lab)
    role = make_url(url).username
    conn = psycopg.connect(url)
    sleeper = None
    try:
        conn.execute("SET statement_timeout = 0")
        conn.execute("SET idle_in_transaction_session_timeout = 0")
        if overrun == "one long statement":
            sleeper = threading.Thread(target=lambda: _ignore_termination(conn, "SELECT pg_sleep(60)"))
            sleeper.start()
        else:
            conn.execute("SELECT balance FROM accounts FOR UPDATE")  # a transaction left open, holding locks
        state = "active" if sleeper else "idle in transaction"
        with app.app_context():
            def ended() -> list:
                with db.engine.begin() as admin:
                    return outside.end_overrunning_sessions(admin, statement_seconds=1, idle_seconds=1)
            found = wait_until(ended, timeout=30, message=f"the lane's session ({state}) was never ended")
        assert [(session.role, session.lab) for session in found] == [(role, lab.lab.name)], found
        if sleeper:
            sleeper.join(timeout=10)
            assert not sleeper.is_alive()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")
    finally:
        conn.close()


def _ignore_termination(conn, statement: str) -> None:
    try:
        conn.execute(statement)
    except psycopg.OperationalError:
        pass  # terminated, as the test means it to be


# --- the web: a learner's lock slows their own lab only ---------------------------------------------

@pytest.fixture
def two_attendees(app_factory, agent, lab_name, class_code):
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=CLASS_TOKEN,
                      LAB_WEB_CONNECTIONS_PER_LAB=3)
    try:
        yield app, join(app, "Ana", class_code), join(app, "Bruno", class_code)
    finally:
        support.drop_class_labs(app, class_code)


def same_browser(app, client):
    """Another client with ``client``'s cookie: the same browser session (a copy kept, or a second tab)."""
    copy = app.test_client()
    with client.session_transaction() as original, copy.session_transaction() as copied:
        copied.update(dict(original))
    return copy


def join(app, name: str, code: str):
    client = app.test_client()
    response = client.post("/join", data={"name": name, "code": code})
    assert response.status_code == 200, response.get_data(as_text=True)
    client.rejoin_code = re.search(r'data-rejoin-code="([A-Z0-9-]+)"', response.get_data(as_text=True)).group(1)
    with client.session_transaction() as session:
        client.lab = Lab(session["attendee_lab"])
    return client


def test_a_lock_on_a_learners_lane_fails_their_reads_fast_and_never_starves_another_lab(two_attendees):
    app, ana, bruno = two_attendees
    url = ana.post("/api/v1/yours", json={"lane": "mine"}).get_json()["database_url"]
    with psycopg.connect(url) as locker:
        locker.execute("LOCK TABLE accounts IN ACCESS EXCLUSIVE MODE")   # and stay in the transaction
        answered = ana.get("/api/v1/state")
        assert answered.status_code == 503, answered.get_json()
        assert "holds a lock on this lab's tables" in answered.get_json()["error"]
        # A flood of Ana's reads takes her share of the pool, never Bruno's.
        most_held, done = [0], threading.Event()
        with app.app_context():
            pool = db.engine.pool

        def watch_the_pool() -> None:
            while not done.wait(0.02):
                most_held[0] = max(most_held[0], pool.checkedout())
        answers: list[tuple[int, str]] = []

        def read_anas_lab() -> None:
            response = same_browser(app, ana).get("/api/v1/state")
            answers.append((response.status_code, response.get_json()["error"]))
        watcher = threading.Thread(target=watch_the_pool)
        watcher.start()
        flood = [threading.Thread(target=read_anas_lab) for _ in range(12)]
        for thread in flood:
            thread.start()
        try:
            brunos = bruno.get("/api/v1/state")
        finally:
            for thread in flood:
                thread.join(timeout=60)
            done.set()
            watcher.join()
    assert brunos.status_code == 200 and brunos.get_json()["lab"] == bruno.lab.name, brunos.get_json()
    assert len(answers) == 12 and {status for status, _ in answers} == {503}, answers
    assert all("lock" in error or "LAB_WEB_CONNECTIONS_PER_LAB" in error for _, error in answers), answers
    # Her share is 3 requests and Bruno made one; a state request holds two connections at once (its
    # snapshot and the TTL look): the pool (5 + 10 overflow) always had room for another lab.
    assert most_held[0] <= 2 * (3 + 1), \
        f"the pool held {most_held[0]} connections at once: more than Ana's share (3 requests) and Bruno's one"
    # The lock gone, her lab reads again.
    assert ana.get("/api/v1/state").status_code == 200


# --- the web: sessions, streams, guesses --------------------------------------------------------------

def test_leaving_and_a_hand_over_sign_out_every_earlier_browser_of_the_attendee(two_attendees):
    app, ana, bruno = two_attendees
    copy = same_browser(app, ana)   # a copy of Ana's cookie, kept from before she leaves
    assert copy.get("/api/v1/state").status_code == 200
    assert ana.post("/join/leave").status_code == 303
    # The browser that left holds no lab any more; the copy of its cookie is signed out.
    assert ana.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 100}).status_code == 401
    refused = copy.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 100})
    assert refused.status_code == 403 and "signed out" in refused.get_json()["error"], refused.get_json()
    assert copy.get("/").status_code == 302
    # She joins again with her rejoin code; the instructor hands her lab over: that browser is out too.
    back = app.test_client()
    again = back.post("/join", data={"name": "Ana", "code": app.config["LAB_CLASS_CODE"], "rejoin": ana.rejoin_code})
    assert again.status_code == 200
    assert back.get("/api/v1/state").status_code == 200
    teacher = app.test_client()
    assert teacher.post("/sign-in", data={"token": CLASS_TOKEN, "next": "/class"}).status_code == 302
    with back.session_transaction() as session:
        lab = session["attendee_lab"]
    assert teacher.post(f"/class/labs/{lab}/hand-over").status_code == 200
    signed_out = back.get("/")
    assert signed_out.status_code == 302 and "/join" in signed_out.location


def test_an_open_stream_ends_when_its_session_is_revoked_and_streams_are_capped_per_browser(two_attendees):
    app, ana, bruno = two_attendees
    stream = ana.get("/stream", buffered=False)
    try:
        assert stream.mimetype == "text/event-stream"
        events = (chunk.decode() if isinstance(chunk, bytes) else chunk for chunk in stream.response)
        assert "event: hello" in next(events)
        assert same_browser(app, ana).post("/join/leave").status_code == 303
        # Something happens in her lab: the stream's next event is a refusal, and then it ends.
        with app.app_context():
            outside_conn = db.engine.connect()
            try:
                outside_conn.execute(text(f'INSERT INTO "{ana.lab.schema}".timeline (kind, summary) '
                                          "VALUES ('note', 'a change to push')"))
                outside_conn.commit()
            finally:
                outside_conn.close()
        rest = "".join(events)
        assert "event: refused" in rest and "signed out" in rest, rest[-500:]
    finally:
        stream.close()
    # Bruno's browser holds at most LIVE_STREAMS_PER_BROWSER streams on this process.
    most = app.config["LIVE_STREAMS_PER_BROWSER"]
    opened = [bruno.get("/stream", buffered=False) for _ in range(most + 1)]
    try:
        firsts = [next(iter(response.response)) for response in opened]
        firsts = [first.decode() if isinstance(first, bytes) else first for first in firsts]
        assert all("event: hello" in first for first in firsts[:most]), firsts
        assert "event: refused" in firsts[most] and "LIVE_STREAMS_PER_BROWSER" in firsts[most], firsts[most]
    finally:
        for response in opened:
            response.close()


def test_an_anonymous_browser_in_a_class_gets_no_lab_page_and_no_stream(two_attendees):
    app, _, _ = two_attendees
    anonymous = app.test_client()
    for path in ("/", "/stream", "/present", "/present/stream", "/present/guide", "/yours", "/scenarios/"):
        answer = anonymous.get(path)
        assert answer.status_code == 302 and "/join" in answer.location, (path, answer.status_code)
        assert answer.mimetype != "text/event-stream", path
    assert anonymous.get("/class/stream").status_code == 302   # the instructor's: sign in first
    assert anonymous.get("/api/v1/state").status_code == 403


def test_the_results_export_neutralises_cells_a_spreadsheet_would_run(app_factory, agent, lab_name, class_code):
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=CLASS_TOKEN)
    try:
        join(app, "=HYPERLINK(\"http://x\")", class_code)
        teacher = app.test_client()
        assert teacher.post("/sign-in", data={"token": CLASS_TOKEN, "next": "/class"}).status_code == 302
        exported = teacher.get("/class/results.csv").get_data(as_text=True)
        names = [row["name"] for row in csv.DictReader(io.StringIO(exported))]
        assert names == ["'=HYPERLINK(\"http://x\")"], names
    finally:
        support.drop_class_labs(app, class_code)


def test_lanes_per_lab_are_capped_in_a_class(app_factory, agent, lab_name, class_code):
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=CLASS_TOKEN, LAB_MAX_LANES=1)
    try:
        ana = join(app, "Ana", class_code)
        assert ana.post("/api/v1/yours", json={"lane": "mine"}).status_code == 201
        assert ana.post("/api/v1/yours", json={"lane": "mine"}).status_code == 201, "the same lane again is no new lane"
        refused = ana.post("/api/v1/yours", json={"lane": "second"})
        assert refused.status_code == 400 and "LAB_MAX_LANES=1" in refused.get_json()["error"], refused.get_json()
    finally:
        support.drop_class_labs(app, class_code)
