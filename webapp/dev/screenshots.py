"""``make screenshots``: the documentation's screenshots, taken in real Chromium from a running lab.

Starts a private stack the way `make run` does (embedded PostgreSQL and Tansu, one lab agent, the
web app under gunicorn) in classroom mode, then, as people would: an attendee joins and steps
through exercise 1 in guided mode; the instructor signs in, opens the board and presents the
attendee's lab mid-exercise; the attendee finishes and sees the verdict. Writes docs/images/, each
picture at 1280×720 (a projector's screen):

- ``presenter-exercise-1.png``  the presenter view at 1280×720, the consumer crashed before its commit;
- ``board.png``                 the instructor's board, /class;
- ``exercise-1-verdict.png``    the guided run's page after its last step: every expectation checked;
- ``dashboard.png``             the attendee's dashboard after the exercise: the credit applied twice.

Needs Chromium at /usr/bin/chromium (Debian's `chromium`, as the browser tests) and the `test`
extra (Playwright), both installed by `make install` / `.ci/run`.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from ..domain.waits import free_port
from .stack import ROOT, Stack

IMAGES = ROOT / "docs" / "images"
CHROMIUM = "/usr/bin/chromium"
EXERCISE = "01_naive_double_credit"
CLASS_CODE = "docs-class"
TOKEN = "docs-screenshots-token"   # a private stack on loopback, gone when the script ends
FINISHED = ("passed", "failed", "not-run", "error")
STEP_TIMEOUT_MS = 120_000


def click_next_step(page) -> str:
    """Press "Next step" and wait until the step has run; the run's status after it."""
    before = page.get_attribute("#guide", "data-progress")
    page.click("#next-step")
    page.wait_for_function(
        "before => { const g = document.querySelector('#guide');"
        " return g && g.dataset.busy === 'false' && g.dataset.progress !== before; }",
        arg=before, timeout=STEP_TIMEOUT_MS)
    return page.get_attribute("[data-run-status]", "data-run-status")


def take(base: Path, url: str) -> None:
    from playwright.sync_api import sync_playwright

    IMAGES.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        # --no-sandbox: Chromium refuses to run as root with its sandbox (CI and these machines run as root).
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            # Every picture at 1280×720: a projector's screen, as the pages are designed for.
            attendee = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
            attendee.goto(f"{url}/join")
            attendee.fill("#join-name", "Ana")
            attendee.fill("#join-code", CLASS_CODE)
            attendee.click("button.primary")
            attendee.wait_for_url(lambda address: "/join" not in address, timeout=120_000)

            attendee.goto(f"{url}/scenarios/")
            attendee.click(f'li[data-scenario="{EXERCISE}"] button[type=submit]')
            attendee.wait_for_selector("#next-step", timeout=STEP_TIMEOUT_MS)
            for _ in range(6):   # the fresh lab, then steps 1-5: c1 has crashed after its effect
                click_next_step(attendee)

            instructor = browser.new_context(viewport={"width": 1280, "height": 720}).new_page()
            instructor.goto(f"{url}/sign-in")
            instructor.fill("#token", TOKEN)
            instructor.click("button[type=submit]")
            instructor.goto(f"{url}/class")
            instructor.wait_for_selector("button[name=to][value=present]", timeout=60_000)
            instructor.screenshot(path=str(IMAGES / "board.png"))
            instructor.click("button[name=to][value=present]")
            instructor.wait_for_url("**/present**", timeout=60_000)
            instructor.wait_for_selector("#live-indicator[data-state=live]", timeout=60_000)
            instructor.screenshot(path=str(IMAGES / "presenter-exercise-1.png"))

            status = "running"
            while status not in FINISHED:
                status = click_next_step(attendee)
            attendee.wait_for_selector("#expectations", timeout=60_000)
            attendee.evaluate("window.scrollTo(0, 0)")   # the expectations sit at the top, beside the lesson
            attendee.screenshot(path=str(IMAGES / "exercise-1-verdict.png"))
            attendee.goto(f"{url}/")
            attendee.wait_for_selector("#live-indicator[data-state=live]", timeout=60_000)
            attendee.screenshot(path=str(IMAGES / "dashboard.png"))
            print(f"exercise 1: {status}; screenshots in {IMAGES.relative_to(ROOT)}/")
        finally:
            browser.close()


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="lab-screenshots-"))
    port = free_port()
    with Stack(base, env={"LAB_CLASS_CODE": CLASS_CODE, "LAB_TOKEN": TOKEN, "LAB_PORT": str(port),
                          "LAB_BROKER_KIND": "tansu"}) as stack:
        stack.start_web("127.0.0.1", port, "web.log")
        take(base, f"http://127.0.0.1:{port}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
