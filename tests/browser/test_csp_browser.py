"""The Content-Security-Policy in a real browser: the dashboard and the exercises pages load and
keep refreshing with it on, and Chromium reports no violation (no inline script or style, no eval).

A listener added before any page script records every ``securitypolicyviolation`` event; the
``browser_page`` fixture also fails the test on any console error, which is where Chromium
writes "Refused to ..." for each violation. One deliberate inline script at the end shows the
listener and the policy do work: it is refused, and reported.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.browser

RECORD_VIOLATIONS = """
window.cspViolations = [];
document.addEventListener("securitypolicyviolation", function (event) {
  window.cspViolations.push(event.violatedDirective + " " + (event.blockedURI || "inline") + " "
                            + (event.sourceFile || "") + ":" + event.lineNumber);
});
"""


@pytest.fixture
def csp_page(browser_page):
    browser_page.add_init_script(RECORD_VIOLATIONS)
    return browser_page


def violations(page) -> list[str]:
    return page.evaluate("window.cspViolations")


def test_the_dashboard_refreshes_under_the_csp_without_violations(serve_app, lab, csp_page):
    from playwright.sync_api import expect
    page = csp_page
    url = serve_app()
    response = page.goto(url)
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator("#live-indicator")).to_have_attribute("data-state", "live")  # live-refresh.js polls /live
    # A style attribute set through the CSSOM (allowed; a script or the browser may leave one, even
    # empty): settling the swap, htmx would copy it onto the new panel with setAttribute("style"),
    # an inline style the policy refuses, unless "style" is out of its attributesToSettle.
    page.evaluate("""() => { const panel = document.getElementById("panel-accounts");
                             panel.style.outline = "1px solid transparent"; panel.style.outline = ""; }""")
    assert page.evaluate("document.getElementById('panel-accounts').hasAttribute('style')")
    # A credit published behind the page's back: htmx fetches the panels whose fingerprint changed.
    lab.credit("acc-2", 4200)
    expect(page.locator('#panel-accounts tr[data-account="acc-2"] [data-expected]')).to_have_text("42.00",
                                                                                                   timeout=10_000)
    expect(page.locator('#panel-verdict [data-verdict="not_yet_applied"]')).to_have_text("1", timeout=10_000)
    # An htmx POST from a form (the X-CSRFToken header comes from hx-headers, parsed as JSON, not eval).
    form = page.locator("#form-publish")
    form.locator("[name=account_id]").select_option("acc-3")
    form.locator("[name=amount]").fill("7.00")
    form.get_by_role("button", name="Publish").click()
    expect(page.locator("#form-publish .banner.ok")).to_contain_text("Published 1 normal record", timeout=15_000)
    expect(page.locator('#panel-accounts tr[data-account="acc-3"] [data-expected]')).to_have_text("7.00",
                                                                                                   timeout=10_000)
    # The stylesheet applies, and nothing injected a <style> (htmx would, with includeIndicatorStyles on).
    expect(page.locator(".topbar")).to_have_css("display", "flex")
    assert page.locator("head style").count() == 0, "htmx (or a script) injected a <style>"
    assert violations(page) == []

    # The policy is really enforced, and the listener hears it: an inline script is refused.
    page.evaluate("""() => { const script = document.createElement("script");
                             script.textContent = "window.inlineRan = true"; document.body.append(script); }""")
    page.wait_for_function("window.cspViolations.length > 0", timeout=5_000)
    assert page.evaluate("window.inlineRan === undefined")
    assert violations(page)[0].startswith("script-src")
    refused = [line for line in page.console_errors if "Content Security Policy" in line]
    assert len(refused) == 1, page.console_errors
    page.console_errors.remove(refused[0])


def test_the_exercises_pages_work_under_the_csp_without_violations(serve_app, agent, csp_page):
    from playwright.sync_api import expect
    page = csp_page
    url = serve_app()
    page.goto(f"{url}/scenarios/")
    # scenarios.css (was an inline <style>): the catalogue is a grid.
    expect(page.locator(".catalogue")).to_have_css("display", "grid")
    card = page.locator('[data-scenario="01_naive_double_credit"]')
    card.get_by_role("button", name="Start").click()
    # The run page polls its live section with htmx (hx-trigger "load, every 1s").
    expect(page.locator("#live")).not_to_be_empty(timeout=15_000)
    expect(page.locator("#next-step")).to_have_text("Prepare a fresh lab")
    # The page's stylesheet may apply a moment after the first paint: wait for the grid it lays out.
    expect(page.locator(".guided")).to_have_css("display", "grid")
    assert page.locator("head style").count() == 0
    assert violations(page) == []
