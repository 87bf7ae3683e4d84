"""Helpers the tests share: where the project is, the session's services, a lab driver over the
JSON API, and the process helpers. Fixtures live in conftest.py; tests import helpers from here."""
from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from sqlalchemy import text
from werkzeug.serving import make_server

from webapp.dev.embedded import EmbeddedBroker

# The stack's bring-up and its helpers live in webapp/dev/stack.py (the launcher and the benches
# share them); tests import them from here. Services: what the `services` fixture yields.
from webapp.dev.stack import Stack, service_env, start_logged, wait_for_agent  # noqa: F401
from webapp.domain.lab import Lab
from webapp.domain.waits import free_port, wait_until
from webapp.settings import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent


# database_url, bootstrap_servers, data_dir, postgres, broker (and the agent, when it started one).
Services = Stack


# How often a test asks the lab again while it waits: a whole state is about 30 ms of CPU between
# the test and PostgreSQL, and four workers wait at once on two cores.
WAIT_INTERVAL = 0.25
# Every process of a test stack and every test app share it: lane passwords are kept encrypted under it.
TEST_SECRET_KEY = "test"
# The instructor's LAB_TOKEN of the test servers in classroom mode (which refuses to run without one).
CLASS_TOKEN = "instructor-token-for-tests"


class LabDriver:
    """Drives one lab through the JSON API, as a script or a workshop would."""

    def __init__(self, client, lab: Lab):
        self.client = client
        self.lab = lab

    def post(self, path: str, body: dict | None = None, expect: int | tuple = (200, 201)) -> dict:
        response = self.client.post(f"/api/v1{path}", json=body or {})
        expected = (expect,) if isinstance(expect, int) else expect
        assert response.status_code in expected, f"POST {path} -> {response.status_code}: {response.get_json()}"
        return response.get_json()

    def state(self) -> dict:
        response = self.client.get("/api/v1/state")
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_json()

    # --- conveniences ---
    def publish(self, **body) -> dict:
        return self.post("/publish", body)

    def credit(self, account_id: str = "acc-1", amount_cents: int = 1000, **extra) -> dict:
        return self.publish(account_id=account_id, amount_cents=amount_cents, **extra)["records"][0]

    def start_consumer(self, **body) -> dict:
        return self.post("/consumers", body)

    def consumer(self, consumer_id: int) -> dict:
        return next(c for c in self.consumers() if c["id"] == consumer_id)

    def account(self, account_id: str) -> dict:
        return next(a for a in self.state()["accounts"] if a["id"] == account_id)

    def verdict(self) -> dict:
        return self.state()["verdict"]

    def consumers(self) -> list[dict]:
        """The lab's consumers alone (GET /consumers): a few rows, where the state is every panel."""
        response = self.client.get("/api/v1/consumers")
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.get_json()["consumers"]

    def wait(self, condition: Callable[[dict], Any], message: str, timeout: float = 30.0) -> Any:
        """Wait until ``condition(state)`` is truthy; fail with the message and the last state."""
        last: dict = {}

        def check():
            last.clear()
            last.update(self.state())
            return condition(last)
        return wait_until(check, timeout=timeout, interval=WAIT_INTERVAL,
                          message=lambda: f"{message}; last state: consumers={last.get('consumers')} "
                                          f"verdict={last.get('verdict')} accounts={last.get('accounts')}")

    def wait_consumer(self, consumer_id: int, predicate: Callable[[dict], Any], message: str,
                      timeout: float = 30.0) -> dict:
        """Wait until consumer ``consumer_id``'s reported row satisfies ``predicate``; return the row."""
        last: list[dict] = []

        def check():
            last[:] = self.consumers()
            return next((c for c in last if c["id"] == consumer_id and predicate(c)), None)
        return wait_until(check, timeout=timeout, interval=WAIT_INTERVAL,
                          message=lambda: f"consumer {consumer_id}: {message}; last consumers: {last}")

    def wait_assigned(self, consumer_id: int, timeout: float = 30.0) -> dict:
        return self.wait_consumer(consumer_id, lambda c: c["state"] == "running" and c["assigned"],
                                  "never assigned a partition", timeout)

    def wait_state(self, consumer_id: int, *states: str, timeout: float = 30.0) -> dict:
        return self.wait_consumer(consumer_id, lambda c: c["state"] in states, f"never reached {states}", timeout)

    def crash_and_restart(self, consumer_id: int, point: str, account_id: str = "acc-1",
                          amount_cents: int = 1000) -> dict:
        """Arm a crash at ``point``, publish one credit, wait until the process died there (SIGKILL:
        no commit, no leave), restart it and wait until it has a partition again; the record."""
        self.post(f"/consumers/{consumer_id}/arm", {"point": point, "action": "crash"})
        record = self.credit(account_id, amount_cents)
        crashed = self.wait_consumer(consumer_id, lambda c: c["state"] == "crashed" and c["exit_code"] is not None,
                                     f"did not crash at {point}")
        assert crashed["step_at"] == point and crashed["exit_code"] == -9, crashed
        self.post(f"/consumers/{consumer_id}/restart")
        self.wait_assigned(consumer_id)
        return record

    def wait_caught_up(self, timeout: float = 30.0) -> dict:
        """Every published record applied, absorbed or dead-lettered, and committed."""
        def caught_up(s):
            return all(p["committed"] and all((c or 0) >= p["log_end"] for c in p["committed"].values())
                       for p in s["partitions"] if p["log_end"]) and s
        return self.wait(caught_up, "the group never caught up with the log end", timeout)


def run_guided(app, exercise: Path, after_prepare: Callable[[], None] | None = None, pause: float = 0.0) -> Any:
    """Run a built-in exercise click by click in guided mode, as a workshop does, and return its
    final RunState. Each click is a `scenario.step` command the real agent carries out
    (webapp/scenarios/guided.py); the run is read back from PostgreSQL until it has its verdict.
    ``after_prepare`` is called once the first click (the lab's preparation) is done: a learner
    starts their own consumer then. ``pause``: seconds between a click's end and the next click,
    a person reading the page (bench/guided_pace.py runs every exercise so)."""
    from webapp.scenarios import load
    return run_guided_from(app, f"/scenarios/{exercise.stem}/runs", len(load(exercise).steps), after_prepare, pause)


def run_guided_from(app, start_url: str, step_count: int, after_prepare: Callable[[], None] | None = None,
                    pause: float = 0.0) -> Any:
    """Run the guided run ``start_url`` starts (an exercise's, or an exploration's replay) click by
    click, as :func:`run_guided` does, and return its final RunState."""
    from webapp.scenarios.runner import RunState
    from webapp.web.db import db

    client = app.test_client()
    started = client.post(start_url)
    assert started.status_code == 303, started.get_data(as_text=True)
    run_page = started.headers["Location"]
    run_id = int(run_page.rstrip("/").rsplit("/", 1)[1])

    def progress() -> tuple[bool, RunState]:
        with app.app_context(), db.engine.connect() as conn:
            busy, saved = conn.execute(text("SELECT busy, progress FROM lab_control.scenario_runs WHERE id = :id"),
                                       {"id": run_id}).one()
        return busy, RunState.from_dict(saved)

    run = progress()[1]
    for click in range(step_count + 3):
        if click and pause:
            time.sleep(pause)  # a learner's reading time between two clicks: what the test is about, not a wait
        assert client.post(run_page + "/next", headers={"HX-Request": "true"}).status_code == 200
        wait_until(lambda: not progress()[0], timeout=120, interval=WAIT_INTERVAL,
                   message=f"{start_url}: a guided step never finished")
        run = progress()[1]
        if after_prepare is not None and run.prepared:
            after_prepare()
            after_prepare = None
        if run.finished:
            break
    return run


def open_lab(app, lab_name: str, client=None) -> LabDriver:
    """A fresh lab (schema, topics, seed accounts, default group), made by the agent, and a driver for it."""
    from webapp.store import command_channel
    from webapp.web.db import db
    with app.app_context():
        command_channel.run(db.engine, lab_name, "lab.ensure", {"partitions": 3}, timeout=60)
    return LabDriver(client or app.test_client(), Lab(lab_name))


def kill_consumers(driver: LabDriver) -> None:
    """SIGKILL, not a graceful stop: the test is over, and a consumer it left waiting (commits
    blocked, a lock, a step) would take the whole stop timeout to give up (15 s each)."""
    for consumer in driver.state()["consumers"]:
        if consumer["state"] in ("starting", "running", "frozen", "stepping"):
            driver.client.post(f"/api/v1/consumers/{consumer['id']}/kill", json={})


def static_files_read_at_once(app):
    """The app, with each static file read whole and closed before the server writes it.

    Werkzeug's development server skips a response's ``close()`` when the browser resets the
    connection while the server drains the request (``run_wsgi``'s ``finally``): the open file is
    then collected later, in whichever test runs, as an unraisable ResourceWarning. A browser that
    navigates away mid-load does exactly that. Streams and pages are not touched."""
    def read_at_once(environ, start_response):
        if not environ.get("PATH_INFO", "").startswith("/static/"):
            return app(environ, start_response)
        body = app(environ, start_response)
        try:
            return [b"".join(body)]
        finally:
            if hasattr(body, "close"):
                body.close()
    return read_at_once


class Servers:
    """Apps served from werkzeug threads over real HTTP; every one shut down by :meth:`close`."""

    def __init__(self):
        self.running = []

    def serve(self, app) -> str:
        port = free_port()
        server = make_server("127.0.0.1", port, static_files_read_at_once(app), threaded=True)
        # A short poll: shutdown() waits for the loop's next look (0.5 s by default, at every test's end).
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        self.running.append((server, thread))
        return f"http://127.0.0.1:{port}"

    def close(self) -> None:
        for server, thread in self.running:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


def served_settings(lab_name: str, **overrides) -> dict:
    """An app as a viewer's browser meets it: CSRF on, the live panels' default caching."""
    return {"LAB_NAME": lab_name, "WTF_CSRF_ENABLED": True, "TESTING": False,
            "LIVE_CACHE_SECONDS": DEFAULTS["LIVE_CACHE_SECONDS"],
            "LIVE_STALE_AFTER_SECONDS": DEFAULTS["LIVE_STALE_AFTER_SECONDS"], **overrides}


def drop_lab(app, lab_name: str) -> None:
    """Drop a lab a test made (topics, groups, schemas): the agent's log reader, summary folder and
    housekeeping walk every lab there is, so a lab left behind costs every later test CPU."""
    from webapp.store import command_channel
    from webapp.web.db import db
    with app.app_context():
        command_channel.run(db.engine, lab_name, "lab.drop", {}, timeout=120)


def drop_class_labs(app, class_code: str) -> None:
    """Drop the lab of every attendee of a class a test made (topics, groups, schemas)."""
    from webapp.store import classroom
    from webapp.web.db import db
    with app.app_context():
        with db.engine.connect() as conn:
            labs = [person.lab for person in classroom.attendees(conn, class_code)]
    for lab in labs:
        drop_lab(app, lab)


def assert_every_anomaly_says_why(app) -> None:
    """Each anomaly an exercise left (in the lab's verdict and every lane's) carries a sentence a
    class can read aloud, naming the record it is about."""
    state = app.test_client().get("/api/v1/state").get_json()
    verdicts = [("lab", state["verdict"])] + [(lane["lane"], lane["verdict"]) for lane in state["lanes"]]
    for copy, verdict in verdicts:
        bad = verdict["duplicates_applied"] + verdict["effects_lost"]
        judged = [a for a in verdict["anomalies"] if a["severity"] == "bad"]
        assert len(judged) >= min(bad, 1), f"{copy}: {bad} anomalies counted, none explained: {verdict}"
        for anomaly in verdict["anomalies"]:
            assert re.search(r"P\d+@\d+|transaction", anomaly["why"]) and anomaly["why"].endswith(
                tuple("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ)`")), f"{copy}: {anomaly}"


def judge_and_drop_run(app_factory, app, run_lab: str) -> None:
    """After an exercise's run: every anomaly it left says why, then its lab is dropped."""
    run_app = app_factory(LAB_NAME=run_lab, DATABASE_URL=app.config["DATABASE_URL"],
                          KAFKA_BOOTSTRAP_SERVERS=app.config["KAFKA_BOOTSTRAP_SERVERS"])
    assert_every_anomaly_says_why(run_app)
    drop_lab(run_app, run_lab)


def assert_passed(run: Any) -> None:
    """A guided run's verdict, with what failed when it did not pass."""
    failed = [check for check in run.checks if not check["ok"]]
    assert run.status == "passed", f"{run.status}: {run.reason or run.error}; failed: {failed}; steps: {run.steps}"


@contextmanager
def service_dir(name: str) -> Iterator[Path]:
    """A directory for an embedded PostgreSQL's data, outside pytest's temporary root: pytest makes
    ``/tmp/pytest-of-<user>`` mode 0700 at the start of every session, and a second test session on
    the machine would so cut a running cluster's system user off its data directory (PostgreSQL
    PANICs at its next checkpoint). Removed at the end."""
    path = Path(tempfile.mkdtemp(prefix=f"idempotency-lab-{name}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def proxied_stack(base: Path) -> Iterator[Services]:
    """PostgreSQL, a broker advertising a fault proxy process, the proxy and a lab agent whose
    producer goes through it — all its own, so no other agent claims its commands. Every process
    it started is stopped, by its Popen, on the way out (webapp/dev/stack.py)."""
    with Stack(base, fault_proxy=True, env={"SECRET_KEY": TEST_SECRET_KEY}) as services:
        yield services


@contextmanager
def in_process_fault_proxy(base: Path, observer: Callable | None = None,
                           **proxy_options: Any) -> Iterator[tuple[Any, Any, str, Any]]:
    """A Tansu broker advertising a FaultProxy (``proxy_options``: its learners' listener, say) that
    runs on an event loop in a thread of this process; yields (proxy, its Faults, the address clients
    bootstrap from, the event loop)."""
    import asyncio

    from webapp.dev.embedded import LOOPBACK
    from webapp.faultproxy.faults import Faults
    from webapp.faultproxy.proxy import FaultProxy

    broker = EmbeddedBroker(base / "tansu.log")
    faults = Faults()
    loop = asyncio.new_event_loop()
    extra = {"observer": observer} if observer is not None else {}
    proxy = FaultProxy((LOOPBACK, 0), (LOOPBACK, broker.port), faults, **extra, **proxy_options)
    thread = threading.Thread(target=loop.run_forever, name="fault-proxy-loop")
    try:
        loop.run_until_complete(proxy.start())
        thread.start()
        broker.start(advertised_port=proxy.port)
        yield proxy, faults, f"{LOOPBACK}:{proxy.port}", loop
    finally:
        if thread.is_alive():
            asyncio.run_coroutine_threadsafe(proxy.close(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
        else:
            loop.run_until_complete(proxy.close())
        loop.close()
        broker.stop()


def sessions_blocked_by(engine, pid: int) -> int:
    """How many PostgreSQL sessions wait for a lock the session ``pid`` holds."""
    with engine.connect() as other:
        return other.execute(text("SELECT count(*) FROM pg_stat_activity WHERE :mine = ANY(pg_blocking_pids(pid))"),
                             {"mine": pid}).scalar_one()
