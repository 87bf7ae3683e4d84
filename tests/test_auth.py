"""Sign-in and sign-out (webapp/web/auth.py): ``next`` stays on this site, sign-out clears the
session, and a session is tied to the token it signed in with, so changing LAB_TOKEN signs every
browser out. The web app over its test client; no lab is needed (no control runs)."""
from __future__ import annotations

import re

import pytest

from webapp.web.auth import safe_next
from webapp.web.security import SIGNED_IN

TOKEN = "s3cret-token-of-the-lab"
# Any POST shows whether the session is signed in: signed in, this one leaves a view (303 to the
# dashboard); signed out, every POST is sent to sign in first (302).
PROBE = "/labs/view/leave"


@pytest.mark.parametrize("target", [
    "/\\evil.com", "\\/evil.com", "/\\/evil.com", "//evil.com", "///evil.com", "/a//evil.com",
    "https://evil.com", "javascript:alert(1)", "evil.com", "", None,
    "/\t/evil.com", "/\n/evil.com", "/ /evil.com", "/class\r\nSet-Cookie: x=1", "/\x00", "/\x7f", "/\u0085x",
])
def test_next_outside_this_site_falls_back_to_the_dashboard(app_factory, lab_name, target):
    with app_factory(LAB_NAME=lab_name).test_request_context():
        assert safe_next(target) == "/"


def test_next_within_this_site_is_followed(app_factory, lab_name):
    with app_factory(LAB_NAME=lab_name).test_request_context():
        for target in ("/class", "/scenarios/runs/3?tab=live#guide", "/present", "/a:b"):
            assert safe_next(target) == target
    client = app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN).test_client()
    assert client.post("/sign-in", data={"token": TOKEN, "next": "/\\evil.com"}).location == "/"
    assert client.post("/sign-in", data={"token": TOKEN, "next": "/class"}).location == "/class"


def csrf_token(page: str) -> str:
    return re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)


def test_sign_out_is_a_post_with_csrf_that_clears_the_session(app_factory, lab_name):
    app = app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN, WTF_CSRF_ENABLED=True)
    client = app.test_client()
    page = client.get("/sign-in").get_data(as_text=True)
    assert "data-sign-out" not in page                      # signed out: no button
    assert client.post("/sign-in", data={"token": TOKEN, "csrf_token": csrf_token(page)}).status_code == 302
    page = client.get("/sign-in").get_data(as_text=True)
    assert "data-sign-out" in page                          # signed in: the header offers it
    with client.session_transaction() as session:
        assert TOKEN not in str(dict(session)), "the session must hold a digest, never the token"
        session["attendee_name"] = "Ana"
    assert client.get("/sign-out").status_code == 405
    assert client.post("/sign-out").status_code == 400      # no CSRF token: refused
    signed_out = client.post("/sign-out", data={"csrf_token": csrf_token(page)})
    assert signed_out.status_code == 303 and signed_out.location == "/"
    with client.session_transaction() as session:
        assert SIGNED_IN not in session and "attendee_name" not in session
    assert "data-sign-out" not in client.get("/sign-in").get_data(as_text=True)


def test_changing_lab_token_signs_every_browser_out(app_factory, lab_name):
    before = app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN)
    browser = before.test_client()
    assert browser.post("/sign-in", data={"token": TOKEN}).status_code == 302
    assert browser.post(PROBE).status_code == 303
    cookie = browser.get_cookie("session").value

    # The same server, the same SECRET_KEY, a new LAB_TOKEN: the browser's cookie no longer signs it in.
    after = app_factory(LAB_NAME=lab_name, LAB_TOKEN="a-new-token-of-the-lab")
    same_browser = after.test_client()
    same_browser.set_cookie("session", cookie)
    refused = same_browser.post(PROBE)
    assert refused.status_code == 302 and "/sign-in" in refused.location
    assert "data-sign-out" not in same_browser.get("/sign-in").get_data(as_text=True)
    # ... and a session signed in before digests existed is signed out too.
    legacy = before.test_client()
    with legacy.session_transaction() as session:
        session["lab_token_ok"] = True
    assert legacy.post(PROBE).status_code == 302
    # With the old token back, the old cookie works again: the digest is of the token, not a random id.
    again = app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN).test_client()
    again.set_cookie("session", cookie)
    assert again.post(PROBE).status_code == 303
