"""CSRF protection for forms and the optional LAB_TOKEN that guards the controls.

Forms carry a CSRF token (Flask-WTF). The JSON API is exempt from the token but accepts a
state-changing request only with ``Content-Type: application/json``, which a cross-site
form cannot send without a CORS preflight this app never grants. When LAB_TOKEN is set,
every POST needs it: the browser through a one-time sign-in, scripts as a Bearer header.

A signed-in session holds a digest of the token it signed in with (an HMAC of LAB_TOKEN keyed with
SECRET_KEY, never the token): a session whose digest is not the current token's is signed out, so
changing LAB_TOKEN signs every browser out, the projector's too.

Wrong tokens and wrong class (or rejoin) codes are limited per client address, failures only
(ratelimit.py): past SIGN_IN_MAX_FAILURES (JOIN_MAX_FAILURES for codes) in SIGN_IN_WINDOW_SECONDS,
sign-in and Bearer attempts answer 429 with Retry-After; /join says it on its own page.
"""
from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Callable

from flask import Flask, Response, abort, current_app, g, jsonify, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect, generate_csrf
from markupsafe import Markup, escape

from .ratelimit import FailureLimiter

csrf = CSRFProtect()
SIGNED_IN = "lab_token_digest"   # the session's digest of the token it signed in with
BROWSER = "browser"              # a random id of this browser session: its live streams are counted per browser


def token_matches(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def token_digest(token: str) -> str:
    """What a signed-in session keeps of LAB_TOKEN: an HMAC keyed with SECRET_KEY, never the token
    (the session cookie is signed, not encrypted)."""
    key = str(current_app.config.get("SECRET_KEY") or current_app.secret_key or "").encode()
    return hmac.new(key, token.encode(), hashlib.sha256).hexdigest()


def sign_in_session() -> None:
    """This browser signed in with the current LAB_TOKEN."""
    session[SIGNED_IN] = token_digest(current_app.config["LAB_TOKEN"])


def signed_in() -> bool:
    """Whether this browser signed in with the current LAB_TOKEN (a rotated token signs it out)."""
    token = current_app.config.get("LAB_TOKEN")
    given = session.get(SIGNED_IN)
    return bool(token) and isinstance(given, str) and hmac.compare_digest(given, token_digest(token))


def browser_id() -> str:
    """A random id of this browser session (kept in its cookie): the key of its live streams."""
    if not isinstance(session.get(BROWSER), str):
        session[BROWSER] = secrets.token_urlsafe(12)
    return session[BROWSER]


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def token_guesses() -> FailureLimiter:
    """This app's count of wrong tokens per client address."""
    return current_app.extensions["token_guesses"]


def code_guesses() -> FailureLimiter:
    """This app's count of wrong class codes and rejoin codes per client address."""
    return current_app.extensions["code_guesses"]


def client_address() -> str:
    # The peer's address, never X-Forwarded-For: a header the client writes would let it pick a
    # fresh address for every guess. Behind a proxy, all clients share the proxy's address.
    return request.remote_addr or "unknown"


def too_many_guesses(wait: int) -> Response:
    """429 with Retry-After: as JSON for the API, as the sign-in page (with the reason) for a browser."""
    message = (f"Too many wrong tokens from your address: wait {wait} s before trying again "
               f"(at most {token_guesses().limit} in {token_guesses().window:g} s).")
    if _wants_json():
        response = jsonify(error=message, retry_after=wait)
    else:
        response = current_app.make_response(
            render_template("auth/sign_in.html", error=message, next=request.values.get("next", "")))
    response.status_code = 429
    response.headers["Retry-After"] = str(wait)
    return response


def csrf_field() -> Markup:
    """A form's hidden CSRF field. In HTML pushed to every viewer of a feed (``g.pushed``, web/push.py)
    it is left empty, for no viewer's token may go to another: the page fills it from its own
    ``csrf-token`` meta tag when the form is sent (static/js/live-refresh.js); htmx sends the token as a
    header anyway."""
    if g.get("pushed"):
        return Markup('<input type="hidden" name="csrf_token" value="" data-page-token>')
    return Markup(f'<input type="hidden" name="csrf_token" value="{escape(generate_csrf())}">')


def init_app(app: Flask, may_post_without_token: Callable[[], bool] = lambda: False) -> None:
    """``may_post_without_token``: whether this request may change the lab without LAB_TOKEN
    (classroom mode: an attendee drives their own lab; create_app passes access.attendee_may_post)."""
    csrf.init_app(app)
    limit, window = int(app.config["SIGN_IN_MAX_FAILURES"]), float(app.config["SIGN_IN_WINDOW_SECONDS"])
    app.extensions["token_guesses"] = FailureLimiter(limit, window)
    app.extensions["code_guesses"] = FailureLimiter(int(app.config["JOIN_MAX_FAILURES"]), window)
    from . import headers
    headers.init_app(app)
    app.context_processor(lambda: {"signed_in": signed_in})  # the header's sign-out button
    app.add_template_global(csrf_field)

    @app.before_request
    def refuse_a_body_too_large():
        """413 before any view or check reads the body: Werkzeug would only refuse once it is read
        (a body without Content-Length is still cut at MAX_CONTENT_LENGTH when read)."""
        most = app.config.get("MAX_CONTENT_LENGTH")
        if most and request.content_length is not None and request.content_length > most:
            abort(413)

    @app.before_request
    def require_token_for_controls():
        token = app.config.get("LAB_TOKEN")
        if not token or request.method in ("GET", "HEAD", "OPTIONS") or request.endpoint in ("auth.sign_in", "auth.sign_out", "static"):
            return None
        if signed_in():
            return None
        given = _bearer()
        if given is not None:
            # A Bearer token is a guess like a sign-in: limited the same way, never checked while refused.
            wait = token_guesses().retry_after(client_address())
            if wait:
                return too_many_guesses(wait)
            if token_matches(given, token):
                token_guesses().forget(client_address())
                return None
            token_guesses().record_failure(client_address())
        if may_post_without_token():  # classroom mode: an attendee drives their own lab
            return None
        if _wants_json():
            return jsonify(error="this lab is protected: send Authorization: Bearer <LAB_TOKEN>"), 401
        return redirect(url_for("auth.sign_in", next=request.referrer or url_for("dashboard.index")))

    @app.errorhandler(CSRFError)
    def csrf_failed(error: CSRFError):
        if _wants_json():
            return jsonify(error=f"CSRF check failed: {error.description}"), 400
        return render_template("errors/error.html", code=400, message=f"CSRF check failed: {error.description}. "
                               "Reload the page and try again."), 400
