"""CSRF protection for forms and the optional LAB_TOKEN that guards the controls.

Forms carry a CSRF token (Flask-WTF). The JSON API is exempt from the token but accepts a
state-changing request only with ``Content-Type: application/json``, which a cross-site
form cannot send without a CORS preflight this app never grants. When LAB_TOKEN is set,
every POST needs it: the browser through a one-time sign-in, scripts as a Bearer header.
Wrong tokens are limited per client address (ratelimit.py): past SIGN_IN_MAX_FAILURES in
SIGN_IN_WINDOW_SECONDS, sign-in and Bearer attempts answer 429 with Retry-After.
"""
from __future__ import annotations

import hmac
from typing import Callable

from flask import Flask, Response, current_app, jsonify, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect

from .ratelimit import FailureLimiter

csrf = CSRFProtect()


def token_matches(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def token_guesses() -> FailureLimiter:
    """This app's count of wrong tokens per client address."""
    return current_app.extensions["token_guesses"]


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


def init_app(app: Flask, may_post_without_token: Callable[[], bool] = lambda: False) -> None:
    """``may_post_without_token``: whether this request may change the lab without LAB_TOKEN
    (classroom mode: an attendee drives their own lab; create_app passes access.attendee_may_post)."""
    csrf.init_app(app)
    app.extensions["token_guesses"] = FailureLimiter(
        int(app.config["SIGN_IN_MAX_FAILURES"]), float(app.config["SIGN_IN_WINDOW_SECONDS"]))
    from . import headers
    headers.init_app(app)

    @app.before_request
    def require_token_for_controls():
        token = app.config.get("LAB_TOKEN")
        if not token or request.method in ("GET", "HEAD", "OPTIONS") or request.endpoint in ("auth.sign_in", "static"):
            return None
        if session.get("lab_token_ok"):
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
