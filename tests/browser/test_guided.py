"""Guided mode in a real browser: walk exercise 1 step by step and watch the verdict turn green.

Headless Chromium (the system's, /usr/bin/chromium) drives the real page against a real web
server thread, with CSRF on: htmx's POSTs carry the X-CSRFToken header from layout.html.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from webapp.scenarios import built_in, load

pytestmark = pytest.mark.browser
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
POLL_MS = 1000  # how often a polling page looks (static/js/live-refresh.js, POLL_MS)


@pytest.fixture
def guided_server(serve_app, agent):
    """The web app with CSRF on, over real HTTP."""
    return serve_app()


@pytest.fixture
def page(browser_page):
    browser_page.set_viewport_size({"width": 1400, "height": 1000})
    return browser_page


def test_guided_mode_walks_exercise_one_to_a_green_verdict(guided_server, page):
    from playwright.sync_api import expect

    exercise = built_in()[0]
    scenario = load(exercise)
    fetched = {"guide": 0, "live": 0, "loads": 0}

    def count(request) -> None:
        path = request.url.split("?", 1)[0]
        for part in ("guide", "live"):
            if path.endswith(f"/{part}"):
                fetched[part] += 1
        if request.resource_type == "document" and "/scenarios/runs/" in path:
            fetched["loads"] += 1
    page.on("request", count)
    page.goto(f"{guided_server}/scenarios/")
    card = page.locator(f'[data-scenario="{exercise.stem}"]')
    expect(card).to_contain_text(scenario.title)
    card.get_by_role("button", name="Start").click()

    expect(page.locator("h2").first).to_contain_text(scenario.title)
    expect(page.locator(".narrative")).to_contain_text("after-effect-before-commit")
    button = page.locator("#next-step")
    expect(button).to_have_text("Prepare a fresh lab")
    expect(page.locator("#live-indicator")).to_have_attribute("data-mode", "push")

    clicks = 0
    guide = page.locator("#guide")
    while page.locator("#next-step").count():
        progress = guide.get_attribute("data-progress")
        page.locator("#next-step").click()
        clicks += 1
        # A lab agent runs the step (a wait can take several seconds); the run's stream pushes the
        # steps panel as the run's row changes, until the step is done and the run is free again.
        expect(guide).not_to_have_attribute("data-progress", progress, timeout=90_000)
        expect(guide).to_have_attribute("data-busy", "false", timeout=90_000)
        if clicks == 1:
            # Progress lives in PostgreSQL: a reload keeps it.
            page.reload()
            expect(page.locator('[data-step="0"]')).to_have_class("ok")
        assert clicks <= len(scenario.steps) + 2, "the run never finished"

    expect(page.locator("[data-run-status]")).to_have_text("passed")
    assert page.locator('[data-step][data-status="ok"]').count() == len(scenario.steps)
    # Each expectation, with its observed value, turns green in the live panel.
    checks = page.locator("#expectations [data-check]")
    expect(checks).to_have_count(len(scenario.expectations), timeout=10_000)
    expect(page.locator('#expectations [data-ok="false"]')).to_have_count(0, timeout=10_000)
    expect(page.locator('#expectations [data-check="acc-1 actual (cents)"]')).to_contain_text("20000")
    expect(page.locator('[data-account="acc-1"]').first).to_contain_text("R$ 200.00")
    # Pushed, never polled: the steps panel was never fetched; the live panel was fetched on each
    # page load, and once more whenever a push came while a fetch of it was under way (live-refresh.js
    # holds that push back, then fetches the panel as it is now: on a loaded machine, one push in
    # several). With the run over nothing is pushed, and a polling page would fetch the live panel
    # once a second: over a window of three poll periods this page fetches nothing.
    assert fetched["guide"] == 0 and fetched["live"] >= fetched["loads"], fetched
    before = dict(fetched)
    page.wait_for_timeout(3 * POLL_MS)  # a window to observe an absence in, not a wait for a condition
    assert fetched == before, f"the finished run's page fetched {fetched} after {before}: it polls"
    # The end: the takeaway, the verdict, the next exercise; the duplicate the exercise predicts is
    # shown as its lesson, with no failure's ✕ beside "passed".
    expect(page.locator("[data-takeaway]")).to_contain_text("a consumer without deduplication applies it a second time")
    expect(page.locator("[data-run-verdict]")).to_contain_text("Passed")
    expect(page.locator("[data-next-exercise]")).to_have_attribute("data-next-exercise", built_in()[1].stem)
    expect(page.locator("#live .headline.bad")).to_have_count(0)
    expect(page.locator("#live .headline.shown")).to_contain_text("what this exercise shows")
    assert "✕" not in page.locator("#guide").inner_text() + page.locator("#expectations").inner_text()
    page.set_viewport_size({"width": 1280, "height": 720})
    page.screenshot(path=str(ARTIFACTS / "guided-end-1280x720.png"))
