"""One computation per key at a time, shared by every request thread of this process.

Forty browsers watching one lab ask the same questions each second: ``/live`` for the panels'
fingerprints, then each changed panel. Without this, each of them runs the same queries at the
same moment (a thundering herd: forty verdicts computed in parallel on two cores, each slower for
the others). With it, the first request for a key computes; those that arrive meanwhile wait for
its result instead of starting their own, and those that come after reuse it while it is valid.

What "valid" means is the caller's: the same fingerprint (a panel's data, exact), or computed less
than a moment ago (the fingerprints themselves: ``LIVE_CACHE_SECONDS``).

At scale a computation can take seconds (the verdict over millions of records): then
``get_or_stale`` answers at once with the last value, says how old it is, and has it recomputed
in the background, once at a time per key (stale-while-revalidate). A computation faster than the
caller's budget is never served stale: a workshop-sized lab always sees its data as it is now.
"""
from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, NamedTuple

_MISSING = object()


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (tag, value): what the value was computed for (a fingerprint, a time) and the value, set in
    # one assignment so that a thread reading without the lock never pairs one's tag with another's value
    kept: tuple[Any, Any] = (_MISSING, None)
    # When the kept value's computation started (what it shows is PostgreSQL as of then) and how
    # long it took: what get_or_stale decides on. One tuple, for the same reason as ``kept``.
    timing: tuple[float, float] = (0.0, 0.0)
    refreshing: bool = False  # a background recomputation is queued or running


class Answer(NamedTuple):
    """What get_or_stale returns: the value, the tag it was computed for, and its age in seconds
    when it is not the caller's (stale), else None."""
    value: Any
    tag: Any
    stale_for: float | None
    took: float


class SingleFlight:
    """A map of keys to their last computed value, computed by one thread at a time per key."""

    def __init__(self) -> None:
        self._entries: dict[Hashable, _Entry] = {}
        self._lock = threading.Lock()

    def _entry(self, key: Hashable) -> _Entry:
        with self._lock:
            return self._entries.setdefault(key, _Entry())

    def get(self, key: Hashable, valid: Callable[[Any], bool], compute: Callable[[], tuple[Any, Any]]) -> Any:
        """The value for ``key`` if ``valid(tag)`` holds for the one kept; else ``compute()``'s
        ``(tag, value)``, kept and returned. A thread that finds another computing waits for it and
        takes its result if that is valid for it too. An exception is raised to the thread that
        computed; the next one tries again."""
        entry = self._entry(key)
        tag, value = entry.kept
        if tag is not _MISSING and valid(tag):
            return value
        with entry.lock:
            tag, value = entry.kept
            if tag is not _MISSING and valid(tag):
                return value  # computed while this thread waited
            started = time.monotonic()
            entry.kept = compute()
            # Kept with how long it took, as get_or_stale keeps its own: a value computed here and
            # later found out of date there is answered stale only if its computation was slow.
            entry.timing = (started, time.monotonic() - started)
            return entry.kept[1]

    def get_or_stale(self, key: Hashable, tag: Any, compute: Callable[[], Any], *, slow: float,
                     executor: Executor, compute_apart: Callable[[], Any]) -> Answer:
        """The value computed for ``tag``. If only an older one is kept and its computation took
        ``slow`` seconds or more, that one at once (marked stale), while ``compute_apart`` (the same
        computation, with resources of its own: it outlives the caller) runs on ``executor`` for
        ``tag``. Otherwise ``compute()`` in this thread, single-flight as ``get``."""
        entry = self._entry(key)
        kept_tag, value = entry.kept
        started, took = entry.timing
        if kept_tag is not _MISSING and kept_tag == tag:
            return Answer(value, kept_tag, None, took)
        if kept_tag is not _MISSING and slow > 0 and took >= slow:
            with self._lock:
                start, entry.refreshing = not entry.refreshing, True
            if start:
                executor.submit(self._refresh, entry, tag, compute_apart)
            return Answer(value, kept_tag, time.monotonic() - started, took)
        with entry.lock:
            kept_tag, value = entry.kept
            if kept_tag is not _MISSING and kept_tag == tag:
                return Answer(value, kept_tag, None, entry.timing[1])
            value, took = self._timed(entry, tag, compute)
            return Answer(value, tag, None, took)

    def _timed(self, entry: _Entry, tag: Any, compute: Callable[[], Any]) -> tuple[Any, float]:
        started = time.monotonic()
        value = compute()
        took = time.monotonic() - started
        entry.kept, entry.timing = (tag, value), (started, took)
        return value, took

    def _refresh(self, entry: _Entry, tag: Any, compute: Callable[[], Any]) -> None:
        try:
            with entry.lock:
                if entry.kept[0] != tag:
                    self._timed(entry, tag, compute)
        except Exception:  # noqa: BLE001 (a background thread: nobody else would see it)
            logging.getLogger(__name__).exception("recomputing %s in the background failed", tag)
            # The next request computes in its own thread and so meets the error itself.
            entry.timing = (entry.timing[0], 0.0)
        finally:
            entry.refreshing = False

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
