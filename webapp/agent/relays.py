"""The agent's side of the outbox: one relay process per lab that asked for one, kept running.

A lab asks for a relay by having a ``relay_state`` row (the payments service's transaction and
arming a relay fault write it). About once a second the agent looks for such labs and takes the
relay of each one nobody runs (or whose agent stopped beating), then keeps a ``python -m
webapp.outbox`` sidecar running for it: started again after any crash (a crash point is a SIGKILL
to itself), forgotten when it exits by itself with 0 (the lab was reset or removed).
"""
from __future__ import annotations

import logging
from pathlib import Path

from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from ..store import agents as agent_rows
from ..store import outbox as sql
from ..store.schema import quoted
from .processes import Sidecar

log = logging.getLogger("idempotency_lab.agent")


class RelayKeeper:
    """The relays this agent runs, by lab name."""

    def __init__(self, engine: Engine, env: dict[str, str], log_dir: Path, log_to_stdout: bool, agent_id: str):
        self.engine, self.env, self.log_dir = engine, env, log_dir
        self.log_to_stdout, self.agent_id = log_to_stdout, agent_id
        self.relays: dict[str, Sidecar] = {}

    def wanted(self) -> list[str]:
        """The labs whose relay this agent runs now (claimed in the same transaction)."""
        claimed = []
        with self.engine.begin() as conn:
            live = agent_rows.live_ids(conn)
            for (schema,) in conn.execute(text(sql.LABS_WANTING_A_RELAY)).all():
                ours = conn.exec_driver_sql(sql.CLAIM_RELAY.format(schema=quoted(schema)),
                                            {"agent": self.agent_id, "live": live}).scalar()
                if ours:
                    claimed.append(schema.removeprefix("lab_"))
        return claimed

    def tick(self) -> None:
        """Start, restart or forget relays so that each wanted lab has one running."""
        try:
            wanted = set(self.wanted())
        except SQLAlchemyError as error:  # PostgreSQL restarting: keep what runs, look again next tick
            log.warning("outbox relays: %s", str(error).splitlines()[0])
            return
        for lab, relay in list(self.relays.items()):
            ended = relay.process is not None and relay.process.poll() == 0
            if ended or lab not in wanted:
                relay.stop()
                del self.relays[lab]
        for lab in sorted(wanted):
            relay = self.relays.get(lab)
            if relay is None:
                relay = self.relays[lab] = Sidecar(
                    f"outbox relay {lab}", "webapp.outbox",
                    {**self.env, "LAB_NAME": lab, "LAB_AGENT_ID": self.agent_id}, self.log_dir, self.log_to_stdout)
                log.info("outbox relay for lab %s", lab)
            relay.ensure()

    def stop_all(self) -> None:
        for relay in self.relays.values():
            relay.stop()
        self.relays.clear()
