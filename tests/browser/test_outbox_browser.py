"""The Outbox panel in a real browser: headless Chromium against a real web server thread over
the session's PostgreSQL, broker and lab agent (which runs the lab's outbox relay), CSRF on.

A payment through the outbox form shows as a pending row, then sent; armed after publish and
before mark, the relay dies, comes back, publishes the row again, and the panel shows the same
event id twice in the log. Every wait is Playwright's expect with a timeout.
"""
from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT_ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
RELAY = 45_000  # ms: the agent looks for relays to start about once a second; a restart, a publish


def open_outbox_controls(page):
    page.locator("summary", has_text="Outbox (payments service, relay)").click()


def pay_via_outbox(page, amount: str):
    from playwright.sync_api import expect
    form = page.locator("#form-publish_via_outbox")
    form.locator("[name=account_id]").fill("acc-2")
    form.locator("[name=amount]").fill(amount)
    form.get_by_role("button", name="Pay via the outbox").click()
    expect(page.locator("#form-publish_via_outbox .banner.ok")).to_contain_text("outbox_id", timeout=15_000)


def test_the_outbox_panel_shows_a_row_sent_then_the_relay_publishing_it_again(serve_app, lab, browser_page):
    from playwright.sync_api import expect
    page = browser_page
    page.goto(serve_app())
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    panel = page.locator("#panel-outbox")
    expect(panel).to_contain_text("No payment through the outbox yet")
    open_outbox_controls(page)

    pay_via_outbox(page, "12.50")
    expect(panel.locator("tr.sent")).to_have_count(1, timeout=RELAY)
    expect(panel.locator("[data-relay-state]")).to_have_attribute("data-relay-state", "running")
    expect(panel.locator("[data-relay-published]")).to_have_text("1")

    # A bad amount is refused next to its field, and nothing is written.
    form = page.locator("#form-publish_via_outbox")
    form.locator("[name=amount]").fill("-3")
    form.get_by_role("button", name="Pay via the outbox").click()
    expect(form.locator(".field-amount .field-error")).to_be_visible()

    arm = page.locator("#form-arm_relay_fault")
    arm.locator("[name=point]").select_option("relay-after-publish-before-mark")
    arm.get_by_role("button", name="Arm the relay").click()
    expect(panel.locator("[data-relay-armed]")).to_contain_text("relay-after-publish-before-mark", timeout=5_000)

    pay_via_outbox(page, "30.00")
    expect(panel.locator("[data-relay-republished]")).to_have_text("1", timeout=RELAY)
    expect(panel.locator("tr.sent")).to_have_count(2, timeout=RELAY)
    expect(panel.locator("tr.again")).to_have_count(1)
    expect(panel.locator("[data-republished-event]")).to_have_count(1)
    expect(panel.locator("[data-relay-armed]")).to_have_count(0)
    expect(panel).to_contain_text("last crash: relay-after-publish-before-mark")
    # The timeline says what the relay did, in order.
    expect(page.locator("#panel-timeline")).to_contain_text("outbox relay killed at relay-after-publish-before-mark")
    expect(page.locator("#panel-timeline")).to_contain_text("again (publish #2")
    ROOT_ARTIFACTS.mkdir(exist_ok=True)
    # The page, clipped to the panel: a push may replace the panel's element at any moment, so it is
    # found, scrolled to and measured in one script (a locator's scroll, then a measure, can each
    # meet a detached element).
    box = page.evaluate("""() => {
        const panel = document.querySelector('#panel-outbox');
        panel.scrollIntoView({block: 'nearest'});
        const r = panel.getBoundingClientRect();
        return {x: r.x, y: r.y, width: r.width, height: Math.min(r.height, window.innerHeight - r.y)};
    }""")
    page.screenshot(path=str(ROOT_ARTIFACTS / "outbox-republished.png"), clip=box)

    page.locator("#panel-outbox summary", has_text="The SQL").click()
    expect(panel.locator('[data-point="relay-after-publish-before-mark"]')).to_be_visible()
    expect(panel).to_contain_text("FOR UPDATE SKIP LOCKED")
