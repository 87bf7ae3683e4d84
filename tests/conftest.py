"""Fixtures: real PostgreSQL and Tansu started once per session, a real lab agent process, and a
fresh lab (its own schema and topics) for every test that wants one.

Nothing here is mocked: tests publish through the agent's producer, consumers are OS processes
the agent starts, and every wait is for a condition with a deadline.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import traceback
import warnings

import psycopg
import pytest

import support
from support import TEST_SECRET_KEY, LabDriver, Services, drop_lab
from webapp import create_app
from webapp.agent.processes import stop_process
from webapp.dev.stack import Stack
from webapp.domain.waits import WaitTimeout, wait_until


@pytest.fixture(scope="session")
def services(tmp_path_factory) -> Services:
    """The embedded PostgreSQL (the control schema at head, as `make run` leaves it) and broker,
    on free loopback ports, for the whole session (webapp/dev/stack.py)."""
    with support.service_dir("services") as base, \
            Stack(base, agent=False, env={"SECRET_KEY": TEST_SECRET_KEY}) as services:
        yield services


@pytest.fixture(scope="session")
def agent(services) -> subprocess.Popen:
    """A real lab agent process serving every test's lab (log: agent.log in the services' dir)."""
    process = services.start_agent()
    try:
        yield process
    finally:
        stop_process(process)


def pytest_collection_modifyitems(items) -> None:
    """The longest tests first: the soak, then those marked long. Each test worker takes one at
    once, rather than the run ending with three workers idle while a late-started soak finishes."""
    def rank(item) -> int:
        return 0 if item.get_closest_marker("soak") else 1 if item.get_closest_marker("long") else 2
    items.sort(key=rank)


def _name_where_each_connection_was_opened() -> None:
    """A psycopg connection garbage-collected while still open is an error here (warnings are
    errors), reported by pytest at whichever later test the collection happened in, and psycopg's
    warning does not say who opened it. So each connection of this process keeps the stack that
    opened it, and the warning quotes it."""
    connect = psycopg.Connection.connect.__func__
    deleted = psycopg.Connection.__del__

    def connect_noting_where(cls, *args, **kwargs):
        conn = connect(cls, *args, **kwargs)
        conn._opened_at = "".join(traceback.format_stack(limit=25)[:-1])
        return conn

    def warn_with_where(self, __warn=warnings.warn) -> None:
        if hasattr(self, "pgconn") and not self.closed and not hasattr(self, "_pool"):
            __warn(f"{object.__repr__(self)} was deleted while still open; it was opened at:\n"
                   f"{getattr(self, '_opened_at', '(unknown)')}", ResourceWarning)
            return
        deleted(self)

    psycopg.Connection.connect = classmethod(connect_noting_where)
    psycopg.connect = psycopg.Connection.connect  # the module's alias, which psycopg binds at import
    psycopg.Connection.__del__ = warn_with_where


_name_where_each_connection_was_opened()

_lab_numbers = itertools.count(1)


@pytest.fixture
def lab_name(services) -> str:
    """A lab name unique to this test run: its own schema and topics."""
    return f"t{os.getpid() % 10000}_{next(_lab_numbers)}"


class AppFactory:
    """Builds apps with test settings over the session's services and closes their pools at the end."""

    def __init__(self, services, data_dir):
        self.services, self.data_dir, self.apps = services, data_dir, []

    def __call__(self, **overrides):
        app = create_app({
            "TESTING": True,
            "DATABASE_URL": self.services.database_url,
            "KAFKA_BOOTSTRAP_SERVERS": self.services.bootstrap_servers,
            "LAB_DATA_DIR": str(self.data_dir / "data"),
            "SECRET_KEY": TEST_SECRET_KEY,
            "WTF_CSRF_ENABLED": False,
            # The shared broker keeps every record in memory: loads and synthetic keys stay small here.
            "LAB_MAX_LOAD_EVENTS": 20_000, "LAB_MAX_WARMUP_KEYS": 20_000,
            # An exploration a test starts (or the API's fuzzing does) ends within minutes.
            "LAB_EXPLORER_MAX_RUNS": 50, "LAB_EXPLORER_MAX_MINUTES": 3.0,
            # A test client asserts right after it acts: fingerprints per request. The browser
            # tests' server (serve_app) runs with the default, as a viewer's browser sees it.
            "LIVE_CACHE_SECONDS": 0,
            # ... and each panel loaded for the state it asserts on, never served from an older load.
            "LIVE_STALE_AFTER_SECONDS": 0,
            # The session's database gathers a lab per test and per scenario run: no limit on their
            # number here (0); the limit's own tests set one.
            "LAB_MAX_LABS": 0,
            **overrides,
        })
        self.apps.append(app)
        return app

    def close(self) -> None:
        from webapp.web.db import db
        from webapp.web.push import stop_hub
        for app in self.apps:
            stop_hub(app)  # its LISTEN connection and threads, if a stream started them
            with app.app_context():
                # A request thread of a served app (werkzeug's are daemons, not joined at shutdown)
                # may still hold a connection: dispose() closes only those checked in, and one
                # checked in later is left open for the garbage collector (a ResourceWarning, an
                # error, in whichever later test collects it).
                try:
                    wait_until(lambda: db.engine.pool.checkedout() == 0, timeout=10, interval=0.05, message="")
                except WaitTimeout:
                    pass  # a request still running after 10 s: disposed anyway, the warning will name it
                db.engine.dispose()


@pytest.fixture
def app_factory(services, tmp_path):
    """Build apps with test settings over the session's services; their pools closed at the end."""
    factory = AppFactory(services, tmp_path)
    yield factory
    factory.close()


@pytest.fixture(scope="module")
def module_app_factory(services, tmp_path_factory):
    """app_factory for a module's fixtures that one set-up serves every test of (an app, a class)."""
    factory = AppFactory(services, tmp_path_factory.mktemp("module-apps"))
    yield factory
    factory.close()


@pytest.fixture
def app(app_factory, lab_name):
    return app_factory(LAB_NAME=lab_name)


@pytest.fixture
def client(app):
    return app.test_client()


@pytest.fixture
def runner(app):
    return app.test_cli_runner()


@pytest.fixture
def lab(app, client, agent, lab_name) -> LabDriver:
    """A fresh lab (schema, topics, seed accounts, default group) and a driver for it."""
    driver = support.open_lab(app, lab_name, client)
    yield driver
    support.kill_consumers(driver)
    drop_lab(app, lab_name)


@pytest.fixture(scope="session")
def proxied_stack(tmp_path_factory) -> Services:
    """For the exercises whose Kafka clients go through the fault proxy (lost ack, blocked commits,
    producer ordering): one stack of their own per test worker, started when first asked for."""
    with support.service_dir("proxied") as base, support.proxied_stack(base) as services:
        yield services


# --- browser tests (tests/browser/): the app over real HTTP, and a headless Chromium page --------
# Here rather than in tests/browser/conftest.py: two modules named "conftest" would shadow each
# other for the tests that import helpers from this one.

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
# Chromium logs every 4xx answer as "Failed to load resource"; a form with bad input answers 422
# on purpose (htmx swaps the form with its errors in), so that line is not a page error.
EXPECTED_NETWORK_LOG = "Failed to load resource: the server responded with a status of 422"


@pytest.fixture
def serve_app(app_factory, lab_name):
    """Serve an app of this test's lab, with CSRF on, from a werkzeug thread; return its URL."""
    servers = support.Servers()

    def serve(**overrides) -> str:
        app = app_factory(**support.served_settings(lab_name, **overrides))
        serve.app = app  # the last app served, for a test that reaches into it (its streams, say)
        return servers.serve(app)
    yield serve
    servers.close()


_classes = itertools.count(1)


@pytest.fixture
def class_code() -> str:
    """A class code unique to this test run (a test module may define its own)."""
    return f"class-{os.getpid() % 10000}-{next(_classes)}"


@pytest.fixture
def class_url(serve_app, agent, app_factory, class_code):
    """A server in classroom mode (a class code, the instructor's token CLASS_TOKEN), over real HTTP;
    every attendee's lab dropped at the end."""
    url = serve_app(LAB_CLASS_CODE=class_code, LAB_TOKEN=support.CLASS_TOKEN)
    yield url
    support.drop_class_labs(app_factory(), class_code)


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium per browser test module (a launch costs about a second of CPU); each
    test has a context of its own (cookies, storage, pages), closed at its end. Not per session:
    Playwright's sync API leaves its event loop marked as running in the thread while it is up, and
    the tests that run an event loop of their own (test_faultproxy) would meet it."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def browser_page(chromium):
    """A Chromium page, in a fresh context, that records console errors; the test fails if any appear."""
    context = chromium.new_context(viewport={"width": 1920, "height": 1080})
    try:
        page = context.new_page()
        page.console_errors = []
        page.on("console", lambda message: page.console_errors.append(message.text)
                if message.type == "error" and not message.text.startswith(EXPECTED_NETWORK_LOG) else None)
        page.on("pageerror", lambda error: page.console_errors.append(str(error)))
        # Name the URL of every failed request: Chromium's console line does not.
        page.on("response", lambda response: page.console_errors.append(f"{response.status} {response.url}")
                if response.status >= 400 and response.status != 422 else None)
        yield page
        assert page.console_errors == [], f"console errors: {page.console_errors}"
    finally:
        for opened in chromium.contexts:  # this one, and any other the test opened (a second browser)
            opened.close()
