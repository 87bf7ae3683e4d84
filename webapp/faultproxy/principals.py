"""The learners' gateway's authentication: a lane's Kafka principal, looked up in PostgreSQL
(store.outside.kafka_principal) at each connection's SASL exchange, its password checked against
the stored hash (domain.credentials). Both run in a worker thread: the proxy's event loop keeps
forwarding every other connection's bytes meanwhile."""
from __future__ import annotations

import asyncio
import logging

from sqlalchemy import create_engine
from sqlalchemy.exc import SQLAlchemyError

from ..domain.credentials import hash_password, verify_password
from ..store.connection import sqlalchemy_url
from ..store.outside import kafka_principal
from .gateway import Grant

log = logging.getLogger("idempotency_lab.faultproxy")


class DatabasePrincipals:
    """``authenticate(username, password)``: the principal's grant, or None."""

    def __init__(self, database_url: str):
        self.engine = create_engine(sqlalchemy_url(database_url), pool_size=2, max_overflow=4, pool_pre_ping=True)
        # Checked against when the username is unknown, so a wrong name takes as long as a wrong password.
        self._decoy = hash_password("no such principal")

    async def authenticate(self, username: str, password: str) -> Grant | None:
        return await asyncio.to_thread(self._authenticate, username, password)

    def _authenticate(self, username: str, password: str) -> Grant | None:
        try:
            with self.engine.connect() as conn:
                principal = kafka_principal(conn, username)
        except SQLAlchemyError as error:
            # Without the database nobody can be authenticated: refused, never let through.
            log.warning("learner gateway: cannot look up %r: %s", username, error)
            return None
        if principal is None:
            verify_password(self._decoy, password)
            return None
        if not verify_password(principal.password_hash, password):
            return None
        return Grant(principal.username, principal.lab, principal.topic, principal.group_id)

    def close(self) -> None:
        self.engine.dispose()
