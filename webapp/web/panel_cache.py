"""The dashboard's two caches and the thread pool that reloads slow panels in the background.

Every viewer of a lab polls ``/live`` each second and fetches what changed. The fingerprints are
computed once per ``LIVE_CACHE_SECONDS`` per lab in this process, and a panel's data once per
fingerprint, so forty viewers cost one computation and one load per change, not forty.
A slow load (``LIVE_STALE_AFTER_SECONDS``) is answered from the last one, marked with its age,
while the pool loads it again. What a panel is and how it loads is web/panels.py's.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

from flask import current_app, g

from .db import lab_session
from .singleflight import SingleFlight

# The fingerprints of a lab, computed once per LIVE_CACHE_SECONDS in this process (0 computes them
# per request). A panel is then at most that much older than PostgreSQL, and the next poll's
# fingerprint brings the rest.
fingerprint_cache = SingleFlight()

# A panel's data is a function of its fingerprint: while the fingerprint stands, the data last
# loaded for it is still what PostgreSQL holds. So thirty browsers watching one lab cost one
# load per change, not thirty; and while one request loads it, the others wait for that load
# rather than run the same queries beside it. Keyed by lab, panel and the one argument a panel takes.
load_cache = SingleFlight()

# At scale (a verdict over millions of records takes seconds) a panel whose last load took
# LIVE_STALE_AFTER_SECONDS or more is answered at once with that load, marked with its age, while
# one background thread per process and panel loads it again: the page stays live and says what
# it shows. Two threads: the machine's two cores, and never the request threads' database pool.
_refresher: ThreadPoolExecutor | None = None
_refresher_lock = threading.Lock()


def refresher() -> ThreadPoolExecutor:
    """The process's pool of background panel loads, created on first use."""
    global _refresher
    with _refresher_lock:  # created on first use: after gunicorn forked its worker
        if _refresher is None:
            _refresher = ThreadPoolExecutor(max_workers=2, thread_name_prefix="panel-refresh")
        return _refresher


def cached_fingerprints(lab, compute: Callable[[], dict[str, str]]) -> dict[str, str]:
    """``compute()``'s fingerprints of ``lab``, reused for ``LIVE_CACHE_SECONDS`` if that is set."""
    window = float(current_app.config.get("LIVE_CACHE_SECONDS") or 0)
    if window <= 0:
        return compute()
    return fingerprint_cache.get(lab.name, lambda at: time.monotonic() - at < window,
                                 lambda: (time.monotonic(), compute()))


@dataclass(frozen=True)
class Loaded:
    data: dict[str, Any]
    fingerprint: str               # what the data was loaded for: the page's when fresh
    stale_for: float | None = None  # seconds since it was loaded, when it is not the current one
    took: float = 0.0              # how long that load took


def cached(key: tuple[str, str, str], fingerprint: str, compute: Callable[[], Any],
           compute_apart: Callable[[], Any] | None = None) -> Loaded:
    """``compute()``'s data for ``fingerprint``, loaded once per fingerprint and ``key`` when
    ``PANEL_CACHE`` is on; with ``compute_apart`` a slow load may be answered from the last one."""
    if not current_app.config["PANEL_CACHE"]:
        return Loaded(compute(), fingerprint)
    slow = float(current_app.config.get("LIVE_STALE_AFTER_SECONDS") or 0)
    if compute_apart is None or slow <= 0:
        return Loaded(load_cache.get(key, lambda kept: kept == fingerprint, lambda: (fingerprint, compute())),
                      fingerprint)
    answer = load_cache.get_or_stale(key, fingerprint, compute, slow=slow, executor=refresher(),
                                     compute_apart=compute_apart)
    return Loaded(answer.value, answer.tag, answer.stale_for, answer.took)


def apart(load: Callable[[Any, Any], Any], lab, prints: dict[str, str]) -> Callable[[], Any]:
    """``load(lab, session)`` as a background thread runs it: an app context and a database
    session of its own (the request's are gone by then), the fingerprints the request saw."""
    app = current_app._get_current_object()

    def run():
        with app.app_context():
            g.fingerprints = prints
            with lab_session(lab.schema) as session:
                return load(lab, session)
    return run
