"""Browser fixtures: the app served over real HTTP on a free loopback port, and a headless Chromium
page (the system's /usr/bin/chromium, driven by Playwright) that fails the test on console errors."""
from __future__ import annotations

import threading

import pytest
from werkzeug.serving import make_server

from webapp.waits import free_port

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
# Chromium logs every 4xx answer as "Failed to load resource"; a form with bad input answers 422
# on purpose (htmx swaps the form with its errors in), so that line is not a page error.
EXPECTED_NETWORK_LOG = "Failed to load resource: the server responded with a status of 422"


@pytest.fixture
def serve_app(app_factory, lab_name):
    """Serve an app of this test's lab, with CSRF on, from a werkzeug thread; return its URL."""
    servers = []

    def serve(**overrides) -> str:
        app = app_factory(LAB_NAME=lab_name, WTF_CSRF_ENABLED=True, TESTING=False, **overrides)
        port = free_port()
        server = make_server("127.0.0.1", port, app, threaded=True)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        servers.append((server, thread))
        return f"http://127.0.0.1:{port}"
    yield serve
    for server, thread in servers:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture
def browser_page():
    """A Chromium page that records console errors; the test fails if any appear."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        try:
            context = browser.new_context(viewport={"width": 1920, "height": 1080})
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
            browser.close()
