"""Sign-in with LAB_TOKEN, when an instructor exposes the lab on a network."""
from __future__ import annotations

from urllib.parse import urlparse

from flask import Blueprint, current_app, redirect, render_template, request, session, url_for

from .security import client_address, token_guesses, token_matches, too_many_guesses

bp = Blueprint("auth", __name__)


def _safe_next(target: str | None) -> str:
    # Only same-site paths: never an open redirect.
    if target and not urlparse(target).netloc and target.startswith("/"):
        return target
    return url_for("dashboard.index")


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in():
    token = current_app.config.get("LAB_TOKEN")
    if not token:
        return redirect(url_for("dashboard.index"))
    error = None
    if request.method == "POST":
        # Limited per address (ratelimit.py); while refused, the token is not even compared.
        wait = token_guesses().retry_after(client_address())
        if wait:
            return too_many_guesses(wait)
        if token_matches(request.form.get("token"), token):
            token_guesses().forget(client_address())
            session["lab_token_ok"] = True
            return redirect(_safe_next(request.form.get("next")))
        token_guesses().record_failure(client_address())
        error = "That token is not this lab's token."
    return render_template("auth/sign_in.html", error=error, next=request.args.get("next", "")), (
        401 if error else 200)
