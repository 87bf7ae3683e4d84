"""Abuse: the security headers on every response, the Content-Security-Policy without inline
script, the session cookie's flags, and the limit on wrong tokens (sign-in and Bearer).

The routes are read from the app's URL map, so a route added later is checked too; the requests
carry no token, so no control runs (every POST is refused before its view)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from webapp.domain.waits import wait_until
from webapp.web.headers import SECURITY_HEADERS
from webapp.web.ratelimit import FailureLimiter

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
TOKEN = "s3cret-token-of-the-lab"
# A value for each path parameter: real ones where a page needs them, a harmless word otherwise.
SAMPLE_VALUES = {"filename": "css/lab.css", "name": "status", "group": "payments", "verb": "stop",
                 "event_id": "00000000-0000-4000-8000-000000000000"}
# Markup the CSP refuses: inline script, inline event handlers, htmx's evaluated attributes, inline style.
INLINE = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>|<style\b|\son[a-z]+\s*=\s*[\"']|\shx-on[:-]|\shx-vars=|"
                    r"\sstyle\s*=\s*[\"']", re.IGNORECASE)
JINJA_TAGS = re.compile(r"\{#.*?#\}|\{%.*?%\}", re.DOTALL)  # comments and statements: not markup


def csp_directives(policy: str) -> dict[str, list[str]]:
    return {name: values for name, *values in (part.split() for part in policy.split(";") if part.strip())}


def sample_path(rule) -> str:
    values = {arg: 1 if type(converter).__name__ == "IntegerConverter" else SAMPLE_VALUES.get(arg, "sample")
              for arg, converter in rule._converters.items()}
    return rule.build(values, append_unknown=False)[1]


def docs_page_policy_as_the_labs(policy: str | None) -> str | None:
    """A page of the built docs (/docs/, webapp/web/docs.py) adds to the lab's policy its own inline
    scripts' hashes and data: images, nothing else: without them it must be the lab's policy."""
    if policy is None:
        return None
    return re.sub(r" 'sha256-[A-Za-z0-9+/=]+'", "", policy).replace("img-src 'self' data:", "img-src 'self'", 1)


def assert_security_headers(response, what: str, path: str = "") -> None:
    for name, value in SECURITY_HEADERS.items():
        given = response.headers.get(name)
        if name == "Content-Security-Policy" and path.startswith("/docs/"):
            given = docs_page_policy_as_the_labs(given)
        assert given == value, f"{what} -> {response.status_code}: {name} is {response.headers.get(name)!r}"
    assert "Strict-Transport-Security" not in response.headers, f"{what}: HSTS over plain HTTP"


@pytest.fixture
def guarded_app(app_factory, lab, lab_name):
    """The lab's app as an instructor exposes it: LAB_TOKEN set, CSRF on."""
    return app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN, WTF_CSRF_ENABLED=True)


@pytest.fixture
def limited_app(app_factory, lab, lab_name):
    """LAB_TOKEN set, 3 wrong tokens per 2 s (CSRF off: these requests are about the token)."""
    return app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN, SIGN_IN_MAX_FAILURES=3, SIGN_IN_WINDOW_SECONDS=2.0)


def test_every_route_answers_with_the_security_headers(guarded_app):
    client = guarded_app.test_client()
    checked = []
    for rule in guarded_app.url_map.iter_rules():
        path = sample_path(rule)
        for method in sorted(rule.methods - {"HEAD", "OPTIONS"}):
            response = client.open(path, method=method)
            assert response.status_code < 500, f"{method} {path} -> {response.status_code}"
            assert_security_headers(response, f"{method} {path}", path)
            if method == "POST" and rule.endpoint != "auth.sign_in":
                refused = response.status_code in (302, 401) or b"CSRF check failed" in response.data
                assert refused, f"{method} {path} -> {response.status_code}: it ran without the token"
            checked.append(f"{method} {path}")
            response.close()
    # The 4xx answers the app makes itself: nothing there, a method not allowed, a wrong token, no CSRF token.
    for method, path, status in [("GET", "/no/such/page", 404), ("GET", "/api/v1/nothing", 404),
                                 ("GET", "/api/v1/publish", 405), ("POST", "/sign-in", 400)]:
        response = client.open(path, method=method)
        assert response.status_code == status, f"{method} {path}"
        assert_security_headers(response, f"{method} {path}")
    response = client.post("/api/v1/publish", json={}, headers={"Authorization": "Bearer wrong"})
    assert response.status_code == 401
    assert_security_headers(response, "POST /api/v1/publish with a wrong Bearer token")
    assert len(checked) >= 60, checked


def test_the_csp_allows_no_inline_script_no_eval_and_no_framing(client):
    response = client.get("/healthz")
    directives = csp_directives(response.headers["Content-Security-Policy"])
    assert directives["script-src"] == ["'self'"]
    assert directives["style-src"] == ["'self'"]
    assert directives["default-src"] == ["'self'"]
    assert directives["frame-ancestors"] == ["'none'"]
    assert directives["object-src"] == ["'none'"]
    assert not any("unsafe" in value or value == "*" for values in directives.values() for value in values)


def markup_of(template: str) -> str:
    """The template without its {# comments #} and {% statements %} (newlines kept: lines still count)."""
    return JINJA_TAGS.sub(lambda comment: "\n" * comment.group(0).count("\n"), template)


def test_no_template_carries_inline_script_style_or_handlers():
    found = [f"{path.relative_to(TEMPLATES)}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0).strip()}"
             for path in sorted(TEMPLATES.rglob("*.html"))
             for text in [markup_of(path.read_text(encoding="utf-8"))]
             for match in INLINE.finditer(text)]
    assert found == [], "refused by the Content-Security-Policy (move it to static/js or static/css):\n" \
                        + "\n".join(found)


def test_every_page_turns_off_what_htmx_would_inline(client, lab):
    # htmx reads the first htmx-config meta only: each page's must keep inline style and eval off.
    for path in ("/", "/scenarios/", "/api/v1/docs"):
        page = client.get(path).get_data(as_text=True)
        first = re.search(r"<meta name=\"htmx-config\" content='([^']*)'", page)
        assert first, f"{path} has no htmx-config"
        config = json.loads(first.group(1))
        assert config["includeIndicatorStyles"] is False and config["allowEval"] is False, path
        assert "style" not in config["attributesToSettle"], path  # htmx would copy it with setAttribute
        assert not INLINE.search(page), f"{path}: {INLINE.search(page).group(0)}"


# --- the session cookie -------------------------------------------------------------------------------

def session_cookie(response) -> str:
    cookies = [value for value in response.headers.getlist("Set-Cookie") if value.startswith("session=")]
    assert cookies, response.headers
    return cookies[0]


def test_the_session_cookie_is_httponly_and_samesite_lax(app_factory, lab_name):
    client = app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN).test_client()
    cookie = session_cookie(client.post("/sign-in", data={"token": TOKEN, "next": "/"}))
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert "Secure" not in cookie  # plain HTTP: a Secure cookie would never come back


def test_over_https_the_cookie_is_secure_and_hsts_is_sent(app_factory, lab_name):
    client = app_factory(LAB_NAME=lab_name, LAB_TOKEN=TOKEN, LAB_HTTPS=1).test_client()
    response = client.post("/sign-in", data={"token": TOKEN, "next": "/"}, base_url="https://lab.example")
    cookie = session_cookie(response)
    assert "Secure" in cookie and "HttpOnly" in cookie and "SameSite=Lax" in cookie
    assert response.headers["Strict-Transport-Security"].startswith("max-age=")


# --- wrong tokens: limited per client address -------------------------------------------------------------

class ManualClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_limiter_counts_failures_in_a_sliding_window():
    clock = ManualClock()
    limiter = FailureLimiter(limit=3, window=60, clock=clock)
    for seconds in (0, 10, 20):
        clock.now = 1000 + seconds
        assert limiter.retry_after("a") == 0
        limiter.record_failure("a")
    assert limiter.retry_after("a") == 40      # the first failure leaves the window at 1060
    assert limiter.retry_after("b") == 0       # per address
    clock.now = 1059.5
    assert limiter.retry_after("a") == 1       # whole seconds, rounded up, never 0 while refused
    clock.now = 1060
    assert limiter.retry_after("a") == 0       # one failure left the window: one more try
    limiter.record_failure("a")
    assert limiter.retry_after("a") == 10
    limiter.forget("a")
    assert limiter.retry_after("a") == 0


def test_the_limiter_remembers_a_bounded_number_of_addresses():
    limiter = FailureLimiter(limit=1, window=60, clock=ManualClock(), max_keys=100)
    for number in range(1000):
        limiter.record_failure(f"10.0.{number // 256}.{number % 256}")
    assert limiter.retry_after("10.0.3.231") == 60          # the latest are kept
    assert limiter.retry_after("10.0.0.0") == 0             # the oldest were forgotten
    assert len(limiter._failures) == 100


@pytest.mark.parametrize("limit, window", [(0, 60), (5, 0)])
def test_the_limiter_refuses_a_limit_that_limits_nothing(limit, window):
    with pytest.raises(ValueError):
        FailureLimiter(limit, window)


def test_wrong_sign_ins_are_limited_and_the_right_token_works_after_the_window(limited_app):
    client = limited_app.test_client()
    for _ in range(3):
        assert client.post("/sign-in", data={"token": "guess"}).status_code == 401
    refused = client.post("/sign-in", data={"token": "guess"})
    assert refused.status_code == 429
    assert 1 <= int(refused.headers["Retry-After"]) <= 2
    assert "Too many wrong tokens from your address" in refused.get_data(as_text=True)
    assert_security_headers(refused, "429 sign-in")
    # While refused, the token is not even compared: the right one is refused too.
    assert client.post("/sign-in", data={"token": TOKEN}).status_code == 429
    # Another address is not affected (the limit is per address, whatever X-Forwarded-For says).
    other = limited_app.test_client()
    other.environ_base["REMOTE_ADDR"] = "10.1.2.3"
    assert other.post("/sign-in", data={"token": TOKEN, "next": "/"}).status_code == 302
    forged = client.post("/sign-in", data={"token": TOKEN}, headers={"X-Forwarded-For": "10.9.9.9"})
    assert forged.status_code == 429
    wait_until(lambda: client.post("/sign-in", data={"token": TOKEN, "next": "/"}).status_code == 302,
               timeout=10, message="the right token was still refused after the window")
    # Signed in: the controls answer, and the failures were forgotten.
    assert client.get("/api/v1/state").status_code == 200
    assert limited_app.extensions["token_guesses"].retry_after("127.0.0.1") == 0


def test_wrong_bearer_tokens_are_limited_with_a_json_answer(limited_app):
    client = limited_app.test_client()
    wrong = {"Authorization": "Bearer guess"}
    for _ in range(3):
        assert client.post("/api/v1/ttl/cleanup", json={}, headers=wrong).status_code == 401
    refused = client.post("/api/v1/ttl/cleanup", json={}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 429
    body = refused.get_json()
    assert body["retry_after"] == int(refused.headers["Retry-After"]) and body["retry_after"] >= 1
    assert "Too many wrong tokens" in body["error"]
    # Reading needs no token and is never limited.
    assert client.get("/api/v1/state").status_code == 200


def test_failures_are_counted_per_address_and_a_right_answer_clears_them():
    clock = ManualClock()
    limiter = FailureLimiter(limit=2, window=60, clock=clock)
    limiter.record_failure("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 0          # one failure: still below the limit
    limiter.record_failure("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 60         # the address waits, whatever cookie it sends
    assert limiter.retry_after("10.0.0.2") == 0          # per address
    clock.now += 61
    assert limiter.retry_after("10.0.0.1") == 0          # the window slid past both failures
    limiter.record_failure("10.0.0.1")
    limiter.forget("10.0.0.1")
    limiter.record_failure("10.0.0.1")
    assert limiter.retry_after("10.0.0.1") == 0, "a right answer cleared the earlier failure"


# --- request size -------------------------------------------------------------------------------------

def test_a_request_body_over_max_content_length_is_refused_with_413_in_the_house_style(app_factory, lab_name):
    assert app_factory(LAB_NAME=lab_name).config["MAX_CONTENT_LENGTH"] == 1024 * 1024   # the default: 1 MiB
    client = app_factory(LAB_NAME=lab_name, MAX_CONTENT_LENGTH=1024).test_client()
    api = client.post("/api/v1/publish", json={"account_id": "acc-1", "amount_cents": 100, "pad": "x" * 2000})
    assert api.status_code == 413 and "MAX_CONTENT_LENGTH" in api.get_json()["error"], api.get_data()
    assert_security_headers(api, "413 API")
    form = client.post("/controls/publish", data={"account_id": "acc-1", "amount": "1", "pad": "x" * 2000})
    assert form.status_code == 413 and form.mimetype == "text/html"
    assert "larger than this lab accepts (1,024 bytes, MAX_CONTENT_LENGTH)" in form.get_data(as_text=True)
