"""Sign-in with LAB_TOKEN, when an instructor exposes the lab on a network, and sign-out.

The session keeps a digest of the token (security.py), so changing LAB_TOKEN signs every browser
out; sign-out clears the whole session of this browser.
"""
from __future__ import annotations

from flask import Blueprint, current_app, redirect, render_template, request, session, url_for

from .security import client_address, sign_in_session, token_guesses, token_matches, too_many_guesses

bp = Blueprint("auth", __name__)


def safe_next(target: str | None) -> str:
    r"""``target`` when it is a path of this site, else the dashboard: never an open redirect.

    A path starts with one "/" (so it has no scheme) and has no "//" (``//evil.com`` is another
    host), no backslash (browsers read ``/\evil.com`` as ``//evil.com``), and no whitespace or
    control character (browsers drop tabs and newlines, which would turn "/", a tab, "/evil.com" into the above).
    """
    if not target or not target.startswith("/") or "//" in target or "\\" in target:
        return url_for("dashboard.index")
    if any(ch.isspace() or ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in target):
        return url_for("dashboard.index")
    return target


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
            sign_in_session()
            return redirect(safe_next(request.form.get("next")))
        token_guesses().record_failure(client_address())
        error = "That token is not this lab's token."
    return render_template("auth/sign_in.html", error=error, next=request.args.get("next", "")), (
        401 if error else 200)


@bp.post("/sign-out")
def sign_out():
    """Forget everything this browser's session holds: the sign-in, an attendee's lab, a view."""
    session.clear()
    return redirect(url_for("dashboard.index"), code=303)
