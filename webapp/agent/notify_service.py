"""The notification service as the agent's sidecar, unless one runs elsewhere.

With ``LAB_NOTIFY_URL`` set (docker compose: the ``notify`` service), the agent starts nothing and
its consumers call that URL. Otherwise the agent keeps ``python -m webapp.notify`` running on a
free loopback port (restarted if it dies, like the log reader) and tells its consumers the URL.
"""
from __future__ import annotations

import os
from pathlib import Path

from ..domain.waits import LOOPBACK, free_port
from ..settings import load_config
from .processes import Sidecar

URL_VARIABLE = "LAB_NOTIFY_URL"


def notification_service(database_url: str, log_dir: Path, log_to_stdout: bool) -> tuple[Sidecar | None, str]:
    """(the sidecar to keep running, or None when one runs elsewhere; the URL consumers call)."""
    config = load_config()
    if config["LAB_NOTIFY_URL"]:
        return None, config["LAB_NOTIFY_URL"]
    # `make run` picks the address (to print it); otherwise any free loopback port.
    listen = config["LAB_NOTIFY_LISTEN"] or f"{LOOPBACK}:{free_port(LOOPBACK)}"
    sidecar = Sidecar("notification service", "webapp.notify",
                      {**os.environ, "DATABASE_URL": database_url, "LAB_NOTIFY_LISTEN": listen}, log_dir, log_to_stdout)
    return sidecar, f"http://{listen}"
