"""The fault proxy's control row in PostgreSQL (ControlledFaults): faults armed through
``lab_control.fault_proxies``, reported back there and to the timeline of the lab that armed them.

Control goes through PostgreSQL so it works across containers: the lab writes a row in
``lab_control.fault_proxies`` (operations.arm_fault_proxy) and NOTIFYs; the proxy LISTENs (and
polls, in case a notification is missed), acknowledges each setting by its version, reports
counters with a heartbeat, and writes every injected fault to the timeline of the lab that
armed it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import time

import psycopg
from psycopg.types.json import Jsonb

from ..store import timeline
from ..store.connection import CONTROL_SCHEMA, psycopg_conninfo
from ..domain.lab import InvalidLabName, Lab
from ..domain.vocabulary import FAULT_PROXY_CHANNEL
from ..store.schema import enter_psycopg
from .faults import Faults
from .protocol import RequestHeader

log = logging.getLogger("idempotency_lab.faultproxy")

DEFAULT_NAME = "default"
CHANNEL = FAULT_PROXY_CHANNEL
TABLE = f"{CONTROL_SCHEMA}.fault_proxies"
HEARTBEAT_EVERY = 1.0
POLL_EVERY = 0.5


class ControlledFaults(Faults):
    """Faults armed through ``lab_control.fault_proxies``, reported back there and to the timeline."""

    def __init__(self, database_url: str, name: str, listen: str, upstream: str):
        super().__init__()
        self.conninfo = psycopg_conninfo(database_url)
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.lab: str | None = None
        self.seen_version = 0
        self.seen_cut_version = 0
        self._control: psycopg.AsyncConnection | None = None
        self._faults: psycopg.AsyncConnection | None = None
        # Drop claims and timeline writes share one connection; one transaction at a time.
        self._faults_lock = asyncio.Lock()
        self._delayed_unreported = 0
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Register this proxy, disarmed, and start following its control row."""
        self._control = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        self._faults = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        # A proxy starts disarmed: a fault armed for a previous run must not fire on a fresh one.
        await self._control.execute(
            f"INSERT INTO {TABLE} (name, listen, upstream, host, pid, started_at, heartbeat_at) "
            "VALUES (%(name)s, %(listen)s, %(upstream)s, %(host)s, %(pid)s, now(), now()) "
            "ON CONFLICT (name) DO UPDATE SET listen = EXCLUDED.listen, upstream = EXCLUDED.upstream, "
            "host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = now(), heartbeat_at = now(), "
            "drop_produce_responses = 0, delay_ms = 0, seen_version = fault_proxies.version, connections = 0, "
            "seen_cut_version = fault_proxies.cut_version, connections_cut = 0, "
            "produce_requests = 0, responses_dropped = 0, responses_delayed = 0, "
            "blocked_commits = '{}', commits_blocked = 0, blocked_seen = '[]'",
            {"name": self.name, "listen": self.listen, "upstream": self.upstream,
             "host": socket.gethostname(), "pid": os.getpid()})
        await self._control.execute(f"LISTEN {CHANNEL}")
        await self.refresh()
        self._task = asyncio.create_task(self._follow(), name="fault-proxy-control")

    async def refresh(self) -> None:
        """Read the control row; acknowledge a new setting by its version."""
        row = await (await self._control.execute(
            f"SELECT lab, drop_produce_responses, delay_ms, version, cut_version, cut_client_ids, seen_cut_version, "
            # a block ends at its time on the database's clock, the same clock that set it
            "ARRAY(SELECT key FROM jsonb_each_text(blocked_commits) WHERE value::float8 > extract(epoch FROM now())) "
            f"FROM {TABLE} WHERE name = %s", [self.name])).fetchone()
        if row is None:
            return
        lab, drop, delay, version, cut_version, cut_client_ids, seen_cut_version, blocked = row
        self.blocked_commit_clients = frozenset(blocked)
        if not self.seen_cut_version:
            self.seen_cut_version = seen_cut_version  # a cut asked for before this proxy started is not ours
        if cut_version != self.seen_cut_version:
            await self._cut(cut_version, list(cut_client_ids or []))
        self.lab, self.drop_produce_responses, self.delay_ms = lab, drop, delay
        if version != self.seen_version:
            self.seen_version = version
            # Which blocked clients pass through here: one that goes straight to the broker cannot be blocked.
            seen = sorted(self.blocked_commit_clients & self.connected_clients())
            await self._control.execute(f"UPDATE {TABLE} SET seen_version = %s, blocked_seen = %s WHERE name = %s",
                                        [version, Jsonb(seen), self.name])
            log.info("armed by lab %s: drop the next %s Produce response(s), delay %s ms; block the offset "
                     "commits of %s", lab, drop, delay, ", ".join(sorted(blocked)) or "no client")

    async def _cut(self, cut_version: int, client_ids: list[str]) -> None:
        """Close every client connection of ``client_ids`` (chaos: a broken network path), once per version."""
        count = self.cut_clients(client_ids) if self.cut_clients is not None else 0
        self.seen_cut_version = cut_version
        self.connections_cut += count
        await self._control.execute(
            f"UPDATE {TABLE} SET seen_cut_version = %s, connections_cut = connections_cut + %s WHERE name = %s",
            [cut_version, count, self.name])
        log.info("cut %s connection(s) of %s", count, ", ".join(client_ids))

    async def _follow(self) -> None:
        last_heartbeat = 0.0
        while True:
            try:
                # A notification wakes us at once; the timeout is the poll, in case one was missed.
                async for _ in self._control.notifies(timeout=POLL_EVERY, stop_after=1):
                    pass
                await self.refresh()
                if time.monotonic() - last_heartbeat >= HEARTBEAT_EVERY:
                    last_heartbeat = time.monotonic()
                    await self._heartbeat()
                    await self._report_delays()
            except psycopg.Error as error:
                # The database may restart under us: keep forwarding traffic, reconnect and carry on.
                log.warning("control connection: %s; reconnecting", error)
                await asyncio.sleep(1)
                await self._reconnect_control()

    async def _reconnect_control(self) -> None:
        try:
            await self._control.close()
            self._control = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
            await self._control.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as error:
            log.warning("still no database: %s", error)

    async def _heartbeat(self) -> None:
        await self._control.execute(
            f"UPDATE {TABLE} SET heartbeat_at = now(), connections = %s, produce_requests = %s, "
            "responses_delayed = %s, commits_blocked = %s WHERE name = %s",
            [self.connections, self.produce_requests, self.responses_delayed, self.commits_blocked, self.name])

    async def _report_delays(self) -> None:
        """One timeline entry per second for delayed responses, not one per response."""
        if not self._delayed_unreported:
            return
        count, self._delayed_unreported = self._delayed_unreported, 0
        await self._record(f"fault proxy delayed {count} Produce response(s) by {self.delay_ms} ms",
                           responses=count, delay_ms=self.delay_ms)

    def delay_for(self, request: RequestHeader) -> float:
        seconds = super().delay_for(request)
        if seconds:
            self._delayed_unreported += 1
        return seconds

    async def take_drop(self, request: RequestHeader) -> bool:
        if self.drop_produce_responses <= 0:
            return False  # the common, disarmed case never touches the database
        try:
            async with self._faults_lock:
                # The row is the truth: exactly N drops however many connections race for them.
                row = await (await self._faults.execute(
                    f"UPDATE {TABLE} SET drop_produce_responses = drop_produce_responses - 1, "
                    "responses_dropped = responses_dropped + 1 "
                    "WHERE name = %s AND drop_produce_responses > 0 RETURNING lab, drop_produce_responses",
                    [self.name])).fetchone()
        except psycopg.Error as error:
            # Without the database no drop can be accounted for: pass the response on.
            log.warning("cannot claim a drop: %s", error)
            await self._reconnect_faults()
            return False
        if row is None:
            self.drop_produce_responses = 0
            return False
        self.lab, self.drop_produce_responses = row
        self.responses_dropped += 1
        return True

    async def dropped(self, request: RequestHeader, peer: str) -> None:
        await super().dropped(request, peer)
        left = self.drop_produce_responses
        await self._record(
            f"fault proxy dropped the response to a Produce request (correlation id {request.correlation_id}) "
            f"and closed the producer's connection: the broker wrote the record, the producer never heard; "
            f"librdkafka will retry ({left} more to drop)",
            correlation_id=request.correlation_id, api_version=request.api_version,
            client_id=request.client_id, drops_left=left)

    async def commit_blocked(self, request: RequestHeader, peer: str) -> None:
        await super().commit_blocked(request, peer)
        await self._record(
            f"fault proxy closed {request.client_id}'s connection carrying an OffsetCommit (correlation id "
            f"{request.correlation_id}): the broker never saw the commit, the group's committed offset did not move",
            correlation_id=request.correlation_id, client_id=request.client_id)

    async def _record(self, summary: str, **detail) -> None:
        """Append a 'fault' entry to the timeline of the lab that armed the proxy."""
        if not self.lab:
            return
        try:
            schema = Lab(self.lab).schema
        except InvalidLabName:
            return
        statements: list[tuple[str, dict]] = []
        timeline.record(lambda sql, params: statements.append((sql, params)), "fault", summary,
                        proxy=self.name, **detail)
        try:
            async with self._faults_lock:
                async with self._faults.transaction():
                    await enter_psycopg(self._faults, schema)
                    for sql, params in statements:
                        await self._faults.execute(sql, params)
        except psycopg.Error as error:
            # The lab may have been reset meanwhile; the fault happened all the same.
            log.warning("could not write to lab %s's timeline: %s", self.lab, error)
            if self._faults.broken:
                await self._reconnect_faults()

    async def _reconnect_faults(self) -> None:
        try:
            await self._faults.close()
            self._faults = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        except psycopg.Error as error:
            log.warning("still no database: %s", error)

    async def close(self) -> None:
        """Report the proxy gone, so arming it fails fast instead of waiting for a heartbeat."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        try:
            await self._report_delays()
            await self._faults.execute(
                f"UPDATE {TABLE} SET heartbeat_at = NULL, pid = NULL, connections = 0 WHERE name = %s AND pid = %s",
                [self.name, os.getpid()])
        except psycopg.Error as error:
            log.warning("could not report the proxy stopped: %s", error)
        for conn in (self._control, self._faults):
            if conn is not None:
                await conn.close()


def ensure_control_table(database_url: str) -> None:
    """Bring the control schema (this table included) to head when the proxy starts before the agent."""
    from ..store.migrations import upgrade

    upgrade(database_url)
