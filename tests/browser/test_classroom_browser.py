"""Classroom mode in real browsers: an attendee is a secret, not a name. Two browser contexts (two
browsers as far as the server can tell: separate cookies) join one class over real HTTP, CSRF on,
with the session's PostgreSQL, broker and lab agent."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser


def submit_join(page, url: str, name: str, code: str, rejoin: str | None = None) -> None:
    page.goto(f"{url}/join")
    page.fill("#join-name", name)
    page.fill("#join-code", code)
    if rejoin is not None:
        page.fill("#join-rejoin", rejoin)
    page.get_by_role("button", name="Join").click()


def test_a_second_browser_needs_the_rejoin_code_to_open_an_attendees_lab(class_url, class_code, browser_page):
    from playwright.sync_api import expect
    alice = browser_page
    submit_join(alice, class_url, "alice", class_code)
    banner = alice.locator("[data-classroom-banner]")
    expect(banner).to_contain_text("You are alice")
    alice_lab = banner.locator("code").first.inner_text()
    code = banner.locator("[data-rejoin-code]").get_attribute("data-rejoin-code")
    assert code and len(code) == 9, code

    other = alice.context.browser.new_context()
    try:
        intruder = other.new_page()
        # Her name in other letters, with the class code: refused, and told how to get back in.
        submit_join(intruder, class_url, "ALICE", class_code)
        refusal = intruder.locator("#join-name-error")
        expect(refusal).to_contain_text("alice has already joined this class")
        expect(refusal).to_contain_text("rejoin code")
        expect(refusal).to_contain_text("hand your lab over")
        expect(intruder.locator("[data-classroom-banner]")).to_have_count(0)
        # With her rejoin code, the second browser opens her lab (the same lab, not a new one).
        submit_join(intruder, class_url, "ALICE", class_code, rejoin=code)
        second_banner = intruder.locator("[data-classroom-banner]")
        expect(second_banner).to_contain_text("You are alice")
        expect(second_banner.locator("code").first).to_have_text(alice_lab)
    finally:
        other.close()
