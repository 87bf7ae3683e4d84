"""What a command's handler may use of the agent that runs it (workers.WorkerContext: the agent's
shared objects and the worker thread's own connection).

Handlers (handlers.py, chaos_runner.py) are typed against this protocol, not against the loop: the loop
imports the handlers, never the other way round.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any, Protocol

import psycopg
from sqlalchemy import Engine

from ..domain.lab import Lab


class AgentContext(Protocol):
    id: str
    engine: Engine
    conn: psycopg.Connection
    admin: Any                       # confluent_kafka.admin.AdminClient
    publisher: Any                   # kafka.producer.Publisher
    producer_bootstrap_servers: str
    pool: Any                        # processes.Pool
    log_mirror: Any                  # processes.Sidecar (the log reader)

    def in_lab(self, lab: Lab) -> AbstractContextManager[None]:
        """A transaction on ``conn`` working in the lab's schema."""

    def say(self, lab: Lab, kind: str, summary: str, **detail: Any) -> None:
        """A line on the lab's timeline."""

    def spawn(self, lab: Lab, consumer_id: int, name: str) -> int:
        """Start a consumer process; its pid."""

    def reap_children(self) -> None:
        """Record how each exited consumer process ended."""
