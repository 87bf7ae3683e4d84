"""Classroom mode in real browsers: an attendee is a secret, not a name. Two browser contexts (two
browsers as far as the server can tell: separate cookies) join one class over real HTTP, CSRF on,
with the session's PostgreSQL, broker and lab agent."""
from __future__ import annotations

import re

import pytest

pytestmark = pytest.mark.browser


def submit_join(page, url: str, name: str, code: str, rejoin: str | None = None) -> None:
    page.goto(f"{url}/join")
    page.fill("#join-name", name)
    page.fill("#join-code", code)
    if rejoin is not None:
        page.fill("#join-rejoin", rejoin)
    page.get_by_role("button", name="Join").click()


def sign_in(page, url: str) -> None:
    """The instructor signs in with the class's LAB_TOKEN."""
    from support import CLASS_TOKEN
    page.goto(f"{url}/sign-in?next=/class")
    page.fill("input[name=token]", CLASS_TOKEN)
    page.get_by_role("button", name="Sign in").click()


def test_a_second_browser_needs_the_rejoin_code_to_open_an_attendees_lab(class_url, class_code, browser_page):
    from playwright.sync_api import expect
    alice = browser_page
    submit_join(alice, class_url, "alice", class_code)
    # Her rejoin code is shown once, right after she joins; then she opens her lab.
    code = alice.locator("[data-rejoin-code]").get_attribute("data-rejoin-code")
    assert code and len(code) == 9, code
    alice.get_by_role("link", name="Open your lab").click()
    banner = alice.locator("[data-classroom-banner]")
    expect(banner).to_contain_text("You are alice")
    expect(banner.locator("[data-rejoin-code]")).to_have_count(0)
    alice_lab = banner.locator("code").first.inner_text()

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
        intruder.get_by_role("link", name="Open your lab").click()
        second_banner = intruder.locator("[data-classroom-banner]")
        expect(second_banner).to_contain_text("You are alice")
        expect(second_banner.locator("code").first).to_have_text(alice_lab)
    finally:
        other.close()


def test_the_board_is_pushed_a_new_attendees_card_and_its_pushed_forms_work(class_url, class_code, browser_page):
    """The board holds one stream: an attendee who joins after it loaded appears without a poll, and
    the buttons of that pushed card (HTML pushed to every board, so with no viewer's CSRF token in
    it) work: the page puts its own token in as the form is sent."""
    from playwright.sync_api import expect
    board = browser_page
    sign_in(board, class_url)
    polls = []
    board.on("request", lambda request: polls.append(request.url) if "/class/cards" in request.url else None)
    board.goto(f"{class_url}/class")
    expect(board.locator("#live-indicator")).to_have_attribute("data-mode", "push")
    expect(board.locator("#live-indicator")).to_have_text("● live · push")

    other = board.context.browser.new_context()
    try:
        carol = other.new_page()
        submit_join(carol, class_url, "carol", class_code)
        carol.get_by_role("link", name="Open your lab").click()
        lab = carol.locator("[data-classroom-banner] code").first.inner_text()
    finally:
        other.close()
    card = board.locator(f'.class-card[data-lab="{lab}"]')
    expect(card).to_contain_text("carol", timeout=10_000)
    # Read on a projector: at 1280 px the names, the exercise line and the verdict are 18 px or more,
    # and the instructor's header leads to the board.
    board.set_viewport_size({"width": 1280, "height": 720})
    # Found and measured in one script: a push may replace the card (its outer HTML) at any moment,
    # and a card element held across two calls may be the detached one (no computed style: NaN).
    sizes = board.evaluate("""(lab) => {
        const card = document.querySelector(`.class-card[data-lab="${lab}"]`);
        return ['.name', '[data-exercise]', '.verdict-line', '.line.muted']
            .map(s => [s, parseFloat(getComputedStyle(card.querySelector(s)).fontSize)]);
    }""", lab)
    assert all(size >= 18 for _, size in sizes), sizes
    expect(board.locator('.site-nav a[aria-current="page"]')).to_have_text("Board")
    assert card.locator('input[name="csrf_token"]').first.get_attribute("value") == ""

    card.get_by_role("button", name="Hand over").click()
    expect(board.locator(f'[data-handed-over="{lab}"]')).to_contain_text("carol's new rejoin code")
    assert polls == [], f"a pushed board polled: {polls}"


def test_an_exercise_the_instructor_starts_reaches_an_open_dashboard_by_its_title(class_url, class_code, browser_page):
    """An attendee's dashboard, left open: "Start it for everyone" on the board reaches its classroom
    line within seconds, with no reload, naming the exercise by its title."""
    from playwright.sync_api import expect
    board = browser_page
    other = board.context.browser.new_context()
    try:
        dora = other.new_page()
        submit_join(dora, class_url, "dora", class_code)
        dora.get_by_role("link", name="Open your lab").click()
        expect(dora.locator("[data-classroom-banner]")).to_contain_text("You are dora")
        expect(dora.locator("[data-my-run]")).to_have_count(0)
        sign_in(board, class_url)
        board.goto(f"{class_url}/class")
        board.locator("#board-scenario").select_option("01_naive_double_credit")
        board.get_by_role("button", name="Start it for everyone").click()
        expect(board.locator("[data-board-notice]")).to_contain_text("started")
        expect(dora.locator("[data-my-run]")).to_contain_text("Your exercise: 1 · A naive consumer credits twice",
                                                             timeout=15_000)
    finally:
        other.close()


def test_leaving_the_class_signs_out_every_browser_of_the_attendee_and_the_rejoin_code_reopens_the_lab(
        class_url, class_code, browser_page):
    """The button on the join page: this browser and a second one that opened her lab with her rejoin
    code are both sent to the join form; the lab stays, and her name with the rejoin code reopens it."""
    from playwright.sync_api import expect
    erin = browser_page
    join_form = re.compile(re.escape(class_url) + r"/join(\?.*)?$")
    submit_join(erin, class_url, "erin", class_code)
    code = erin.locator("[data-rejoin-code]").get_attribute("data-rejoin-code")
    erin.get_by_role("link", name="Open your lab").click()
    lab = erin.locator("[data-classroom-banner] code").first.inner_text()

    other = erin.context.browser.new_context()
    try:
        second = other.new_page()
        submit_join(second, class_url, "erin", class_code, rejoin=code)
        second.get_by_role("link", name="Open your lab").click()
        expect(second.locator("[data-classroom-banner]")).to_contain_text("You are erin")

        erin.goto(f"{class_url}/join")
        erin.get_by_role("button", name="Leave the class").click()
        expect(erin).to_have_url(join_form)
        expect(erin.locator("#join-name")).to_be_visible()
        # Neither browser reaches her lab now: the dashboard sends each to the join form.
        for page in (erin, second):
            page.goto(class_url)
            expect(page).to_have_url(join_form)
            expect(page.locator("[data-classroom-banner]")).to_have_count(0)

        submit_join(erin, class_url, "erin", class_code, rejoin=code)
        erin.get_by_role("link", name="Open your lab").click()
        expect(erin.locator("[data-classroom-banner] code").first).to_have_text(lab)
    finally:
        other.close()
