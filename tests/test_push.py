"""The live panels' push (web/push.py) without a browser: in classroom mode each
attendee's stream carries its own lab only, whatever it asks for.

Real parts only: the web app's test client (its stream read by a thread, as a browser would), the
session's lab agent, PostgreSQL (the change triggers and LISTEN) and the broker.
"""
from __future__ import annotations

import itertools
import os
import re
import threading

import pytest
from sqlalchemy import text

import support
from webapp.domain.waits import wait_until
from webapp.web.db import db
from webapp.web.push import Partials, hub, stop_hub

_classes = itertools.count(1)


@pytest.fixture
def class_app(app_factory, agent, lab_name):
    """The web app in classroom mode; every attendee's lab dropped at the end."""
    code = f"push-{os.getpid() % 10000}-{next(_classes)}"
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=code, LAB_TOKEN="instructor-token")
    app.class_code = code
    yield app
    support.drop_class_labs(app, code)


def join(app, name: str):
    client = app.test_client()
    response = client.post("/join", data={"name": name, "code": app.class_code})
    assert response.status_code == 200 and "data-rejoin-code" in response.get_data(as_text=True), \
        response.get_data(as_text=True)
    with client.session_transaction() as session:
        return client, session["attendee_lab"]


class Stream:
    """An open ``GET /stream`` read by a thread: the events as they come, ``(name, data)``."""

    def __init__(self, client, path: str = "/stream"):
        self.response = client.get(path, buffered=False)
        assert self.response.status_code == 200
        assert self.response.mimetype == "text/event-stream"
        self.events: list[tuple[str, str]] = []
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for chunk in self.response.response:
            text = chunk.decode() if isinstance(chunk, bytes) else chunk
            for block in text.split("\n\n"):
                lines = block.split("\n")
                name = next((line[7:] for line in lines if line.startswith("event: ")), None)
                if name:
                    self.events.append((name, "\n".join(line[6:] for line in lines if line.startswith("data: "))))

    def names(self) -> list[str]:
        return [name for name, _ in self.events]

    def carries(self, text: str) -> bool:
        return any(text in data for _, data in list(self.events))


def test_in_classroom_mode_a_labs_changes_reach_its_own_stream_never_another_labs(class_app):
    ana, ana_lab = join(class_app, "Ana")
    bruno, bruno_lab = join(class_app, "Bruno")
    ana_stream = Stream(ana)
    # Bruno asks for Ana's lab: the stream is the session's own lab, as every page of his.
    bruno_stream = Stream(bruno, f"/stream?lab={ana_lab}")
    try:
        for stream, lab in ((ana_stream, ana_lab), (bruno_stream, bruno_lab)):
            wait_until(lambda: "accounts" in stream.names(), timeout=20,
                       message=f"the stream of lab {lab} did not send its panels on connect")
            assert stream.events[0] == ("hello", lab)
        pushes = hub(class_app).pushes
        published = ana.post("/api/v1/publish", json={"account_id": "acc-2", "amount_cents": 12_345})
        assert published.status_code == 201, published.get_data(as_text=True)
        wait_until(lambda: ana_stream.carries("123.45"), timeout=10,
                   message="Ana's publish did not reach her stream (no accounts panel with 123.45)")
        assert hub(class_app).pushes > pushes
        # Bruno's stream got its own lab's events only: none shows Ana's credit.
        assert bruno_stream.events and not bruno_stream.carries("123.45"), bruno_stream.events
        assert not bruno_stream.carries(ana_lab)
    finally:
        for lab in (ana_lab, bruno_lab):
            hub(class_app).drop(lab)
        for stream in (ana_stream, bruno_stream):
            stream.thread.join(timeout=15)
    assert hub(class_app).streams == 0


def instructor(app):
    client = app.test_client()
    assert client.post("/sign-in", data={"token": "instructor-token", "next": "/class"}).status_code == 302
    return client


def test_the_board_stream_is_the_instructors_and_is_pushed_a_new_attendees_card(class_app):
    ana, _ana_lab = join(class_app, "Ana")
    refused = ana.get("/class/stream")
    assert refused.status_code in (302, 403) and refused.mimetype != "text/event-stream"
    board = Stream(instructor(class_app), "/class/stream")
    try:
        wait_until(lambda: board.carries("Ana"), timeout=20, message=lambda: f"no board event with Ana's card: {board.names()}")
        assert board.events[0] == ("hello", "class")
        _bruno, bruno_lab = join(class_app, "Bruno")
        wait_until(lambda: board.carries(f'data-lab="{bruno_lab}"'), timeout=10,
                   message="Bruno joined, and the board's stream never carried his card")
        # The same HTML goes to every board: no viewer's CSRF token in it.
        assert 'name="csrf_token" value=""' in board.events[-1][1]
    finally:
        stop_hub(class_app)
        board.thread.join(timeout=15)


def test_a_guided_runs_stream_carries_its_steps_and_live_panel_to_its_lab_only(class_app):
    ana, ana_lab = join(class_app, "Ana")
    bruno, _bruno_lab = join(class_app, "Bruno")
    started = ana.post("/scenarios/01_naive_double_credit/runs")
    assert started.status_code == 303, started.get_data(as_text=True)
    run_path = started.location.split("://", 1)[-1].split("/", 1)[-1]
    # Another attendee's run is not theirs to read (LAB_CLASS_VIEW_OTHERS is off), pushed or not.
    assert bruno.get(f"/{run_path}/stream").status_code in (403, 404)
    stream = Stream(ana, f"/{run_path}/stream")
    try:
        wait_until(lambda: {"run-guide", "run-live"} <= set(stream.names()), timeout=20,
                   message=lambda: f"the run's stream did not send its panels: {stream.names()}")
        assert stream.events[0] == ("hello", run_path.rsplit("/", 1)[-1]) and stream.carries("Prepare a fresh lab")
        with class_app.app_context(), db.engine.begin() as conn:  # the run's row changes: pushed
            conn.execute(text("UPDATE lab_control.scenario_runs SET busy = true WHERE lab = :lab"), {"lab": ana_lab})
        wait_until(lambda: stream.carries("A lab agent is running this step"), timeout=10,
                   message="the run's row changed, and its stream never carried the new steps panel")
    finally:
        with class_app.app_context(), db.engine.begin() as conn:
            conn.execute(text("UPDATE lab_control.scenario_runs SET busy = false WHERE lab = :lab"), {"lab": ana_lab})
        stop_hub(class_app)
        stream.thread.join(timeout=15)


def test_the_presenters_stream_carries_the_labs_panels_and_its_step_line(class_app):
    ana, ana_lab = join(class_app, "Ana")
    stream = Stream(ana, "/present/stream")
    try:
        wait_until(lambda: {"present-guide", "accounts"} <= set(stream.names()), timeout=20,
                   message=lambda: f"the presenter's stream did not send its step line and panels: {stream.names()}")
        assert stream.carries("no exercise running")
        assert ana.post("/scenarios/01_naive_double_credit/runs").status_code == 303
        wait_until(lambda: stream.carries("A naive consumer credits twice"), timeout=10,
                   message="an exercise started, and the presenter's step line was never pushed")
    finally:
        stop_hub(class_app)
        stream.thread.join(timeout=15)


def test_a_cards_lab_part_is_read_again_when_its_lab_changed_and_not_before(class_app, monkeypatch):
    """The board keeps each lab's verdict until the change feed announces the lab (web/board.py):
    with the freshness window closed, the pusher's look reads an unchanged lab no more, a changed one
    again; a request reads neither (it shows the parts as last read)."""
    from webapp.web import board as board_module
    ana, ana_lab = join(class_app, "Ana")
    _bruno, bruno_lab = join(class_app, "Bruno")
    reads: list[str] = []
    real = board_module.read_lab_part

    def counted(lab, lane):  # on the board's reader threads: this test's board is the only one
        reads.append(lab.name)
        return real(lab, lane)
    monkeypatch.setattr(board_module, "read_lab_part", counted)
    monkeypatch.setattr(board_module, "CORE_FRESH_SECONDS", 0.0)
    monkeypatch.setattr(board_module, "BEHIND_SHOWN_SECONDS", 0.0)
    with class_app.test_request_context("/"):
        the_hub = hub(class_app)
        the_hub.keep(Partials("listener-only", None, {}))  # starts the hub's listener; a feed that reads no lab
        the_board = board_module.ClassBoard(class_app.class_code, the_hub)
        wait_until(lambda: the_hub.listening, timeout=10, message="the hub never listened on the change feed")
        the_board.cards(read_changed=True)
        assert sorted(reads) == sorted([ana_lab, bruno_lab])

        def read_again() -> list[str]:
            reads.clear()
            the_board.cards(read_changed=True)
            return list(reads)
        # A new lab is written a while longer (its log reader starts on it): once neither changes,
        # a look reads neither.
        wait_until(lambda: read_again() == [], timeout=20, message=lambda: f"unchanged labs read again: {reads}")
        stamps = {lab: the_hub.stamp(lab) for lab in (ana_lab, bruno_lab)}
        assert ana.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 100}).status_code == 201
        wait_until(lambda: the_hub.stamp(ana_lab) != stamps[ana_lab], timeout=10,
                   message="Ana's publish was never announced")
        reads.clear()
        cards = {card["lab"]: card for card in the_board.cards()}
        assert reads == [] and cards[ana_lab]["verdict"] == "no-events", "a request read a lab part"
        # Shown as it was read, and said so (any lag shows here: BEHIND_SHOWN_SECONDS is 0).
        assert cards[ana_lab]["behind_seconds"] is not None and cards[ana_lab]["changed_since"], cards[ana_lab]
        if the_hub.stamp(bruno_lab) == stamps[bruno_lab]:
            assert cards[bruno_lab]["behind_seconds"] is None, cards[bruno_lab]
        cards = {card["lab"]: card for card in the_board.cards(read_changed=True)}
        assert ana_lab in reads and cards[ana_lab]["verdict"] == "pending", (reads, cards[ana_lab])
        assert all(the_hub.stamp(lab) != stamps[lab] for lab in reads), "a lab was read again unchanged"
        # Starting an exercise gives the card another run, not the lab other data: a request still
        # reads no lab part (thirty attendees starting at once would hold it behind thirty verdicts).
        assert ana.post("/scenarios/01_naive_double_credit/runs").status_code == 303
        reads.clear()
        cards = {card["lab"]: card for card in the_board.cards()}
        assert cards[ana_lab]["exercise"] == "1 · A naive consumer credits twice", cards[ana_lab]
        assert reads == [], "a request read the lab part of a lab whose exercise started"
    stop_hub(class_app)


def test_the_presenters_poll_fallback_when_its_stream_is_refused_shows_the_step_line_and_panels(
        app_factory, agent, lab_name):
    """Past the cap of live streams the presenter's stream answers ``refused`` and the page polls:
    its step line from GET /present/guide (the slot's hx-get, data-poll-ms) and its panels from
    GET /live, and what they answer follows the lab."""
    code = f"push-{os.getpid() % 10000}-{next(_classes)}"
    app = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=code, LAB_TOKEN="instructor-token",
                      LIVE_STREAMS_PER_WORKER=0)
    app.class_code = code
    try:
        ana, _ = join(app, "Ana")
        refused = ana.get("/present/stream")
        assert refused.status_code == 200 and refused.mimetype == "text/event-stream"
        said = refused.get_data(as_text=True)
        assert said.startswith("event: refused\n") and "most live streams (0" in said, said
        page = ana.get("/present").get_data(as_text=True)
        slot = re.search(r'<div class="present-guide-slot"[^>]*>', page).group(0)
        assert 'hx-get="/present/guide"' in slot and 'data-poll-ms="1000"' in slot, slot
        assert 'data-live-url="/live"' in page
        assert "no exercise running" in ana.get("/present/guide").get_data(as_text=True)
        fingerprints = ana.get("/live").get_json()["fingerprints"]
        assert {"accounts", "verdict"} <= set(fingerprints), fingerprints
        assert ana.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 500}).status_code == 201
        wait_until(lambda: ana.get("/live").get_json()["fingerprints"]["accounts"] != fingerprints["accounts"]
                   or None, timeout=30, message="the polled accounts panel never changed after a credit")
        assert ana.post("/scenarios/01_naive_double_credit/runs").status_code == 303
        wait_until(lambda: "A naive consumer credits twice" in ana.get("/present/guide").get_data(as_text=True),
                   timeout=10, message="an exercise started, and the polled step line never showed it")
    finally:
        support.drop_class_labs(app, code)
