"""Who is asking, and for which lab: every blueprint resolves the request's lab here, once.

Classroom mode (webapp/web/classroom.py has its pages):
- an attendee's browser session is bound to the attendee's own lab by /join; every page, panel,
  form and API call of that session works in it;
- a change (POST) for any other lab is refused with 403: ``?lab=`` naming another lab, or a
  session that is viewing another lab read-only;
- the instructor (signed in with LAB_TOKEN; without a token, whoever is not an attendee on this
  loopback-only server) may view any lab read-only: the API's GETs take ``?lab=``, and the board's
  "open read-only" puts the browser session in a view of that lab (dashboard and presenter);
- attendees may view another attendee's lab only when the instructor allows it
  (``LAB_CLASS_VIEW_OTHERS=1``); a guided run of a lab they may not read answers 404 on every page
  (run, guide, live panel, next step), as if it did not exist, and ``/scenarios/`` lists their own
  lab's runs only (:func:`require_readable`, :func:`readable_labs`);
- outside classroom mode, LAB_NAME as always.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from flask import abort, current_app, g, has_request_context, redirect, request, session, url_for
from sqlalchemy.orm import Session

from ..domain.lab import InvalidLabName, Lab
from ..store import classroom
from .db import db, lab_session
from .security import client_address, signed_in, token_guesses, token_matches, too_many_guesses

ATTENDEE_LAB, ATTENDEE_NAME, VIEWING = "attendee_lab", "attendee_name", "view_lab"
# The attendee's session generation when this browser joined: leaving and a hand-over move it on,
# and a browser session under an older one is signed out (store/classroom.py, revoke_sessions).
ATTENDEE_GENERATION = "attendee_generation"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
# What an attendee (no LAB_TOKEN) may POST on the classroom blueprint; everything else there is the instructor's.
ATTENDEE_POSTS = ("classroom.join", "classroom.leave", "classroom.view", "classroom.stop_viewing")


def current_lab() -> Lab:
    """The lab this request works in: in classroom mode the session's own lab (or the one it views
    read-only, see :func:`request_lab`), else LAB_NAME. Every blueprint resolves it here."""
    return request_lab()


@contextmanager
def lab_db() -> Iterator[tuple[Lab, Session]]:
    """The current lab and a session working in its schema."""
    lab = current_lab()
    with lab_session(lab.schema) as session:
        yield lab, session


def _config() -> dict[str, Any]:
    return current_app.config


def in_class() -> bool:
    return classroom.enabled(_config())


def _bearer() -> str | None:
    header = request.headers.get("Authorization", "")
    return header[7:] if header.startswith("Bearer ") else None


def is_instructor() -> bool:
    """Signed in with LAB_TOKEN (browser) or sending it (script). Without a token the server is
    loopback-only: whoever is not an attendee sits at the instructor's machine. A Bearer token from
    an address that guessed too often is not even compared (ratelimit.py)."""
    token = _config().get("LAB_TOKEN")
    if token:
        if signed_in():
            return True
        return not token_guesses().retry_after(client_address()) and token_matches(_bearer(), token)
    return not session.get(ATTENDEE_LAB)


def session_was_revoked() -> bool:
    """Whether this attendee's browser session joined before the attendee's sessions were revoked
    (they left, or were handed over): checked on every request of a bound session."""
    lab = session.get(ATTENDEE_LAB)
    if not lab:
        return False
    with db.engine.connect() as conn:
        current = classroom.session_generation(conn, lab)
    return current is None or session.get(ATTENDEE_GENERATION) != current


# How often an open stream asks again whether its session may still read (at most, per stream).
STREAM_RECHECK_SECONDS = 1.0


def stream_guard() -> Callable[[], bool]:
    """For a live stream opened by this request: whether its session may still read what the stream
    shows, asked before each pushed event (an attendee who left or was handed over since: no). The
    answer is looked up again at most once a STREAM_RECHECK_SECONDS."""
    lab, generation = session.get(ATTENDEE_LAB), session.get(ATTENDEE_GENERATION)
    if not in_class() or not lab:
        return lambda: True
    engine = db.engine
    checked = {"at": time.monotonic(), "allowed": True}

    def still_allowed() -> bool:
        now = time.monotonic()
        if now - checked["at"] >= STREAM_RECHECK_SECONDS:
            with engine.connect() as conn:
                checked["allowed"] = classroom.session_generation(conn, lab) == generation
            checked["at"] = now
        return checked["allowed"]
    return still_allowed


def end_attendee_session() -> None:
    """Unbind this browser from its attendee and lab."""
    for key in (ATTENDEE_LAB, ATTENDEE_NAME, ATTENDEE_GENERATION, VIEWING):
        session.pop(key, None)


def own_lab() -> str | None:
    """The attendee's lab this browser session is bound to (classroom mode only)."""
    return session.get(ATTENDEE_LAB) if in_class() else None


def home_lab() -> Lab:
    """The lab this session drives: the attendee's own, else LAB_NAME."""
    return Lab(own_lab() or _config()["LAB_NAME"])


def may_view(name: str) -> bool:
    return (name == home_lab().name or is_instructor()
            or (in_class() and bool(_config().get("LAB_CLASS_VIEW_OTHERS"))))


def readable_labs() -> list[str] | None:
    """The labs whose runs and records this session may read: None for every lab (outside
    classroom mode, the instructor, a class that lets attendees view each other), else its own."""
    if not in_class() or is_instructor() or _config().get("LAB_CLASS_VIEW_OTHERS"):
        return None
    return [home_lab().name]


def require_readable(lab_name: str) -> None:
    """404 unless this session may read lab ``lab_name`` (a guided run's, say): not 403, so that
    an attendee learns nothing of what exists in the labs of others."""
    readable = readable_labs()
    if readable is not None and lab_name not in readable:
        abort(404)


def viewing() -> str | None:
    """The lab this session views read-only, if it views one other than its own."""
    name = session.get(VIEWING)
    return name if name and name != home_lab().name else None


def attendee_may_post() -> bool:
    """For security.py (create_app hands it over): an attendee's session may POST without LAB_TOKEN (its own lab only, which
    request_lab enforces), and anyone may join."""
    if request.endpoint in ("classroom.join", "classroom.leave"):
        return in_class()
    if not own_lab():
        return False
    return request.blueprint != "classroom" or request.endpoint in ATTENDEE_POSTS


def request_lab() -> Lab:
    """The lab of this request (see the module); 403 for a change to another lab."""
    if not has_request_context():
        return Lab(_config()["LAB_NAME"])
    if "classroom_lab" not in g:
        g.classroom_lab = _resolve()
    return g.classroom_lab


def named_lab(name: str) -> Lab:
    try:
        return Lab(name)
    except InvalidLabName as error:
        abort(403, f"{error}: there is no such lab to work in")


def _resolve() -> Lab:
    home = home_lab()
    asked = request.args.get("lab") if request.path.startswith("/api/") else None
    if request.method in SAFE_METHODS:
        if asked:
            if not may_view(asked):
                abort(403, f"lab {asked} is not yours to view: you work in lab {home.name}")
            return named_lab(asked)
        shown = viewing()
        return Lab(shown) if shown and may_view(shown) else home
    if asked and asked != home.name:
        abort(403, f"lab {asked} is not yours: you may drive only your own lab, {home.name}")
    if viewing():
        abort(403, f"this browser views lab {viewing()} read-only: leave the view to drive lab {home.name}")
    return home


def require_drivable(lab_name: str) -> None:
    """403 unless this session may change ``lab_name`` (a guided run's lab, for instance): an
    attendee drives their own lab only; the instructor any lab but an attendee's, which they view
    read-only; and no session while it views a lab read-only."""
    if not in_class():
        return
    shown = viewing()
    if shown:
        abort(403, f"this browser views lab {shown} read-only: leave the view to drive a lab")
    own = own_lab()
    if own is not None:
        if lab_name != own:
            abort(403, f"lab {lab_name} is not yours: you may drive only your own lab, {own}")
        return
    if not is_instructor():
        abort(403, "join the class first")
    with db.engine.connect() as conn:
        attendee = classroom.attendee_of_lab(conn, lab_name)
    if attendee is not None:
        abort(403, f"lab {lab_name} is {attendee.name}'s: the instructor views an attendee's lab read-only")


def guided_run_lab() -> Lab | None:
    """The lab a guided run started by this session works in: the attendee's own lab; None for a
    fresh lab of its own (outside classroom mode, or the instructor)."""
    own = own_lab()
    return Lab(own) if own else None


def require_instructor() -> None:
    if is_instructor():
        return
    if _bearer() is not None:
        wait = token_guesses().retry_after(client_address())
        if wait:  # guessed too often: refused without a look at the token, as at sign-in
            abort(too_many_guesses(wait))
        token_guesses().record_failure(client_address())  # a wrong token counts as a guess, as at sign-in
    if _config().get("LAB_TOKEN") and not own_lab():
        abort(redirect(url_for("auth.sign_in", next=request.path)))
    abort(403, "the class board is the instructor's: sign in with the lab token")
