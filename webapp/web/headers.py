"""Security headers on every response, and the session cookie's flags.

The Content-Security-Policy allows scripts and styles from the lab's own origin only: no inline
``<script>``, no ``on*=`` or ``hx-on`` attributes, no ``<style>`` element or ``style=`` attribute
in a template (JS lives in static/js, CSS in static/css), no eval (htmx runs with
``allowEval: false`` and without its injected indicator styles, see templates/layout.html).
Styles are as strict as scripts: an injected ``style=`` can still restyle a page to mislead
(hide a control, fake a verdict), and the templates need no inline style.
"""
from __future__ import annotations

from flask import Flask, Response

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self'",
    "connect-src 'self'",
    "font-src 'self'",
    "object-src 'none'",
    "base-uri 'self'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])

SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    # Same-origin requests keep their referrer: a control answered by the sign-in page returns there.
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
# Sent only when the lab is served over HTTPS (LAB_HTTPS=1): over plain HTTP it would be ignored,
# and a browser that met it once on localhost would refuse plain HTTP there for a year.
STRICT_TRANSPORT_SECURITY = "max-age=31536000"


def init_app(app: Flask) -> None:
    """Flag the session cookie and add the headers to every response, error pages included."""
    https = bool(app.config.get("LAB_HTTPS"))
    app.config["SESSION_COOKIE_HTTPONLY"] = True   # no script reads the session
    app.config["SESSION_COOKIE_SAMESITE"] = "Lax"  # no cross-site POST carries it
    app.config["SESSION_COOKIE_SECURE"] = https    # over HTTPS only, when the lab is served so

    headers = dict(SECURITY_HEADERS)
    if https:
        headers["Strict-Transport-Security"] = STRICT_TRANSPORT_SECURITY

    @app.after_request
    def add_security_headers(response: Response) -> Response:
        for name, value in headers.items():
            response.headers.setdefault(name, value)
        return response
