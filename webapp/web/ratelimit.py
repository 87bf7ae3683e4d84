"""Limits on failed guesses of the lab's two secrets, in this process's memory: wrong LAB_TOKENs
and wrong class codes (or rejoin codes), each in buckets of their own.

Wrong tokens (sign-in, a Bearer header): at most ``limit`` failures in any ``window`` seconds per
client address (:class:`FailureLimiter`); past that, every attempt from it is refused, the right
token too, until the oldest failure in the window is older than the window. The token is never
checked while refused, so guessing does not go on behind the refusals. Only the instructor types
the token: one address is one person.

Wrong class codes and rejoin codes (/join): a whole class may sit behind one address (a classroom
NAT, a proxy), and any attendee may mistype, so they are counted per browser and per address
(:class:`BrowserAndAddressLimiter`):

- per (address, browser session): ``limit`` failures in the window refuse that browser alone, the
  right code too, as for the token;
- per address: a ceiling ``ADDRESS_CEILING_FACTOR`` times larger (a class of thirty each using up
  their own limit) refuses every browser of the address. It stops a script that drops its session
  cookie to get a fresh browser for every guess; a class mistyping reaches it only if thirty
  browsers each fail ``limit`` times within one window.

So one mistyping attendee (or a few) never locks the class out of /join, a correct code from
another browser at the same address is never refused for their failures (below the ceiling), and
the instructor's sign-in is counted apart: wrong class codes never refuse the token, nor the
reverse.

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

# How many times a browser's limit an address's ceiling is, for wrong class codes: a class of thirty.
ADDRESS_CEILING_FACTOR = 30
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


class BrowserAndAddressLimiter:
    """Wrong class codes: counted per (address, browser session) and, with a much larger ceiling,
    per address (see the module); thread-safe."""

    def __init__(self, limit: int, window: float, clock: Callable[[], float] = time.monotonic,
                 ceiling_factor: int = ADDRESS_CEILING_FACTOR):
        self.browsers = FailureLimiter(limit, window, clock)
        self.addresses = FailureLimiter(limit * ceiling_factor, window, clock)
        self.limit, self.window = limit, window

    @staticmethod
    def _browser_key(address: str, browser: str) -> str:
        return f"{address} {browser}"

    def retry_after(self, address: str, browser: str) -> int:
        """Whole seconds until this browser may try again; 0 when it may try now."""
        return max(self.browsers.retry_after(self._browser_key(address, browser)),
                   self.addresses.retry_after(address))

    def record_failure(self, address: str, browser: str) -> None:
        self.browsers.record_failure(self._browser_key(address, browser))
        self.addresses.record_failure(address)

    def forget(self, address: str, browser: str) -> None:
        """A right answer: this browser's failures no longer count (the address's ceiling keeps the
        others', which are not this browser's to clear)."""
        self.browsers.forget(self._browser_key(address, browser))
