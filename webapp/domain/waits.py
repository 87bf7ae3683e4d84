"""Waiting for a condition with a deadline, instead of guessing a sleep."""
from __future__ import annotations

import socket
import time
from typing import Callable, TypeVar

T = TypeVar("T")
# The host every embedded service and sidecar listens on, unless told otherwise.
LOOPBACK = "127.0.0.1"


class WaitTimeout(TimeoutError):
    """A condition did not hold before its deadline."""


def wait_until(
    condition: Callable[[], T],
    *,
    timeout: float,
    message: str | Callable[[], str],
    interval: float = 0.05,
) -> T:
    """Call ``condition`` until it returns a truthy value and return that value.

    Raises WaitTimeout with ``message`` (a string, or a callable that describes the
    last observed state) when ``timeout`` seconds pass first.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            text = message() if callable(message) else message
            raise WaitTimeout(f"after {timeout:.1f}s: {text}")
        time.sleep(interval)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    """True when something accepts TCP connections on host:port."""
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False
