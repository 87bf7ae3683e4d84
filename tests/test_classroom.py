"""Classroom mode: a lab per attendee (join, isolation), the instructor's board, per-lab limits,
lab housekeeping (list, prune), and three attendees running an exercise at the same time.

Real parts only: the web app over its test client, the session's lab agent, PostgreSQL and the
broker; attendees are separate browser sessions (test clients with their own cookies).
"""
from __future__ import annotations

import csv
import io
import json
import os
import re
import threading

import pytest
from sqlalchemy import text

import support
from webapp import ops
from webapp.cli.housekeeping import LabInfo, parse_duration, prunable
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.kafka.admin import admin_client
from webapp.store import classroom, command_channel
from webapp.web.db import db

TOKEN = "instructor-token"
EXERCISE = "01_naive_double_credit"


@pytest.fixture
def class_app(app_factory, agent, lab_name, class_code):
    """The web app in classroom mode: a class code, a lab token for the instructor."""
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=TOKEN)
    yield app
    # Every lab an attendee of this class opened is dropped again (topics, groups, schemas).
    support.drop_class_labs(app, class_code)


def join(app, name: str, code: str, rejoin: str | None = None):
    """A new browser session that joins the class as ``name`` (with a rejoin code: reopens their
    lab); (client, its lab)."""
    client = app.test_client()
    response = client.post("/join", data={"name": name, "code": code, **({"rejoin": rejoin} if rejoin else {})})
    assert response.status_code == 200, response.get_data(as_text=True)
    client.rejoin_code = shown_rejoin_code(response.get_data(as_text=True))
    with client.session_transaction() as session:
        return client, session["attendee_lab"]


def shown_rejoin_code(page: str) -> str:
    found = re.search(r'data-rejoin-code="([A-Z0-9-]+)"', page)
    assert found, page
    return found.group(1)


def rejoin_code(client) -> str:
    """The rejoin code the attendee was shown once, when this browser joined."""
    return client.rejoin_code


def instructor(app):
    client = app.test_client()
    response = client.post("/sign-in", data={"token": TOKEN, "next": "/class"})
    assert response.status_code == 302
    return client


def lab_exists(app, lab: str) -> bool:
    with app.app_context(), db.engine.connect() as conn:
        return lab in classroom.lab_names(conn)


# --- join ----------------------------------------------------------------------------------------

def test_join_opens_an_own_lab_binds_the_session_and_reopens_it_with_the_rejoin_code(class_app, class_code):
    visitor = class_app.test_client()
    assert visitor.get("/").status_code == 302 and "/join" in visitor.get("/").location
    assert visitor.get("/api/v1/state").status_code == 403

    page = visitor.get("/join").get_data(as_text=True)
    assert 'name="name"' in page and 'name="code"' in page
    wrong = visitor.post("/join", data={"name": "Ana Souza", "code": "not-the-code"})
    assert wrong.status_code == 403 and "class&#39;s code" in wrong.get_data(as_text=True)
    assert visitor.post("/join", data={"name": "   ", "code": class_code}).status_code == 400

    ana, lab = join(class_app, "Ana Souza", class_code)
    assert re.fullmatch(r"ana_souza_[0-9a-f]{4}", lab)
    assert lab_exists(class_app, lab)
    dashboard = ana.get("/")
    assert dashboard.status_code == 200
    assert f"<strong>{lab}</strong>" in dashboard.get_data(as_text=True)
    state = ana.get("/api/v1/state").get_json()
    assert len(state["accounts"]) == 5 and state["verdict"]["status"] == "no-events"
    # Her session drives her lab: a credit lands there and nowhere else.
    assert ana.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 500}).status_code == 201
    assert ana.get("/api/v1/state").get_json()["verdict"]["records"] == 1

    # A name is not a secret: the same name (any case, any spacing) on another browser is refused,
    # with how to get back in; a wrong rejoin code too; hers reopens her lab.
    code = rejoin_code(ana)
    assert re.fullmatch(r"[2-9A-HJKMNP-Z]{4}-[2-9A-HJKMNP-Z]{4}", code), code
    # Shown that once, and kept nowhere after: not on her pages, not in her browser's cookie.
    assert "data-rejoin-code" not in dashboard.get_data(as_text=True)
    assert "data-rejoin-code" not in ana.get("/join").get_data(as_text=True)
    with ana.session_transaction() as session:
        assert code not in json.dumps(dict(session)), dict(session)
    intruder = class_app.test_client()
    taken = intruder.post("/join", data={"name": "  ana   SOUZA ", "code": class_code})
    assert taken.status_code == 409
    said = taken.get_data(as_text=True)
    assert "Ana Souza has already joined this class" in said and "rejoin code" in said and "hand your lab over" in said
    wrong = intruder.post("/join", data={"name": "ANA SOUZA", "code": class_code, "rejoin": "2345-6789"})
    assert wrong.status_code == 403 and "not Ana Souza&#39;s rejoin code" in wrong.get_data(as_text=True)
    assert intruder.get("/api/v1/state").status_code == 403, "a refused join bound the browser to a lab"
    again, same_lab = join(class_app, "ana souza", class_code, rejoin=code.lower().replace("-", " "))
    assert same_lab == lab
    assert again.get("/api/v1/state").get_json()["verdict"]["records"] == 1
    # Her first browser rejoins without it (it is bound to her lab already); the table keeps a hash only.
    assert ana.post("/join", data={"name": "Ana Souza", "code": class_code}).status_code == 303
    with class_app.app_context(), db.engine.connect() as conn:
        stored = conn.execute(text("SELECT rejoin_hash FROM lab_control.attendees WHERE lab = :lab"),
                              {"lab": lab}).scalar()
    assert stored.startswith("pbkdf2_sha256$") and code.replace("-", "") not in stored


def test_leaving_the_class_unbinds_the_browser_keeps_the_lab_and_the_rejoin_code_reopens_it(class_app, class_code):
    leah, lab = join(class_app, "Leah Stone", class_code)
    code = rejoin_code(leah)
    assert leah.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 500}).status_code == 201
    left = leah.post("/join/leave")
    assert left.status_code == 303 and left.location.endswith("/join"), left.location
    # This browser reaches no lab now: the pages send it to the join form, the API refuses.
    assert leah.get("/").status_code == 302 and "/join" in leah.get("/").location
    assert leah.get("/api/v1/state").status_code == 403
    assert leah.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 1}).status_code in (401, 403)
    # The lab stays, and the name is still hers: without the rejoin code it is refused, with it reopened.
    assert lab_exists(class_app, lab)
    assert leah.post("/join", data={"name": "Leah Stone", "code": class_code}).status_code == 409
    back = leah.post("/join", data={"name": "Leah Stone", "code": class_code, "rejoin": code})
    assert back.status_code == 200 and f'data-rejoin-code="{code}"' in back.get_data(as_text=True)
    with leah.session_transaction() as session:
        assert session["attendee_lab"] == lab
    assert leah.get("/api/v1/state").get_json()["verdict"]["records"] == 1


def test_a_name_is_one_attendee_in_any_case_and_a_rejoin_code_is_kept_as_a_salted_hash():
    assert classroom.name_key("  Ana   SOUZA ") == classroom.name_key("ana souza") == "ana souza"
    assert classroom.name_key("Straße") == classroom.name_key("STRASSE")
    assert len(classroom.name_key("ß" * classroom.NAME_LENGTH)) == classroom.KEY_LENGTH   # fits the column
    code = classroom.new_rejoin_code()
    first, second = classroom.hash_rejoin_code(code), classroom.hash_rejoin_code(code)
    assert first != second, "a salt per hash"
    assert code.replace("-", "") not in first
    assert classroom.rejoin_code_matches(first, code.lower().replace("-", " "))   # case, spaces, dashes forgiven
    assert not classroom.rejoin_code_matches(first, "2345-6789")
    assert not classroom.rejoin_code_matches(None, code) and not classroom.rejoin_code_matches("junk", code)
    assert not classroom.rejoin_code_matches(first, "")


def test_join_refuses_a_new_lab_when_the_server_holds_its_most(app_factory, agent, lab_name, class_code):
    with app_factory().app_context(), db.engine.connect() as conn:
        existing = len(classroom.lab_names(conn))
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=TOKEN, LAB_MAX_LABS=existing + 1)
    ana, lab = join(app, "Ana", class_code)
    try:
        response = app.test_client().post("/join", data={"name": "Bruno", "code": class_code})
        assert response.status_code == 409
        assert "LAB_MAX_LABS" in response.get_data(as_text=True) and "lab prune" in response.get_data(as_text=True)
        # Reopening a lab creates none: Ana gets hers back.
        assert join(app, "ana", class_code, rejoin=rejoin_code(ana))[1] == lab
        # A scenario run in a fresh lab of its own is one more lab too: refused, in the browser and the CLI.
        instructor_client = instructor(app)
        started = instructor_client.post(f"/scenarios/{EXERCISE}/runs")
        assert started.status_code == 409 and "LAB_MAX_LABS" in started.get_data(as_text=True)
        headless = app.test_cli_runner().invoke(args=["scenario", "run", EXERCISE])
        assert headless.exit_code != 0 and "LAB_MAX_LABS" in headless.output, headless.output
        with app.app_context(), db.engine.connect() as conn:
            assert len(classroom.lab_names(conn)) == existing + 1, "a refused run left a lab behind"
    finally:
        with app.app_context():
            command_channel.run(db.engine, lab, "lab.drop", {}, timeout=120)



def test_one_mistyping_attendee_behind_a_nat_locks_out_neither_the_class_nor_the_instructor(
        app_factory, agent, lab_name, class_code):
    """Wrong class codes are counted per address, failures only (a right code from the same address,
    a class behind one NAT, still joins below the limit), apart from wrong tokens."""
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=TOKEN, SIGN_IN_MAX_FAILURES=2,
                      JOIN_MAX_FAILURES=3)
    try:
        mistyper = app.test_client()   # every test client comes from 127.0.0.1: one NAT
        for _ in range(2):
            assert mistyper.post("/join", data={"name": "Eve", "code": "guess"}).status_code == 403
        # A classmate with the right code joins: a right code counts nothing.
        join(app, "Bruno", class_code)
        assert app.test_client().post("/join", data={"name": "Eve", "code": "guess"}).status_code == 403
        # A client that drops its cookie for each guess gains nothing: the address is counted.
        for client in (mistyper, app.test_client()):
            refused = client.post("/join", data={"name": "Eve", "code": class_code})
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) > 0
            assert "Too many wrong codes from your address" in refused.get_data(as_text=True)
        # The instructor, at the same address, signs in: wrong codes never refuse the token.
        assert app.test_client().post("/sign-in", data={"token": TOKEN, "next": "/class"}).status_code == 302
        # Wrong tokens have their own limit: they refuse the token, never the class code.
        for _ in range(2):
            assert app.test_client().post("/sign-in", data={"token": "guess"}).status_code == 401
        board = app.test_client().get("/class", headers={"Authorization": f"Bearer {TOKEN}"})
        assert board.status_code == 429 and int(board.headers["Retry-After"]) > 0
        assert app.test_client().post("/join", data={"name": "Bruno", "code": class_code}).status_code == 429
    finally:
        support.drop_class_labs(app, class_code)

# --- isolation -----------------------------------------------------------------------------------

def test_an_attendee_cannot_drive_another_attendees_lab(class_app, class_code):
    ana, ana_lab = join(class_app, "Ana", class_code)
    bruno, bruno_lab = join(class_app, "Bruno", class_code)
    assert ana_lab != bruno_lab
    # Her own lab's controls are hers, without the instructor's token: the page does not say otherwise.
    assert "This lab is protected" not in ana.get("/").get_data(as_text=True)

    # Naming Bruno's lab in a change: refused (every route of the registry:
    # test_naming_another_attendees_lab_in_a_change_is_refused_whatever_the_route).
    refused = ana.post(f"/api/v1/publish?lab={bruno_lab}", json={"account_id": "acc-1", "amount_cents": 100})
    assert refused.status_code == 403 and "not yours" in refused.get_json()["error"]
    # Bruno's guided run: Ana cannot step it.
    started = bruno.post(f"/scenarios/{EXERCISE}/runs")
    assert started.status_code == 303
    run_id = int(started.location.rstrip("/").split("/")[-1])
    with class_app.app_context(), db.engine.connect() as conn:
        assert conn.execute(text("SELECT lab FROM lab_control.scenario_runs WHERE id = :id"),
                            {"id": run_id}).scalar() == bruno_lab
    # ... nor read it: every page of the run answers 404, as if it did not exist, and the list of
    # runs shows hers only; the instructor sees it.
    for path in ("", "/guide", "/live"):
        assert ana.get(f"/scenarios/runs/{run_id}{path}").status_code == 404, path
    assert ana.post(f"/scenarios/runs/{run_id}/next").status_code == 404
    assert ana.get(f"/scenarios/runs/{run_id + 10**6}").status_code == 404
    assert f"/scenarios/runs/{run_id}" not in ana.get("/scenarios/").get_data(as_text=True)
    assert f"/scenarios/runs/{run_id}" in bruno.get("/scenarios/").get_data(as_text=True)
    assert bruno.get(f"/scenarios/runs/{run_id}").status_code == 200
    # Bruno's consumer is not in Ana's lab: her session cannot reach it by id.
    consumer = bruno.post("/api/v1/consumers", json={}).get_json()
    try:
        assert ana.post(f"/api/v1/consumers/{consumer['consumer_id']}/kill", json={}).status_code == 404
        # Viewing another lab is the instructor's unless the class allows it.
        assert ana.get(f"/api/v1/state?lab={bruno_lab}").status_code == 403
        assert ana.post(f"/labs/{bruno_lab}/view").status_code == 403
        teacher = instructor(class_app)
        viewed = teacher.get(f"/api/v1/state?lab={bruno_lab}", headers={"Authorization": f"Bearer {TOKEN}"})
        assert viewed.status_code == 200 and viewed.get_json()["consumers"][0]["id"] == consumer["consumer_id"]
        # The instructor's read-only view of Bruno's lab: the dashboard shows it, changes are refused.
        assert teacher.post(f"/labs/{bruno_lab}/view").status_code == 303
        page = teacher.get("/").get_data(as_text=True)
        assert f"<strong>{bruno_lab}</strong>" in page and "read-only" in page
        assert teacher.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 100}).status_code == 403
        bruno_progress = run_row(class_app, run_id)["progress"]
        # Nor may the view step Bruno's guided run (the presenter's → key): a 403 page that says
        # why (no 500), and the run has not moved.
        stepped = teacher.post(f"/scenarios/runs/{run_id}/next")
        assert stepped.status_code == 403 and "read-only" in stepped.get_data(as_text=True)
        assert teacher.post("/labs/view/leave").status_code == 303
        # Out of the view, Bruno's lab is still his to drive, not the instructor's.
        stepped = teacher.post(f"/scenarios/runs/{run_id}/next")
        assert stepped.status_code == 403 and "Bruno&#39;s" in stepped.get_data(as_text=True)
        assert run_row(class_app, run_id)["progress"] == bruno_progress, "the instructor stepped an attendee's run"
        assert bruno.get("/api/v1/state").get_json()["verdict"]["records"] == 0
    finally:
        bruno.post(f"/api/v1/consumers/{consumer['consumer_id']}/stop", json={})
    # Without the class's permission nobody unbound drives anything.
    assert class_app.test_client().post("/api/v1/publish", json={}).status_code == 401


# Every change the registry declares (webapp/ops/registry.py: POST under /api/v1), its path
# parameters filled in; the refusal must come before the operation looks at them or its body.
CHANGES = sorted((op for op in ops.OPERATIONS.values() if op.changes_state), key=lambda op: op.name)


def api_path(op) -> str:
    path = op.path.replace("<int:consumer_id>", "1").replace("<group>", "payments")
    assert "<" not in path, f"{op.name}: fill in its path parameter here: {op.path}"
    return f"/api/v1{path}"


def lab_control_rows(app, lab: str) -> dict:
    """What a change to ``lab`` would leave in the control tables: its commands and consumers."""
    with app.app_context(), db.engine.connect() as conn:
        return {"commands": conn.execute(text("SELECT id, verb, status FROM lab_control.commands WHERE lab = :lab "
                                              "ORDER BY id"), {"lab": lab}).all(),
                "consumers": conn.execute(text("SELECT id, state FROM lab_control.consumers WHERE lab = :lab "
                                               "ORDER BY id"), {"lab": lab}).all()}


@pytest.fixture(scope="module")
def two_attendees(module_app_factory, agent):
    """One class for every route the refusal is tried on (each try changes nothing, which is what
    the test checks): (app, Ana's client, Bruno's client, Bruno's lab)."""
    code = f"class-{os.getpid() % 10000}-routes"
    app = module_app_factory(LAB_CLASS_CODE=code, LAB_TOKEN=TOKEN)
    try:
        ana, _ = join(app, "Ana", code)
        bruno, bruno_lab = join(app, "Bruno", code)
        yield app, ana, bruno, bruno_lab
    finally:
        support.drop_class_labs(app, code)


@pytest.mark.parametrize("op", CHANGES, ids=lambda op: op.name)
def test_naming_another_attendees_lab_in_a_change_is_refused_whatever_the_route(two_attendees, op):
    class_app, ana, bruno, bruno_lab = two_attendees
    before_rows, before_state = lab_control_rows(class_app, bruno_lab), bruno.get("/api/v1/state").get_json()
    refused = ana.post(f"{api_path(op)}?lab={bruno_lab}", json={})
    assert refused.status_code == 403, (op.name, refused.status_code, refused.get_data(as_text=True)[:300])
    assert f"lab {bruno_lab} is not yours" in refused.get_json()["error"], (op.name, refused.get_json())
    # Nothing reached Bruno's lab: no command for its agent, its consumers, groups and log as they were.
    assert lab_control_rows(class_app, bruno_lab) == before_rows, op.name
    after_state = bruno.get("/api/v1/state").get_json()
    for key in ("consumers", "groups", "partitions", "accounts"):
        assert movable(after_state, key) == movable(before_state, key), (op.name, key)


def movable(state: dict, key: str) -> list:
    """What a change could move in one part of the state. The agent snapshots a new group's
    committed offsets in the background: "nothing committed" (None) and no row yet are the same."""
    if key != "partitions":
        return state[key]
    return [{**cell, "committed": {g: o for g, o in cell["committed"].items() if o is not None}}
            for cell in state[key]]


def test_attendees_may_view_each_other_when_the_instructor_allows_it(app_factory, agent, lab_name, class_code):
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=TOKEN, LAB_CLASS_VIEW_OTHERS=1)
    try:
        ana, ana_lab = join(app, "Ana", class_code)
        bruno, bruno_lab = join(app, "Bruno", class_code)
        # Something only Bruno's lab has: his credit of 7.00 to acc-2.
        assert bruno.post("/api/v1/publish", json={"account_id": "acc-2", "amount_cents": 700}).status_code == 201
        viewed = ana.get(f"/api/v1/state?lab={bruno_lab}")
        assert viewed.status_code == 200
        body = viewed.get_json()
        assert (body["lab"], body["topic"]) == (bruno_lab, Lab(bruno_lab).topic), (body["lab"], body["topic"])
        assert next(a for a in body["accounts"] if a["id"] == "acc-2")["expected"] == 700
        # ... not Ana's own lab, which has no such credit.
        own = ana.get("/api/v1/state").get_json()
        assert own["lab"] == ana_lab != bruno_lab
        assert next(a for a in own["accounts"] if a["id"] == "acc-2")["expected"] == 0
        # The dashboard's read-only view of Bruno's lab names his lab, not hers.
        assert ana.post(f"/labs/{bruno_lab}/view").status_code == 303
        page = ana.get("/").get_data(as_text=True)
        assert f"<strong>{bruno_lab}</strong>" in page and "read-only" in page
        assert f"<strong>{ana_lab}</strong>" not in page
        assert ana.post("/labs/view/leave").status_code == 303
        assert ana.post(f"/api/v1/publish?lab={bruno_lab}", json={"account_id": "acc-1"}).status_code == 403
        # His guided run: she may read it (the class allows it), not step it.
        run_id = int(bruno.post(f"/scenarios/{EXERCISE}/runs").location.rstrip("/").split("/")[-1])
        assert ana.get(f"/scenarios/runs/{run_id}").status_code == 200
        assert f"/scenarios/runs/{run_id}" in ana.get("/scenarios/").get_data(as_text=True)
        assert ana.post(f"/scenarios/runs/{run_id}/next").status_code == 403
    finally:
        support.drop_class_labs(app, class_code)


# --- limits --------------------------------------------------------------------------------------

def test_per_lab_limits_refuse_with_a_clear_message(app_factory, agent, lab_name, class_code):
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=TOKEN, LAB_MAX_CONSUMERS=1,
                      LAB_MAX_BURST=5)
    ana, lab = join(app, "Ana", class_code)
    try:
        burst = ana.post("/api/v1/publish", json={"mode": "burst", "count": 6, "account_id": "acc-1",
                                                   "amount_cents": 100})
        assert burst.status_code == 400
        assert burst.get_json()["field"] == "count" and "at most 5 events per burst" in burst.get_json()["error"]
        assert ana.post("/api/v1/publish", json={"mode": "burst", "count": 5, "account_id": "acc-1",
                                                 "amount_cents": 100}).status_code == 201
        first = ana.post("/api/v1/consumers", json={}).get_json()
        second = ana.post("/api/v1/consumers", json={})
        assert second.status_code == 400 and second.get_json()["field"] == "consumers"
        assert "already runs 1 consumer(s)" in second.get_json()["error"]
        # The dashboard's form says it too, not a 500.
        form = ana.post("/controls/consumers", data={"group": "payments"})
        assert form.status_code == 422 and "LAB_MAX_CONSUMERS" in form.get_data(as_text=True)
        ana.post(f"/api/v1/consumers/{first['consumer_id']}/stop", json={})
    finally:
        with app.app_context():
            command_channel.run(db.engine, lab, "lab.drop", {}, timeout=120)


# --- the board -----------------------------------------------------------------------------------

def test_the_board_lists_every_lab_with_its_verdict_starts_an_exercise_for_everyone_and_exports(
        class_app, class_code):
    ana, ana_lab = join(class_app, "Ana", class_code)
    bruno, bruno_lab = join(class_app, "Bruno", class_code)
    ana.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 700})
    # Attendees are not instructors: the board is refused to them.
    assert ana.get("/class").status_code == 403
    assert class_app.test_client().get("/class").status_code == 302

    teacher = instructor(class_app)
    board = teacher.get("/class").get_data(as_text=True)
    cards = dict(re.findall(r'data-lab="([a-z0-9_]+)" data-verdict="([a-z-]+)"', board))
    assert cards == {ana_lab: "pending", bruno_lab: "no-events"}
    assert "Ana" in board and "Bruno" in board and "no exercise yet" in board

    started = teacher.post("/class/start", data={"scenario": EXERCISE})
    assert started.status_code == 303 and "started in 2 lab(s)" in teacher.get(started.location).get_data(as_text=True)
    with class_app.app_context(), db.engine.connect() as conn:
        runs = dict(conn.execute(text("SELECT lab, scenario FROM lab_control.scenario_runs WHERE lab = ANY(:labs)"),
                                 {"labs": [ana_lab, bruno_lab]}).all())
    assert runs == {ana_lab: EXERCISE, bruno_lab: EXERCISE}
    cards_html = teacher.get("/class/cards").get_data(as_text=True)
    assert cards_html.count("A naive consumer credits twice · step 0 of 8") == 2
    # Each attendee's dashboard links to their own run.
    assert "Your exercise: 1 · A naive consumer credits twice" in ana.get("/").get_data(as_text=True)  # its title, not its file
    # ... and the line an open dashboard fetches again every few seconds says it too, with no reload.
    assert "Your exercise: 1 · A naive consumer credits twice" in ana.get("/classroom-banner").get_data(as_text=True)

    # Ana lost her browser: the instructor hands her lab over (a new rejoin code, shown once on the
    # board); attendees may not.
    refused = bruno.post(f"/class/labs/{ana_lab}/hand-over")
    assert refused.status_code == 302 and "/sign-in" in refused.location   # not without the lab token
    old_code = rejoin_code(ana)
    handed = teacher.post(f"/class/labs/{ana_lab}/hand-over")
    assert handed.status_code == 200
    shown = handed.get_data(as_text=True)
    new_code = re.search(rf'data-handed-over="{ana_lab}".*?data-rejoin-code="([A-Z0-9-]+)"', shown, re.S).group(1)
    assert new_code != old_code and new_code not in teacher.get("/class").get_data(as_text=True)
    with teacher.session_transaction() as session:
        assert new_code not in json.dumps(dict(session)), "the new code went into the instructor's cookie"
    # Every browser Ana had is signed out by the hand-over.
    signed_out = ana.get("/")
    assert signed_out.status_code == 302 and "/join" in signed_out.location
    assert class_app.test_client().post("/join", data={"name": "Ana", "code": class_code,
                                                       "rejoin": old_code}).status_code == 403
    ana, reopened = join(class_app, "ana", class_code, rejoin=new_code)
    assert reopened == ana_lab
    assert teacher.post("/class/labs/nobody_0000/hand-over").status_code == 404

    exported = teacher.get("/class/results.csv")
    assert exported.status_code == 200 and exported.mimetype == "text/csv"
    rows = {row["lab"]: row for row in csv.DictReader(io.StringIO(exported.get_data(as_text=True)))}
    assert rows[ana_lab]["name"] == "Ana" and rows[ana_lab]["verdict"] == "pending"
    assert rows[bruno_lab]["exercise"].startswith("1 · ") and rows[bruno_lab]["step"] == "0"

    # Reset one lab: the agent wipes it (Ana's credit gone) and the board says it was asked.
    reset = teacher.post(f"/class/labs/{ana_lab}/reset")
    assert reset.status_code == 303
    def wiped() -> bool:
        state = ana.get("/api/v1/state")  # 503 while the agent recreates the lab's schema
        return state.status_code == 200 and state.get_json()["verdict"]["records"] == 0
    wait_until(wiped, timeout=60, message="the instructor's reset never reached Ana's lab")

    # Reset every lab of the class: Bruno's credit goes too.
    bruno.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 300})
    wait_until(lambda: bruno.get("/api/v1/state").get_json()["verdict"]["records"] == 1, timeout=30,
               message="Bruno's credit never reached the log")
    reset_all = teacher.post("/class/reset")
    assert reset_all.status_code == 303 and "2 lab(s): reset requested" in teacher.get(reset_all.location).get_data(
        as_text=True)

    def all_wiped() -> bool:
        states = [client.get("/api/v1/state") for client in (ana, bruno)]
        return all(s.status_code == 200 and s.get_json()["verdict"]["records"] == 0 for s in states)
    wait_until(all_wiped, timeout=90, message="the reset of every lab never reached both labs")


# --- housekeeping --------------------------------------------------------------------------------

def test_durations_and_what_prune_keeps():
    assert parse_duration("12h") == 43200 and parse_duration("30m") == 1800 and parse_duration("2d") == 172800
    assert parse_duration("45") == 45
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration("soon")
    old = dict(created=None, last_activity=None, consumers=0, size_bytes=0, schemas=1, attendee=None)
    labs = [LabInfo(name="old", idle_seconds=90000, busy=False, **old),
            LabInfo(name="fresh", idle_seconds=10, busy=False, **old),
            LabInfo(name="default", idle_seconds=90000, busy=False, **old),
            LabInfo(name="stepping", idle_seconds=90000, busy=True, **old),
            LabInfo(name="empty", idle_seconds=None, busy=False, **old)]
    # A lab with no recorded activity at all is kept: nothing says how old it is.
    assert [i.name for i in prunable(labs, 43200, keep={"default"})] == ["old"]


def test_list_and_prune_drop_an_idle_labs_topics_groups_and_schemas(class_app, class_code, services):
    ana, lab = join(class_app, "Ana", class_code)
    consumer = ana.post("/api/v1/consumers", json={}).get_json()
    ana.post("/api/v1/publish", json={"account_id": "acc-2", "amount_cents": 300})
    wait_until(lambda: ana.get("/api/v1/state").get_json()["verdict"]["status"] == "exactly-once", timeout=60,
               message="the consumer never applied the credit")
    runner = class_app.test_cli_runner()
    listed = runner.invoke(args=["lab", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    info = next(i for i in json.loads(listed.output) if i["name"] == lab)
    assert info["attendee"] == "Ana" and info["consumers"] == 1 and info["size_bytes"] > 0
    assert info["idle_seconds"] < 60

    # Two days without activity.
    with class_app.app_context(), db.engine.begin() as conn:
        conn.execute(text(f'UPDATE "{Lab(lab).schema}".timeline SET at = at - interval \'2 days\''))
        conn.execute(text("UPDATE lab_control.attendees SET seen_at = seen_at - interval '2 days' WHERE lab = :lab"),
                     {"lab": lab})
    dry = runner.invoke(args=["lab", "prune", "--idle", "1d", "--dry-run"])
    assert dry.exit_code == 0 and json.loads(dry.output)["would_drop"] == [lab]
    assert lab_exists(class_app, lab)

    pruned = runner.invoke(args=["lab", "prune", "--idle", "1d"])
    assert pruned.exit_code == 0, pruned.output
    summary = json.loads(pruned.output[pruned.output.index("{"):])
    assert summary["dropped"] == [lab] and summary["failed"] == {}
    assert summary["groups_deleted"] == [f"{lab}.payments"], summary
    assert not lab_exists(class_app, lab)
    admin = admin_client(services.bootstrap_servers)
    assert not [t for t in admin.list_topics(timeout=10).topics if t.startswith(f"{lab}.")]
    with class_app.app_context(), db.engine.connect() as conn:
        assert classroom.attendee_of_lab(conn, lab) is None
        assert conn.execute(text("SELECT count(*) FROM lab_control.consumers WHERE lab = :lab"),
                            {"lab": lab}).scalar() == 0
    with class_app.app_context(), db.engine.connect() as conn:
        assert conn.execute(text("SELECT state FROM lab_control.consumers WHERE id = :id"),
                            {"id": consumer["consumer_id"]}).first() is None
    assert runner.invoke(args=["lab", "prune", "--idle", "soon"]).exit_code == 2


# --- three attendees at once ---------------------------------------------------------------------

@pytest.mark.long
def test_three_attendees_run_exercise_one_at_the_same_time_each_in_their_own_lab(class_app, class_code):
    attendees = [join(class_app, name, class_code) for name in ("Ana", "Bruno", "Carla")]
    outcomes: dict[str, dict] = {}
    errors: list[str] = []

    def run_exercise(client, lab):
        try:
            started = client.post(f"/scenarios/{EXERCISE}/runs")
            run_id = int(started.location.rstrip("/").split("/")[-1])
            for _ in range(12):
                row = run_row(class_app, run_id)
                if row["status"] in ("passed", "failed", "not-run", "error"):
                    break
                assert client.post(f"/scenarios/runs/{run_id}/next").status_code == 303
                wait_until(lambda: not run_row(class_app, run_id)["busy"], timeout=120, interval=0.2,
                           message=f"step of run {run_id} never finished")
            outcomes[lab] = run_row(class_app, run_id)
        except Exception as error:  # noqa: BLE001 - reported by the main thread
            errors.append(f"{lab}: {error!r}")

    threads = [threading.Thread(target=run_exercise, args=attendee) for attendee in attendees]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert set(outcomes) == {lab for _, lab in attendees}
    for lab, row in outcomes.items():
        assert row["lab"] == lab, row
        assert row["status"] == "passed", (lab, row["progress"].get("reason"))
    for client, lab in attendees:
        verdict = client.get("/api/v1/state").get_json()["verdict"]
        assert verdict["duplicates_applied"] == 1 and verdict["transactions"] == 1, (lab, verdict)


def run_row(app, run_id: int) -> dict:
    with app.app_context(), db.engine.connect() as conn:
        return dict(conn.execute(text("SELECT lab, status, busy, progress FROM lab_control.scenario_runs "
                                      "WHERE id = :id"), {"id": run_id}).mappings().one())


def test_the_board_judges_a_grading_exercise_by_the_attendees_own_consumer_lane(
        proxied_stack, app_factory, lab_name, class_code):
    """Exercise 19 grades the attendee's own consumer: once the run is prepared, the attendee's card
    shows the verdict of that lane (what their code wrote against the log), not the lab's own."""
    import psycopg
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=class_code, LAB_TOKEN=TOKEN,
                      DATABASE_URL=proxied_stack.database_url, KAFKA_BOOTSTRAP_SERVERS=proxied_stack.bootstrap_servers,
                      KAFKA_PRODUCER_BOOTSTRAP_SERVERS=proxied_stack.producer_bootstrap_servers)
    ana, ana_lab = join(app, "Ana", class_code)
    try:
        teacher = instructor(app)
        assert teacher.post("/class/start", data={"scenario": "19_your_consumer_graded"}).status_code == 303
        with app.app_context(), db.engine.connect() as conn:
            run_id = conn.execute(text("SELECT id FROM lab_control.scenario_runs WHERE lab = :lab"),
                                  {"lab": ana_lab}).scalar_one()
        assert ana.post(f"/scenarios/runs/{run_id}/next", headers={"HX-Request": "true"}).status_code == 200
        wait_until(lambda: not run_row(app, run_id)["busy"] and run_row(app, run_id)["progress"]["prepared"],
                   timeout=120, message="the grading exercise's preparation never finished")

        def card() -> str:
            html = teacher.get("/class/cards").get_data(as_text=True)
            return re.search(rf'<article[^>]*data-lab="{ana_lab}".*?</article>', html, re.S).group(0)
        assert 'data-graded-lane="mine"' in card() and 'data-verdict="no-events"' in card(), card()

        # Ana's code applies one credit twice: the card says so, from her lane's rows.
        record = ana.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 700}).get_json()["records"][0]
        with app.app_context(), db.engine.connect() as conn:
            transaction_id = conn.execute(text(f'SELECT transaction_id FROM "{Lab(ana_lab).schema}".published_events '
                                               "WHERE event_id = :e"), {"e": record["event_id"]}).scalar_one()
        url = ana.get("/api/v1/yours").get_json()["database_url"]
        with psycopg.connect(url) as conn:
            for _ in range(2):
                conn.execute("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents) "
                             "VALUES (%s, %s, 'acc-1', 700)", (record["event_id"], transaction_id))
                conn.execute("UPDATE accounts SET balance = balance + 700 WHERE id = 'acc-1'")
        wait_until(lambda: 'data-verdict="anomalies"' in card() and "1 duplicate(s) applied" in card(), timeout=30,
                   message=lambda: f"the board never judged Ana's lane: {card()}")
    finally:
        with app.app_context():
            command_channel.run(db.engine, ana_lab, "lab.drop", {}, timeout=120)


def test_a_labs_idle_time_is_unknown_not_an_error_while_a_reset_holds_its_timeline(app, lab):
    """The board reads every lab's idle time in one transaction; a lab being reset (its schema
    locked, then dropped and created again) answers "unknown" for that look, and the board's other
    reads go on (a 503 of the whole board was seen when a reset dropped the table mid-read)."""
    lab.credit("acc-1", 100)  # a timeline entry
    with app.app_context(), db.engine.connect() as holder, db.engine.connect() as board:
        assert classroom.idle_seconds(board, lab.lab) is not None
        board.commit()  # its read lock on the table is released with its transaction
        holder.execute(text(f'LOCK TABLE "{lab.lab.schema}".timeline IN ACCESS EXCLUSIVE MODE'))
        assert classroom.idle_seconds(board, lab.lab, lock_timeout="100ms") is None
        assert board.execute(text("SELECT 1")).scalar() == 1  # the savepoint kept the transaction usable
        holder.rollback()
        assert classroom.idle_seconds(board, lab.lab) is not None


def test_the_board_answers_when_an_exercise_file_does_not_load(class_app, tmp_path, monkeypatch):
    """A broken exercise file (a typo in a strategy's name, say) is the Exercises page's to show with
    its error; the board still answers, and offers the exercises that load."""
    from webapp.web import board
    broken = tmp_path / "99_broken.yaml"
    broken.write_text("title: Broken\nsetup: {partitions: 1, groups: {g: {strategy: no-such}}}\nsteps: []\n")
    built_in = board.built_in
    monkeypatch.setattr(board, "built_in", lambda: [*built_in(), broken])
    page = instructor(class_app).get("/class")
    assert page.status_code == 200, page.get_data(as_text=True)
    html = page.get_data(as_text=True)
    assert 'value="01_naive_double_credit"' in html and "99_broken" not in html
