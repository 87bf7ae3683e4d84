"""Classroom mode in a real browser: the presenter view on one 1280×720 screen, driven by keys, and
every consumer state's colours readable from the back of a room (WCAG AA, computed in Chromium).

Headless Chromium against a real web server thread (CSRF on), the session's PostgreSQL, broker and
lab agent. Screenshots land in test-artifacts/.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from webapp.domain.vocabulary import CONSUMER_STATES

pytestmark = pytest.mark.browser

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
SETTLE = 60_000  # ms: a consumer's first assignment, a crash, a rejoin
EXERCISE = "01_naive_double_credit"
ESSENTIAL = (".present-guide-slot", "#panel-partitions", "#panel-consumers", "#panel-verdict", "#panel-accounts",
             "#panel-timeline")

# WCAG 2.x contrast of every piece of text inside ``root``: its colour against the background it
# is painted on (the nearest backgrounds up the tree, composited over white). Large text (24 px,
# or 18.66 px bold) needs 3:1, the rest 4.5:1.
CONTRAST_JS = """
(root) => {
  const parse = (c) => { const m = c.match(/[\\d.]+/g).map(Number); return [m[0], m[1], m[2], m.length > 3 ? m[3] : 1]; };
  const over = (top, under) => [0, 1, 2].map(i => top[i] * top[3] + under[i] * (1 - top[3])).concat([1]);
  const channel = (v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); };
  const luminance = (c) => 0.2126 * channel(c[0]) + 0.7152 * channel(c[1]) + 0.0722 * channel(c[2]);
  const background = (element) => {
    const layers = [];
    for (let e = element; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
    }
    return layers.reverse().reduce((under, top) => over(top, under), [255, 255, 255, 1]);
  };
  const found = [];
  for (const element of [root, ...root.querySelectorAll("*")]) {
    if (element.closest("select, option, script, style")) continue;
    const own = [...element.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent.trim()).join(" ").trim();
    if (!own || !element.getClientRects().length) continue;
    const style = getComputedStyle(element);
    if (style.visibility === "hidden" || style.display === "none") continue;
    const bg = background(element);
    const fg = over(parse(style.color), bg);
    const [hi, lo] = [luminance(fg), luminance(bg)].sort((a, b) => b - a);
    const size = parseFloat(style.fontSize), bold = parseInt(style.fontWeight, 10) >= 700;
    const large = size >= 24 || (size >= 18.66 && bold);
    found.push({text: own.slice(0, 40), ratio: (hi + 0.05) / (lo + 0.05), needed: large ? 3 : 4.5,
                color: style.color, background: `rgb(${bg.slice(0, 3).map(Math.round).join(", ")})`});
  }
  return found;
}
"""

# A copy of the element at ``selector`` beside it, with ``old_class`` swapped for ``new_class`` on
# it and its descendants (or, with no ``old_class``, its class set to ``new_class``): the contrast
# of its text, measured as above, then the copy removed (one synchronous call: a panel refresh
# cannot come in between).
RESTYLED_CONTRAST_JS = f"""
([selector, oldClass, newClass]) => {{
  const contrast = {CONTRAST_JS};
  const real = document.querySelector(selector);
  if (!real) throw new Error("no element " + selector);
  const copy = real.cloneNode(true);
  if (oldClass) {{
    for (const e of [copy, ...copy.querySelectorAll("." + oldClass)]) {{
      if (e.classList.contains(oldClass)) e.classList.replace(oldClass, newClass);
    }}
  }} else {{
    copy.className = newClass;
  }}
  real.after(copy);
  try {{ return contrast(copy); }} finally {{ copy.remove(); }}
}}
"""

# Every visible piece of text under ``root``: its font size in px and its length.
TEXT_SIZES_JS = """
(root) => [...document.querySelector(root).querySelectorAll("*")]
  .filter(e => !e.closest("[hidden], .present-sql, select, option, script, style") && e.getClientRects().length)
  .map(e => [e, [...e.childNodes].filter(n => n.nodeType === 3).map(n => n.textContent.trim()).join(" ").trim()])
  .filter(([e, own]) => own && getComputedStyle(e).visibility !== "hidden")
  .map(([e, own]) => ({text: own.slice(0, 40), size: parseFloat(getComputedStyle(e).fontSize), chars: own.length}))
"""
# The presenter's main lines, 24 px or more: the exercise and its step, the next step's note, each
# panel's title, the verdict, the amounts, the consumers' names and counts.
PRESENTER_MAIN_TEXT = (".present-title", ".present-notes li:not([hidden]) b", ".present-notes li:not([hidden]) .note-text",
                       "#present .panel h2", "#panel-verdict .headline", "#panel-accounts td.num",
                       "#panel-consumers .consumer .name", "#panel-consumers .counts b")


def screenshot(page, name: str, full_page: bool = False) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=full_page)


def join(page, url: str, name: str, code: str) -> None:
    from playwright.sync_api import expect
    page.goto(f"{url}/join")
    page.fill("#join-name", name)
    page.fill("#join-code", code)
    page.get_by_role("button", name="Join").click()
    expect(page.locator("[data-rejoin-code]")).to_be_visible()   # shown once, then the lab
    page.get_by_role("link", name="Open your lab").click()
    expect(page.locator("[data-classroom-banner]")).to_contain_text(f"You are {name}")


def press_next(page, label: str) -> None:
    """The presenter's → key: the next step runs on the agent; wait until the line says ``label``."""
    from playwright.sync_api import expect
    page.keyboard.press("ArrowRight")
    guide = page.locator("#present-guide")
    expect(guide.locator("[data-step-label]")).to_have_text(label, timeout=SETTLE)
    expect(guide).to_have_attribute("data-busy", "false", timeout=SETTLE)


def test_the_presenter_view_fits_one_1280x720_screen_and_keys_drive_the_exercise(class_url, class_code,
                                                                                   browser_page):
    from playwright.sync_api import expect
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 720})
    join(page, class_url, "Ana", class_code)
    page.goto(f"{class_url}/scenarios/")
    page.locator(f'[data-scenario="{EXERCISE}"]').get_by_role("button", name="Start").click()
    # The fresh lab is prepared from the exercise's page: while the lab is wiped, a live page of it
    # is told so (503 from /live), which the browser logs as an error.
    page.locator("#next-step").click()
    expect(page.locator('[data-step="0"]')).to_have_class("ok", timeout=SETTLE)

    page.goto(f"{class_url}/present")
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    expect(page.locator("#present-guide .present-title")).to_have_text("1 · A naive consumer credits twice")
    expect(page.locator("#present-guide [data-step-label]")).to_have_text("step 0 of 8")
    press_next(page, "step 1 of 8")        # start c1
    press_next(page, "step 2 of 8")        # wait until it is assigned
    press_next(page, "step 3 of 8")        # arm the crash
    press_next(page, "step 4 of 8")        # publish the credit
    press_next(page, "step 5 of 8")        # wait until c1 crashed
    card = page.locator("#panel-consumers [data-consumer]")
    expect(card).to_have_attribute("data-state", "crashed", timeout=SETTLE)
    expect(page.locator('#panel-partitions .strip .cell[data-offset="0"]')).to_have_count(1)
    expect(page.locator('#panel-accounts tr[data-account="acc-1"] [data-actual]')).to_have_text("100.00")
    expect(page.locator('[data-note="6"]')).to_be_visible()  # the next step's note: wait for the balance
    screenshot(page, "present-1280x720")

    # One screen: nothing to scroll, nothing cut inside a panel, and every essential panel entirely
    # inside the viewport.
    scroll = page.evaluate("[document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
    assert scroll[0] <= 1280 and scroll[1] <= 720, f"the presenter view scrolls: {scroll}"
    cut = page.evaluate("""() => [...document.querySelectorAll('#present .panel, #present .present-guide')]
        .filter(e => e.scrollHeight > e.clientHeight + 1).map(e => e.id || e.className)""")
    assert not cut, f"panels whose content is cut: {cut}"
    # (Measured in one go in the page: panels replace themselves when they refresh.)
    boxes = page.evaluate("""(selectors) => Object.fromEntries(selectors.map(s => {
        const r = document.querySelector(s).getBoundingClientRect();
        return [s, [r.left, r.top, r.right, r.bottom]]; }))""", list(ESSENTIAL))
    for selector, (left, top, right, bottom) in boxes.items():
        assert left >= 0 and top >= 0 and right <= 1280 and bottom <= 720, f"{selector} is off the screen: {boxes}"
    # Large type, readable from the back of a room: every text at least 20 px, the main lines 24 px.
    texts = page.evaluate(TEXT_SIZES_JS, "#present")
    small = [t for t in texts if t["size"] < 20]
    assert not small, f"text under 20 px on the presenter view: {small}"
    main_lines = page.evaluate("""(selectors) => selectors.map(s => [s, [...document.querySelectorAll(s)]
        .filter(e => e.getClientRects().length).map(e => parseFloat(getComputedStyle(e).fontSize))])""",
                               list(PRESENTER_MAIN_TEXT))
    for selector, sizes in main_lines:
        assert sizes and min(sizes) >= 24, f"{selector}: {sizes} px, wanted 24 px or more"
    at_24 = sum(t["chars"] for t in texts if t["size"] >= 24) / sum(t["chars"] for t in texts)
    assert at_24 >= 0.4, f"only {at_24:.0%} of the presenter's text is at 24 px or more"

    # ← shows the step before (no request), → comes back to the current note, S toggles the SQL.
    page.keyboard.press("ArrowLeft")
    expect(page.locator('[data-note="5"]')).to_be_visible()
    expect(page.locator('[data-note="6"]')).to_be_hidden()
    page.keyboard.press("ArrowRight")
    expect(page.locator('[data-note="6"]')).to_be_visible()
    expect(page.locator("#present-guide [data-step-label]")).to_have_text("step 5 of 8")
    sql = page.locator("#present-sql")
    expect(sql).to_be_hidden()
    page.keyboard.press("s")
    expect(sql).to_be_visible()
    expect(sql).to_contain_text("UPDATE accounts SET balance = balance +")
    page.keyboard.press("s")
    expect(sql).to_be_hidden()


STATES = ("running", "frozen", "stepping", "killed", "stopped")


def test_every_consumer_state_keeps_its_text_readable_and_notices_use_the_consumers_name(serve_app, lab,
                                                                                           browser_page):
    from playwright.sync_api import expect
    page = browser_page
    page.set_viewport_size({"width": 1280, "height": 900})
    url = serve_app()
    page.goto(url)
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")
    # One consumer per state, each in a group of its own (each is assigned every partition).
    ids = {state: lab.start_consumer(group=f"g_{state}")["consumer_id"] for state in STATES}
    for consumer_id in ids.values():
        lab.wait_assigned(consumer_id, timeout=60)
    lab.post(f"/consumers/{ids['stepping']}/step-mode", {"on": True})
    lab.credit("acc-1", 100)
    lab.wait_state(ids["stepping"], "stepping")
    lab.post(f"/consumers/{ids['killed']}/kill")
    lab.post(f"/consumers/{ids['stopped']}/stop")
    # Freeze from the card's button: the notice names the consumer as its card does.
    frozen_card = page.locator(f'[data-consumer="{ids["frozen"]}"]')
    name = frozen_card.locator(".name").inner_text()
    frozen_card.get_by_role("button", name="Freeze").click()
    # The notice comes back with the POST, once the agent has frozen the process: a command round trip.
    expect(page.locator("#notices")).to_contain_text(f"Consumer {name} frozen", timeout=SETTLE)
    try:
        failures = []
        for state, consumer_id in ids.items():
            card = page.locator(f'[data-consumer="{consumer_id}"]')
            expect(card).to_have_attribute("data-state", state, timeout=SETTLE)
            # Found and measured in one script: a refresh may replace the card at any moment, and a
            # detached one has no text on screen to measure (it would pass, having checked nothing).
            measured = page.evaluate(f"(selector) => ({CONTRAST_JS})(document.querySelector(selector))",
                                     f'[data-consumer="{consumer_id}"]')
            assert measured, f"no text measured on the {state} consumer's card"
            for item in measured:
                if item["ratio"] < item["needed"]:
                    failures.append(f"{state}: {item['text']!r} {item['color']} on {item['background']} "
                                    f"= {item['ratio']:.2f} < {item['needed']}")
        # The states no consumer is put in here (starting, crashed, failed, gone), the verdict's
        # headline and rows in each of their styles, and every outcome's cell in the partition
        # legend: the page's own elements, restyled in place (the stylesheet is what is checked).
        running_card = f'[data-consumer="{ids["running"]}"]'
        variants = [(running_card, "state-running", f"state-{state}") for state in CONSUMER_STATES]
        variants += [("#panel-verdict .headline", None, f"headline {style}") for style in ("neutral", "ok", "bad")]
        variants += [("#panel-verdict dl.verdict > div", None, style) for style in ("", "bad", "good", "neutral")]
        variants += [("#panel-partitions .legend", None, "legend")]
        for selector, old_class, new_class in variants:
            for item in page.evaluate(RESTYLED_CONTRAST_JS, [selector, old_class, new_class]):
                if item["ratio"] < item["needed"]:
                    failures.append(f"{selector} as {new_class!r}: {item['text']!r} {item['color']} on "
                                    f"{item['background']} = {item['ratio']:.2f} < {item['needed']}")
        screenshot(page, "dashboard-consumer-states-1280", full_page=True)
        assert not failures, "\n".join(failures)
    finally:
        lab.post(f"/consumers/{ids['frozen']}/stop")
        lab.post(f"/consumers/{ids['stepping']}/stop")


def test_a_presenter_refused_a_stream_polls_its_step_line_and_panels(serve_app, agent, app_factory, class_code,
                                                                     browser_page):
    """Past the server's cap of live streams the presenter's stream is refused: the page says it
    polls, and what the attendee does in another tab (a credit, an exercise started) reaches its
    panels and its step line with no stream and no reload."""
    from playwright.sync_api import expect

    from support import CLASS_TOKEN, drop_class_labs
    url = serve_app(LAB_CLASS_CODE=class_code, LAB_TOKEN=CLASS_TOKEN, LIVE_STREAMS_PER_WORKER=0)
    try:
        page = browser_page
        join(page, url, "Ana", class_code)
        presenter = page.context.new_page()
        requested = []
        presenter.on("request", lambda request: requested.append(request.url.split("?", 1)[0]))
        presenter.goto(f"{url}/present")
        expect(presenter.locator("#live-indicator")).to_have_attribute("data-mode", "poll")
        expect(presenter.locator("#present-guide .present-step")).to_have_text("no exercise running")

        page.goto(url)
        form = page.locator("#form-publish")
        form.locator("[name=account_id]").select_option("acc-3")
        form.locator("[name=amount]").fill("7.00")
        form.get_by_role("button", name="Publish").click()
        expect(page.locator("#form-publish .banner.ok")).to_contain_text("Published 1 normal record", timeout=15_000)
        expect(presenter.locator('#panel-accounts tr[data-account="acc-3"] [data-expected]')).to_have_text(
            "7.00", timeout=15_000)

        page.goto(f"{url}/scenarios/")
        page.locator(f'[data-scenario="{EXERCISE}"]').get_by_role("button", name="Start").click()
        expect(presenter.locator("#present-guide .present-title")).to_have_text(
            "1 · A naive consumer credits twice", timeout=15_000)
        assert f"{url}/present/guide" in requested and f"{url}/live" in requested, requested
        assert requested.count(f"{url}/present/stream") == 1, "the page asked again for the stream it was refused"
    finally:
        drop_class_labs(app_factory(), class_code)
