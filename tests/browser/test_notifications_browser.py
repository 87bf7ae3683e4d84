"""The Notifications panel in a real browser: set a group to notify before its commit, without a
key, crash a consumer between the call and the commit, and watch the customer be told twice while
the balance stays right. Headless Chromium against a real web server thread, the session's
PostgreSQL, broker and lab agent (and its notification service sidecar), CSRF on.
"""
from __future__ import annotations

import pytest
from test_dashboard_browser import SETTLE, publish, screenshot, start_consumer

pytestmark = pytest.mark.browser


@pytest.fixture
def dashboard_url(serve_app, lab):
    return serve_app()


def test_a_crash_between_the_call_and_the_commit_shows_two_notifications(dashboard_url, lab, browser_page):
    from playwright.sync_api import expect
    lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    page = browser_page
    page.goto(dashboard_url)
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    panel = page.locator("#panel-notifications")
    expect(panel).to_contain_text("No notification yet")

    page.locator("summary", has_text="Notifications (external side effect)").click()
    form = page.locator("#form-notification")
    form.locator("[name=notify]").select_option("before-commit")
    form.get_by_role("button", name="Save, from the next message").click()
    expect(form.locator(".banner.ok")).to_contain_text("done", timeout=15_000)
    expect(panel.locator('[data-group="payments"]')).to_have_attribute("data-notify", "before-commit")
    expect(panel.locator('[data-group="payments"]')).to_have_attribute("data-key", "no")

    card = start_consumer(page, "eventid-atomic")
    # The SQL view shows the call inside the transaction, between its two crash points.
    expect(page.locator('#panel-sql .tx [data-call="notification"]')).to_contain_text("POST $LAB_NOTIFY_URL/notifications")
    expect(page.locator('#panel-sql .tx [data-point="after-notify-before-commit"]')).to_have_count(1)

    card.locator("select[name=fault]").select_option("crash|once|after-notify-before-commit")
    expect(card.locator("[data-armed]")).to_contain_text("after-notify-before-commit")
    publish(page)
    expect(card).to_have_attribute("data-state", "crashed", timeout=SETTLE)
    card.get_by_role("button", name="Restart").click()

    row = panel.locator('tr[data-account="acc-1"]')
    expect(row.locator("[data-delivered]")).to_have_attribute("data-delivered", "2", timeout=SETTLE)
    expect(row.locator("[data-sent]")).to_have_text("2")
    expect(row.locator("[data-duplicates]")).to_have_attribute("data-duplicates", "1")
    expect(panel.locator(".notify-why li")).to_contain_text("after-notify-before-commit")
    expect(page.locator('#panel-accounts tr[data-account="acc-1"] [data-actual]')).to_have_text("100.00")
    screenshot(page, "notifications-told-twice")
