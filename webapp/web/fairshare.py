"""One lab's share of a web process's database pool, in classroom mode.

Thirty labs share each web process's pool. A learner's code can hold a lock on their own lane (an
open transaction, a ``LOCK TABLE``) and every read of that lab then waits for it, up to its lock
timeout (store/schema.py); a flood of such requests would hold every pooled connection and leave
the other labs with 503s. So at most LAB_WEB_CONNECTIONS_PER_LAB requests of one lab work at once;
the next waits up to WAIT_SECONDS for one of them to end, then gets a 503 that says why. The lab
that waits is the learner's own: the others keep their share.

Live streams hold no connection while open (web/push.py renders for all viewers at once), and
the pages of no lab (sign-in, join, docs, static files) are not counted.
"""
from __future__ import annotations

import threading

from flask import Flask, g, jsonify, render_template, request

from ..store import classroom

WAIT_SECONDS = 2.0


class LabShares:
    """A bounded semaphore per lab name, made on first use (thread-safe)."""

    def __init__(self, per_lab: int):
        self.per_lab = per_lab
        self._shares: dict[str, threading.BoundedSemaphore] = {}
        self._lock = threading.Lock()

    def of(self, lab: str) -> threading.BoundedSemaphore:
        with self._lock:
            share = self._shares.get(lab)
            if share is None:
                share = self._shares[lab] = threading.BoundedSemaphore(self.per_lab)
            return share


def init_app(app: Flask, lab_of_request, counted) -> None:
    """``lab_of_request()``: the request's lab name; ``counted()``: whether this request works in a lab."""
    shares = LabShares(int(app.config["LAB_WEB_CONNECTIONS_PER_LAB"]))

    @app.before_request
    def take_a_share():
        if not classroom.enabled(app.config) or not counted() or request.path.endswith("/stream"):
            return None
        lab = lab_of_request()
        share = shares.of(lab)
        if not share.acquire(timeout=WAIT_SECONDS):
            message = (f"Lab {lab} has {shares.per_lab} requests waiting on its database already (its share of this "
                       "server, LAB_WEB_CONNECTIONS_PER_LAB): one of its sessions may hold a lock on its tables (your "
                       "own consumer's open transaction?). Try again in a moment; Your consumer → Terminate ends "
                       "your code's sessions.")
            if request.path.startswith("/api/"):
                response = jsonify(error=message)
            else:
                response = app.make_response(render_template("errors/error.html", code=503, message=message))
            response.status_code = 503
            response.headers["Retry-After"] = "2"
            return response
        g.lab_share = share
        return None

    @app.teardown_request
    def return_the_share(_error):
        share = g.pop("lab_share", None)
        if share is not None:
            share.release()
