"""Limits on failed guesses of the lab's secrets, in this process's memory: wrong LAB_TOKENs, and
wrong class codes or rejoin codes, each in a bucket of its own.

Both are counted per client address, failures only (:class:`FailureLimiter`): at most ``limit``
failures in any ``window`` seconds; past that, every attempt from that address is refused, the
right secret too, until the oldest failure in the window is older than the window. A secret is
never checked while refused, so guessing does not go on behind the refusals, and a client that
drops its cookie gains nothing: the address is the key. A class behind one NAT still joins, since a
right code counts nothing; its mistypes share the address's budget (JOIN_MAX_FAILURES, higher than
the instructor's SIGN_IN_MAX_FAILURES). Wrong class codes never refuse the token, nor the reverse.

In memory, per process: with gunicorn's few workers (WEB_WORKERS, default 2) an address gets at
most ``limit`` failures per worker in a window, which still turns a brute force from thousands of
guesses a second into a handful a minute. Nothing to set up, nothing to clean: a restart forgets.
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Callable

# Addresses remembered at most; past that the least recently failing is forgotten first, so a
# flood of addresses costs bounded memory (and forgetting one only gives it a fresh window).
MAX_ADDRESSES = 10_000


class FailureLimiter:
    """Counts failures per key (a client address) in a sliding window; thread-safe."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = MAX_ADDRESSES):
        if limit < 1 or window <= 0:
            raise ValueError("a failure limit needs limit >= 1 and window > 0")
        self.limit = limit
        self.window = window
        self._clock = clock
        self._max_keys = max_keys
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, key: str, now: float) -> deque[float]:
        """The key's failures still inside the window (older ones dropped)."""
        failures = self._failures.get(key, deque())
        while failures and failures[0] <= now - self.window:
            failures.popleft()
        if not failures:
            self._failures.pop(key, None)
        return failures

    def retry_after(self, key: str) -> int:
        """Whole seconds until ``key`` may try again; 0 when it may try now."""
        with self._lock:
            now = self._clock()
            failures = self._recent(key, now)
            if len(failures) < self.limit:
                return 0
            return max(1, math.ceil(failures[0] + self.window - now))

    def record_failure(self, key: str) -> None:
        with self._lock:
            now = self._clock()
            failures = self._recent(key, now)
            self._failures.pop(key, None)  # re-inserted last: the dict is ordered by latest failure
            failures.append(now)
            self._failures[key] = failures
            while len(self._failures) > self._max_keys:
                del self._failures[next(iter(self._failures))]

    def forget(self, key: str) -> None:
        """A right answer: the key's failures no longer count."""
        with self._lock:
            self._failures.pop(key, None)
