"""Pushed panels in a real browser: two pages of one lab see a publish without polling,
a page whose stream ends reconnects and stays pushed, and a page refused a stream polls and says so.

Headless Chromium against a real web server thread over the session's PostgreSQL, broker and agent.
"""
from __future__ import annotations

import pytest

from webapp.web.push import hub

pytestmark = pytest.mark.browser


def watch(page) -> dict:
    """The page's requests to /live (polls) and /stream (stream connections), and its script errors."""
    seen = {"polls": 0, "streams": 0, "errors": []}
    page.on("pageerror", lambda error: seen["errors"].append(str(error)))

    def count(request) -> None:
        path = request.url.split("?", 1)[0]
        if path.endswith("/live"):
            seen["polls"] += 1
        elif path.endswith("/stream"):
            seen["streams"] += 1
    page.on("request", count)
    return seen


def expected(page, account: str):
    return page.locator(f'#panel-accounts tr[data-account="{account}"] [data-expected]')


def credited(lab, account: str, cents: int) -> None:
    """Publish a credit and wait until the lab's data expects it (the log reader read it back from
    the topic, 30 s on a loaded machine at most): what a page must then show is the push's doing."""
    lab.credit(account, cents)
    lab.wait(lambda state: next(a for a in state["accounts"] if a["id"] == account)["expected"] == cents,
             f"the lab never expected {cents} cents on {account}")


def test_two_pages_see_a_publish_pushed_reconnect_after_the_stream_ends_and_poll_when_refused(
        serve_app, lab, browser_page):
    from playwright.sync_api import expect
    url = serve_app()
    app = serve_app.app
    first, second = browser_page, browser_page.context.new_page()
    seen = [watch(first), watch(second)]
    for page in (first, second):
        page.goto(url)
        indicator = page.locator("#live-indicator")
        expect(indicator).to_have_attribute("data-mode", "push")
        expect(indicator).to_have_attribute("data-state", "live")
        expect(indicator).to_have_text("● live · push")

    for page in (first, second):
        expect(page.locator("#panel-chart .chart-empty")).to_be_visible()
    credited(lab, "acc-2", 1234)
    for page in (first, second):
        expect(expected(page, "acc-2")).to_have_text("12.34", timeout=5_000)
        # The chart's series comes in its event: the page fetched it once, on load, with nothing in it.
        expect(page.locator("#panel-chart .chart-empty")).to_be_hidden(timeout=5_000)

    # The server ends the lab's streams: both pages reconnect, and the next change arrives, pushed.
    with first.expect_request("**/stream", timeout=15_000), second.expect_request("**/stream", timeout=15_000):
        assert hub(app).drop(lab.lab.name) == 2
    assert seen[0]["streams"] == seen[1]["streams"] == 2
    credited(lab, "acc-3", 4321)
    expect(expected(first, "acc-3")).to_have_text("43.21", timeout=5_000)
    expect(first.locator("#live-indicator")).to_have_attribute("data-mode", "push")
    assert [s["polls"] for s in seen] == [0, 0], "a pushed page polled /live"
    # htmx logs the EventSource's error event of a stream the server ended as "[object Event]": the
    # reconnect above, expected here, is no console error of the page.
    first.console_errors[:] = [error for error in first.console_errors if error != "[object Event]"]
    assert seen[1]["errors"] == [], seen[1]["errors"]

    # A server holding its most streams refuses one: the page polls, and says so.
    refused = serve_app(LIVE_STREAMS_PER_WORKER=0)
    third = browser_page.context.new_page()
    seen_third = watch(third)
    third.goto(refused)
    expect(third.locator("#live-indicator")).to_have_attribute("data-mode", "poll")
    expect(third.locator("#live-note")).to_be_visible()
    expect(third.locator("#live-note")).to_contain_text("LIVE_STREAMS_PER_WORKER")
    credited(lab, "acc-4", 500)
    expect(expected(third, "acc-4")).to_have_text("5.00", timeout=5_000)
    assert seen_third["polls"] > 0
