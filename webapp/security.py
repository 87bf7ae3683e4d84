"""CSRF protection for forms and the optional LAB_TOKEN that guards the controls.

Forms carry a CSRF token (Flask-WTF). The JSON API is exempt from the token but accepts a
state-changing request only with ``Content-Type: application/json``, which a cross-site
form cannot send without a CORS preflight this app never grants. When LAB_TOKEN is set,
every POST needs it: the browser through a one-time sign-in, scripts as a Bearer header.
"""
from __future__ import annotations

import hmac

from flask import Flask, jsonify, redirect, render_template, request, session, url_for
from flask_wtf.csrf import CSRFError, CSRFProtect

csrf = CSRFProtect()


def token_matches(given: str | None, expected: str) -> bool:
    return bool(given) and hmac.compare_digest(given.encode(), expected.encode())


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def _wants_json() -> bool:
    return request.path.startswith("/api/")


def init_app(app: Flask) -> None:
    csrf.init_app(app)

    @app.before_request
    def require_token_for_controls():
        token = app.config.get("LAB_TOKEN")
        if not token or request.method in ("GET", "HEAD", "OPTIONS") or request.endpoint in ("auth.sign_in", "static"):
            return None
        if token_matches(_bearer(), token) or session.get("lab_token_ok"):
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
