"""The live dashboard in a real browser: headless Chromium against a real web server thread over
the session's PostgreSQL, broker and lab agent, with CSRF on (htmx sends X-CSRFToken).

Every wait is Playwright's expect with a timeout: panels refresh themselves within a second of
a change (static/js/live-refresh.js), so the tests watch the page the way a class does. Screenshots of
the main states land in test-artifacts/ (not committed).
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser

ROOT_ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
SETTLE = 60_000  # ms: a restarted consumer waits for the dead member's session (6 s) to expire, then rejoins


@pytest.fixture
def dashboard_url(serve_app, lab):
    """The dashboard of a fresh lab, with CSRF on, over real HTTP."""
    return serve_app()


def screenshot(page, name: str) -> None:
    ROOT_ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ROOT_ARTIFACTS / f"{name}.png"), full_page=True)


def publish(page, account: str = "acc-1", amount: str = "100.00") -> None:
    from playwright.sync_api import expect
    form = page.locator("#form-publish")
    form.locator("[name=account_id]").select_option(account)
    form.locator("[name=amount]").fill(amount)
    form.get_by_role("button", name="Publish").click()
    expect(page.locator("#form-publish .banner.ok")).to_contain_text("Published 1 normal record", timeout=15_000)


def start_consumer(page, strategy: str):
    from playwright.sync_api import expect
    form = page.locator("#form-consumer")
    form.locator("[name=strategy]").select_option(strategy)
    form.get_by_role("button", name="Start consumer").click()
    expect(page.locator("#form-consumer .banner.ok")).to_contain_text("Started consumer", timeout=15_000)
    card = page.locator("#panel-consumers [data-consumer]").last
    expect(card).to_contain_text("partitions 0, 1, 2", timeout=SETTLE)
    return card


def crash_after_effect_and_restart(page, card) -> None:
    """Arm the classic crash, publish one credit, watch the consumer die, restart it."""
    from playwright.sync_api import expect
    card.locator("select[name=fault]").select_option("crash|once|after-effect-before-commit")
    expect(card.locator("[data-armed]")).to_contain_text("after-effect-before-commit")
    publish(page)
    expect(card).to_have_attribute("data-state", "crashed", timeout=SETTLE)
    card.get_by_role("button", name="Restart").click()
    expect(card).to_have_attribute("data-state", "running", timeout=SETTLE)


def test_publish_from_the_form_and_see_the_cell_appear(dashboard_url, browser_page):
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    publish(page, "acc-3", "25.00")
    cell = page.locator('#panel-partitions .strip .cell[data-outcome="pending"]')
    expect(cell).to_have_count(1, timeout=15_000)
    expect(page.locator('#panel-accounts tr[data-account="acc-3"] [data-expected]')).to_have_text("25.00")
    expect(page.locator('#panel-verdict [data-verdict="not_yet_applied"]')).to_have_text("1")
    # Clicking the cell opens every delivery of it: none yet, one journal row.
    cell.locator("a").click()
    dialog = page.locator("#drill")
    expect(dialog).to_be_visible()
    expect(dialog.locator(".drill-journal tbody tr")).to_have_count(1)
    expect(dialog).to_contain_text("Not delivered to any consumer yet")
    screenshot(page, "dashboard-drilldown-pending")
    dialog.get_by_role("button", name="close").click()
    expect(dialog).to_be_hidden()


@pytest.mark.long
def test_double_credit_under_none_then_absorbed_under_eventid_atomic(dashboard_url, browser_page):
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    card = start_consumer(page, "none")

    crash_after_effect_and_restart(page, card)
    # The redelivered credit is applied again: 200.00 credited for 100.00 published.
    expect(page.locator('#panel-accounts tr[data-account="acc-1"] .diff')).to_contain_text("✕ +100.00", timeout=SETTLE)
    expect(page.locator('#panel-verdict [data-verdict="duplicates_applied"]')).to_have_text("1")
    expect(page.locator("#panel-verdict .headline")).to_have_attribute("data-exactly-once", "false")
    expect(page.locator('#panel-partitions .cell[data-outcome="applied-twice"]')).to_have_count(1)
    screenshot(page, "dashboard-double-credit-none")

    page.locator("summary", has_text="Groups, offsets, lanes").click()
    form = page.locator("#form-strategy")
    form.locator("[name=group]").select_option("payments")
    form.locator("[name=strategy]").select_option("eventid-atomic")
    form.get_by_role("button", name="Switch").click()
    # The switch waits for the running consumers to acknowledge it (settings_changes.settle) and
    # for the agent: seconds on a loaded machine, not the 5 s of expect's default.
    expect(page.locator("#form-strategy .banner.ok")).to_contain_text("now uses eventid-atomic", timeout=30_000)
    expect(page.locator("#panel-sql .tab.current")).to_have_text("eventid-atomic", timeout=5_000)

    card = page.locator("#panel-consumers [data-consumer]").last
    expect(card).to_contain_text("partitions 0, 1, 2", timeout=SETTLE)
    crash_after_effect_and_restart(page, card)
    expect(page.locator('#panel-verdict [data-verdict="redeliveries_absorbed"]')).to_have_text("1", timeout=SETTLE)
    expect(page.locator('#panel-verdict [data-verdict="duplicates_applied"]')).to_have_text("1")
    expect(page.locator('#panel-accounts tr[data-account="acc-1"] [data-expected]')).to_have_text("200.00")
    expect(page.locator('#panel-accounts tr[data-account="acc-1"] .diff')).to_contain_text("✕ +100.00")
    redelivered = page.locator("#panel-partitions .strip .cell.redelivered")
    expect(redelivered).to_have_count(1)
    screenshot(page, "dashboard-absorbed-eventid-atomic")

    # The drill-down tells the story of that record: applied, then absorbed on redelivery.
    redelivered.locator("a").click()
    dialog = page.locator("#drill")
    expect(dialog.locator(".drill-deliveries tbody tr")).to_have_count(2)
    expect(dialog.locator('.drill-deliveries [data-outcome="absorbed"]')).to_have_count(1)
    expect(dialog.locator(".drill-effects tbody tr")).to_have_count(1)
    screenshot(page, "dashboard-drilldown-absorbed")


def test_freeze_and_thaw_from_the_buttons(dashboard_url, browser_page, lab):
    from playwright.sync_api import expect
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(dashboard_url)
    card = start_consumer(page, "none")
    card.get_by_role("button", name="Freeze").click()
    expect(card).to_have_attribute("data-state", "frozen", timeout=15_000)
    expect(page.locator("#notices .notice.ok")).to_contain_text("frozen (SIGSTOP)")
    screenshot(page, "dashboard-frozen-1280")
    # A 1280 px screen (a projector) holds the page's width: nothing scrolls sideways.
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 1280, f"the dashboard scrolls sideways at 1280 px: {width} px wide"
    card.get_by_role("button", name="Thaw").click()
    expect(card).to_have_attribute("data-state", "running", timeout=15_000)
    expect(card.get_by_role("button", name="Freeze")).to_be_visible()


def test_invalid_form_value_shows_its_error_and_changes_nothing(dashboard_url, browser_page, lab):
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    form = page.locator("#form-publish")
    form.locator("[name=amount]").fill("ten")
    form.get_by_role("button", name="Publish").click()
    error = page.locator("#publish-amount-error")
    expect(error).to_be_visible()
    expect(error).to_contain_text("positive amount")
    expect(page.locator("#publish-amount")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#publish-amount")).to_have_value("ten")
    screenshot(page, "dashboard-invalid-amount")
    # Nothing was published: the journal and the page agree.
    assert all(p["log_end"] == 0 for p in lab.state()["partitions"])
    expect(page.locator("#panel-partitions .strip .cell[data-outcome]")).to_have_count(0)
    expect(page.locator('#panel-verdict [data-verdict="not_yet_applied"]')).to_have_text("0")


def test_a_raw_record_typed_in_the_browser_is_in_the_log_and_the_truth(dashboard_url, browser_page):
    """Another system's event, typed by hand: journaled nowhere, yet in the strip and the expected
    balance, because the log is the truth. Then a malformed one: expected in the DLQ."""
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    page.locator("summary", has_text="Raw record").click()
    form = page.locator("#form-raw")
    form.get_by_role("button", name="Fill a valid event").click()
    expect(page.locator("#form-raw [name=value]")).to_have_value(re.compile(r'"type": "credit"'), timeout=10_000)
    page.locator("#form-raw [name=key]").fill("acc-2")
    value = page.locator("#form-raw [name=value]").input_value().replace('"acc-1"', '"acc-2"')
    page.locator("#form-raw [name=value]").fill(value)
    page.locator("#form-raw [name=headers]").fill("source: bank-b")
    page.locator("#form-raw").get_by_role("button", name="Produce raw").click()
    expect(page.locator("#form-raw .banner.ok")).to_contain_text("done", timeout=15_000)
    expect(page.locator('#panel-partitions .cell.foreign[data-offset="0"]')).to_have_count(1, timeout=10_000)
    expect(page.locator("#panel-accounts")).to_contain_text("100.00", timeout=10_000)

    page.locator("#form-raw [name=value]").fill("{this is not an event")
    page.locator("#form-raw").get_by_role("button", name="Produce raw").click()
    expect(page.locator("#form-raw .banner.ok")).to_contain_text("done", timeout=15_000)
    expect(page.locator('#panel-verdict [data-verdict="invalid_records"]')).to_have_text("1", timeout=10_000)
    screenshot(page, "raw-record")


def test_a_raw_record_to_a_partition_the_topic_lacks_is_refused_in_place(dashboard_url, browser_page):
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    page.locator("summary", has_text="Raw record").click()
    page.locator("#form-raw [name=value]").fill("{}")
    page.locator("#form-raw [name=partition]").fill("7")
    page.locator("#form-raw").get_by_role("button", name="Produce raw").click()
    expect(page.locator("#raw-partition-error")).to_contain_text("has 3 partition(s)", timeout=10_000)


def test_a_panel_served_stale_says_so_and_the_page_fetches_it_again(serve_app, lab, browser_page):
    """At scale a slow panel answers from its last load (here every load counts as slow): the page
    shows the note with that load's fingerprint, asks again on the next poll, and ends on the new
    state with the note gone. The polling page (LIVE_PUSH=0, as the fallback): a pushed one gets
    the fresh load within a quarter second, before the note shows (it shows from one second on).

    The verdict panel: its data is loaded by its own fetch alone. (The accounts panel's is also
    loaded by the lanes panel, for the same fingerprint: when the page fetches lanes first, the
    accounts fetch finds the new data loaded, and rightly shows it with no note.)"""
    from playwright.sync_api import expect
    page = browser_page
    page.goto(serve_app(LIVE_STALE_AFTER_SECONDS=1e-9, LIVE_PUSH=0))
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    expected = page.locator('#panel-accounts tr[data-account="acc-2"] [data-expected]')
    publish(page, "acc-2", "31.00")
    expect(page.locator("#panel-verdict [data-stale]")).to_contain_text("this shows the lab as it was",
                                                                         timeout=15_000)
    screenshot(page, "dashboard-stale-panels")  # the whole page: the panel may swap itself meanwhile
    expect(expected).to_have_text("31.00", timeout=15_000)
    expect(page.locator("#panel-verdict [data-stale]")).to_have_count(0, timeout=15_000)


def test_a_panel_under_a_pressed_pointer_waits_for_the_release_before_it_refreshes(dashboard_url, browser_page, lab):
    """A click is a press and a release on one element: a refresh swapped in between loses it."""
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    panel = page.locator("#panel-partitions")
    expect(panel).to_have_attribute("data-fingerprint", re.compile(".+"))
    page.evaluate("""() => {
        const panel = document.getElementById('panel-partitions');
        panel.dataset.pressedMarker = 'old';
        panel.querySelector('h2').dispatchEvent(new PointerEvent('pointerdown', {bubbles: true}));
    }""")
    before = panel.get_attribute("data-fingerprint")
    lab.credit("acc-1", 100)
    # The page learns the panel is stale and holds it rather than swap it under the pointer.
    page.evaluate("window.labLive.pollNow()")
    expect(panel).to_have_attribute("data-held", "pointer", timeout=15_000)
    assert panel.get_attribute("data-pressed-marker") == "old", "the panel was swapped under a pressed pointer"
    page.evaluate("document.getElementById('panel-partitions').dispatchEvent("
                  "new PointerEvent('pointerup', {bubbles: true}))")
    expect(panel).not_to_have_attribute("data-pressed-marker", "old", timeout=5_000)
    expect(panel).not_to_have_attribute("data-fingerprint", before)


def test_your_consumer_page_shows_where_to_connect_and_the_starter_right_after_create(dashboard_url, browser_page):
    """Create my lane: the connection table and the starter appear in place, with no reload, and the
    starter has a copy button. The header leads everywhere, and an empty lab says where to start."""
    from playwright.sync_api import expect
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(dashboard_url)
    expect(page.locator("[data-start-here]")).to_be_visible()
    for name in ("Lab", "Exercises", "Your consumer", "Docs"):
        expect(page.locator(".site-nav").get_by_role("link", name=name, exact=True)).to_be_visible()
    page.locator(".site-nav").get_by_role("link", name="Your consumer").click()
    expect(page.locator("#yours table.facts")).to_have_count(0)
    page.get_by_role("button", name="Create my lane").click()
    expect(page.locator("#yours table.facts")).to_contain_text("bootstrap servers", timeout=SETTLE)
    expect(page.locator("#starter-code")).to_contain_text("confluent_kafka")
    page.get_by_role("button", name="Copy the starter").click()
    expect(page.locator("[data-copied]")).not_to_have_text("")
    screenshot(page, "yours-after-create-1280")


def test_a_restart_after_a_crash_says_why_the_redelivery_waits_and_counts_down(dashboard_url, browser_page):
    """The restarted member gets its partition only once the crashed member's session has timed out:
    the group's card says so, with a countdown, until the partition is assigned."""
    from playwright.sync_api import expect
    page = browser_page
    page.goto(dashboard_url)
    card = start_consumer(page, "none")
    crash_after_effect_and_restart(page, card)
    wait = page.locator("[data-rebalance-wait]")
    expect(wait).to_contain_text("keeps them until its session times out (6 s)", timeout=10_000)
    expect(wait.locator("[data-countdown]")).to_have_text(re.compile(r"about \d+ s left|any moment now"))
    expect(wait).to_have_count(0, timeout=SETTLE)   # assigned: the redelivery goes on
