"""The group card's Recover button in a real browser (htmx POST, CSRF on): on a group the broker
assigns nothing, its notice says what the recovery did and the group applies records again.

Headless Chromium against a real web server thread over the session's PostgreSQL, broker and agent.
"""
from __future__ import annotations

import re

import pytest
from test_group_health import member_that_never_polls

pytestmark = pytest.mark.browser


@pytest.mark.long
def test_the_group_cards_recover_button_gets_a_group_the_broker_assigns_nothing_applying_again(
        services, serve_app, lab, browser_page):
    """A member of the test's own that heartbeats without polling holds the group's partition, so
    the lab's c1 joins and is assigned nothing: the rebalance waits for that member, which never
    rejoins, and restarting c1 does not change that. The card shows the group rebalancing (or
    stalled) with its Recover button; the click restarts c1 and, the broker still assigning
    nothing, moves the group to a fresh Kafka group id with its committed offsets: the credit
    published meanwhile is applied."""
    from playwright.sync_api import expect
    page = browser_page
    hostage = member_that_never_polls(services, lab)
    try:
        c1 = lab.start_consumer(name="c1")["consumer_id"]
        lab.wait_state(c1, "running")
        lab.credit("acc-1", 1200)
        page.goto(serve_app())
        card = page.locator('#panel-consumers .group-card[data-group="payments"]')
        # Rebalancing at first, stalled past max.poll.interval.ms + session.timeout.ms: the button shows in both.
        expect(card).to_have_attribute("data-health", re.compile("^(rebalancing|stalled)$"), timeout=15_000)
        assert not lab.consumer(c1)["assigned"], "the test's member let go of the partition"
        expect(page.locator('#panel-accounts tr[data-account="acc-1"] [data-actual]')).to_have_attribute(
            "data-actual", "0")
        pid = lab.consumer(c1)["pid"]

        card.get_by_role("button", name="↻ Recover group").click()
        # The request waits for the agent's recovery: a restart, then two session timeouts, then the move.
        notice = page.locator("#notices")
        expect(notice).to_contain_text(f"{lab.lab.group_id('payments')}: restarted 1 member(s): c1", timeout=60_000)
        expect(notice).to_contain_text("committed offsets carried over")
        expect(page.locator('#panel-accounts tr[data-account="acc-1"] [data-actual]')).to_have_attribute(
            "data-actual", "1200", timeout=30_000)
        expect(card).to_have_attribute("data-health", "stable", timeout=15_000)
        assert lab.consumer(c1)["pid"] != pid, "the recovery did not restart c1's process"
    finally:
        hostage.close()
