"""One computation per key at a time, shared by every request thread of this process.

Forty browsers watching one lab ask the same questions each second: ``/live`` for the panels'
fingerprints, then each changed panel. Without this, each of them runs the same queries at the
same moment (a thundering herd: forty verdicts computed in parallel on two cores, each slower for
the others). With it, the first request for a key computes; those that arrive meanwhile wait for
its result instead of starting their own, and those that come after reuse it while it is valid.

What "valid" means is the caller's: the same fingerprint (a panel's data, exact), or computed less
than a moment ago (the fingerprints themselves: ``LIVE_CACHE_SECONDS``).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable

_MISSING = object()


@dataclass
class _Entry:
    lock: threading.Lock = field(default_factory=threading.Lock)
    # (tag, value): what the value was computed for (a fingerprint, a time) and the value, set in
    # one assignment so that a thread reading without the lock never pairs one's tag with another's value
    kept: tuple[Any, Any] = (_MISSING, None)


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
            entry.kept = compute()
            return entry.kept[1]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
