"""The live panels' push (web/push.py, issue 32) without a browser: in classroom mode each
attendee's stream carries its own lab only, whatever it asks for.

Real parts only: the web app's test client (its stream read by a thread, as a browser would), the
session's lab agent, PostgreSQL (the change triggers and LISTEN) and the broker.
"""
from __future__ import annotations

import itertools
import os
import threading

import pytest

import support

from webapp.domain.waits import wait_until
from webapp.web.push import hub

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
    assert response.status_code == 303, response.get_data(as_text=True)
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
