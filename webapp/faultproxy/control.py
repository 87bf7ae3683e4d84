"""The fault proxy's control rows in PostgreSQL (ControlledFaults): each lab's faults in its row of
``lab_control.fault_proxy_labs``, the proxy's own report in ``lab_control.fault_proxies``.

Control goes through PostgreSQL so it works across containers: a lab writes its row
(operations.arm_fault_proxy, block_commits, chaos's cuts; webapp/store/faultproxies.py), bumps the
proxy's version and NOTIFYs; the proxy LISTENs (and polls, in case a notification is missed),
acknowledges each setting by its version, reports counters with a heartbeat (each lab's in its
row), and writes every injected fault to the timeline of the lab whose client it hit: faults act
only on the clients of the lab that armed them, so that is the lab that armed it.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import time

import psycopg
from psycopg.types.json import Jsonb

from ..domain.lab import Lab
from ..domain.vocabulary import FAULT_PROXY_CHANNEL
from ..store import timeline
from ..store.connection import CONTROL_SCHEMA, psycopg_conninfo
from ..store.schema import enter_psycopg
from .faults import Faults, lab_of
from .protocol import RequestHeader

log = logging.getLogger("idempotency_lab.faultproxy")

DEFAULT_NAME = "default"
CHANNEL = FAULT_PROXY_CHANNEL
TABLE = f"{CONTROL_SCHEMA}.fault_proxies"
LAB_TABLE = f"{CONTROL_SCHEMA}.fault_proxy_labs"
HEARTBEAT_EVERY = 1.0
POLL_EVERY = 0.5


class ControlledFaults(Faults):
    """Faults armed through ``lab_control.fault_proxy_labs`` (a row per lab), reported back there,
    the whole proxy's counters in ``lab_control.fault_proxies``, each injected fault on the
    timeline of the lab whose client it hit (the lab that armed it)."""

    def __init__(self, database_url: str, name: str, listen: str, upstream: str):
        super().__init__()
        self.conninfo = psycopg_conninfo(database_url)
        self.name = name
        self.listen = listen
        self.upstream = upstream
        self.seen_version = 0
        self._control: psycopg.AsyncConnection | None = None
        self._faults: psycopg.AsyncConnection | None = None
        # Drop claims and timeline writes share one connection; one transaction at a time.
        self._faults_lock = asyncio.Lock()
        self._delayed_unreported: dict[str, int] = {}  # lab -> responses delayed since the last report
        self._rows: set[str] = set()  # the labs whose row this proxy read at its last refresh
        self._reported: dict[str, tuple[int, ...]] = {}  # lab -> the counters last written to its row
        self._task: asyncio.Task | None = None

    async def start(self) -> None:
        """Register this proxy, every lab disarmed, and start following the control rows."""
        self._control = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        self._faults = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
        # A proxy starts disarmed: a fault armed for a previous run must not fire on a fresh one.
        async with self._control.transaction():
            await self._control.execute(f"DELETE FROM {LAB_TABLE} WHERE proxy = %s", [self.name])
            await self._control.execute(
                f"INSERT INTO {TABLE} (name, listen, upstream, host, pid, started_at, heartbeat_at) "
                "VALUES (%(name)s, %(listen)s, %(upstream)s, %(host)s, %(pid)s, now(), now()) "
                "ON CONFLICT (name) DO UPDATE SET listen = EXCLUDED.listen, upstream = EXCLUDED.upstream, "
                "host = EXCLUDED.host, pid = EXCLUDED.pid, started_at = now(), heartbeat_at = now(), "
                "seen_version = fault_proxies.version, connections = 0, connections_cut = 0, "
                "produce_requests = 0, responses_dropped = 0, responses_delayed = 0, commits_blocked = 0",
                {"name": self.name, "listen": self.listen, "upstream": self.upstream,
                 "host": socket.gethostname(), "pid": os.getpid()})
        await self._control.execute(f"LISTEN {CHANNEL}")
        await self.refresh()
        self._task = asyncio.create_task(self._follow(), name="fault-proxy-control")

    async def refresh(self) -> None:
        """Read every lab's row; acknowledge a new setting by its version."""
        # The version first: a lab's row written with a version up to it is visible to the next read.
        version = await (await self._control.execute(
            f"SELECT version FROM {TABLE} WHERE name = %s", [self.name])).fetchone()
        if version is None:
            return
        (version,) = version
        rows = await (await self._control.execute(
            f"SELECT lab, drop_produce_responses, delay_ms, cut_version, cut_client_ids, seen_cut_version, "
            # a block ends at its time on the database's clock, the same clock that set it
            "ARRAY(SELECT key FROM jsonb_each_text(blocked_commits) WHERE value::float8 > extract(epoch FROM now())), "
            f"blocked_seen FROM {LAB_TABLE} WHERE proxy = %s", [self.name])).fetchall()
        present = {row[0] for row in rows}
        for lab in [lab for lab in self.labs if lab not in present]:
            if lab in self._rows:
                # Its row was deleted (the lab was reset or dropped): its faults and counts end.
                del self.labs[lab]
                self._reported.pop(lab, None)
                self._delayed_unreported.pop(lab, None)
            else:
                self.labs[lab].disarm()
        self._rows = present
        seen_changes = []
        for lab, drop, delay, cut_version, cut_client_ids, seen_cut_version, blocked, blocked_seen in rows:
            self.arm(lab, drop, delay)
            self.block_commits(lab, set(blocked))
            if cut_version != seen_cut_version:
                await self._cut(lab, cut_version, list(cut_client_ids or []))
            # Which blocked clients pass through here: one that goes straight to the broker cannot be blocked.
            seen = sorted(self.labs[lab].blocked_commit_clients & set(self.connected_clients()))
            if version != self.seen_version and seen != blocked_seen:
                seen_changes.append((lab, seen))
        if version != self.seen_version:
            self.seen_version = version
            async with self._control.transaction():
                for lab, seen in seen_changes:
                    await self._control.execute(f"UPDATE {LAB_TABLE} SET blocked_seen = %s WHERE proxy = %s "
                                                "AND lab = %s", [Jsonb(seen), self.name, lab])
                await self._control.execute(f"UPDATE {TABLE} SET seen_version = %s WHERE name = %s",
                                            [version, self.name])
            for lab, faults in sorted(self.labs.items()):
                if faults.armed:
                    log.info("armed by lab %s: drop its next %s Produce response(s), delay them %s ms; block the "
                             "offset commits of %s", lab, faults.drop_produce_responses, faults.delay_ms,
                             ", ".join(sorted(faults.blocked_commit_clients)) or "no client")

    async def _cut(self, lab: str, cut_version: int, client_ids: list[str]) -> None:
        """Close every connection of ``client_ids``, clients of ``lab`` (chaos: a broken network
        path), once per version of the lab's cuts."""
        count = self.cut(lab, client_ids)
        await self._control.execute(
            f"UPDATE {LAB_TABLE} SET seen_cut_version = %s, connections_cut = connections_cut + %s "
            "WHERE proxy = %s AND lab = %s", [cut_version, count, self.name, lab])
        log.info("cut %s connection(s) of lab %s's %s", count, lab, ", ".join(client_ids))

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
        """The proxy alive and its totals; each lab's counters in its row, when they changed."""
        await self._control.execute(
            f"UPDATE {TABLE} SET heartbeat_at = now(), connections = %s, produce_requests = %s, "
            "responses_dropped = %s, responses_delayed = %s, commits_blocked = %s, connections_cut = %s "
            "WHERE name = %s",
            [self.connections, self.produce_requests, self.responses_dropped, self.responses_delayed,
             self.commits_blocked, self.connections_cut, self.name])
        connected = collections.Counter(lab_of(client) for client in self.connected_clients())
        for lab, faults in list(self.labs.items()):
            counts = (connected[lab], faults.produce_requests, faults.responses_delayed, faults.commits_blocked)
            if self._reported.get(lab) == counts:
                continue
            values = {"proxy": self.name, "lab": lab, "connections": counts[0], "produce_requests": counts[1],
                      "responses_delayed": counts[2], "commits_blocked": counts[3]}
            if lab in self._rows:
                await self._control.execute(
                    f"UPDATE {LAB_TABLE} SET connections = %(connections)s, produce_requests = %(produce_requests)s, "
                    "responses_delayed = %(responses_delayed)s, commits_blocked = %(commits_blocked)s "
                    "WHERE proxy = %(proxy)s AND lab = %(lab)s", values)
            else:  # a lab that armed nothing yet: its counters get a row of their own
                await self._control.execute(
                    f"INSERT INTO {LAB_TABLE} (proxy, lab, connections, produce_requests, responses_delayed, "
                    "commits_blocked) VALUES (%(proxy)s, %(lab)s, %(connections)s, %(produce_requests)s, "
                    "%(responses_delayed)s, %(commits_blocked)s) ON CONFLICT (proxy, lab) DO UPDATE SET "
                    "connections = EXCLUDED.connections, produce_requests = EXCLUDED.produce_requests, "
                    "responses_delayed = EXCLUDED.responses_delayed, commits_blocked = EXCLUDED.commits_blocked",
                    values)
            self._reported[lab] = counts

    async def _report_delays(self) -> None:
        """One timeline entry per lab per second for delayed responses, not one per response."""
        unreported, self._delayed_unreported = self._delayed_unreported, {}
        for lab, count in sorted(unreported.items()):
            delay_ms = self.labs[lab].delay_ms if lab in self.labs else 0
            await self._record(lab, f"fault proxy delayed {count} Produce response(s) by {delay_ms} ms",
                               responses=count, delay_ms=delay_ms)

    def delay_for(self, request: RequestHeader) -> float:
        seconds = super().delay_for(request)
        if seconds:
            lab = lab_of(request.client_id)
            self._delayed_unreported[lab] = self._delayed_unreported.get(lab, 0) + 1
        return seconds

    async def take_drop(self, request: RequestHeader) -> bool:
        faults = self.of_request(request)
        if faults is None or faults.drop_produce_responses <= 0:
            return False  # the common, disarmed case never touches the database
        lab = lab_of(request.client_id)
        try:
            async with self._faults_lock:
                # The lab's row is the truth: exactly N drops however many connections race for them.
                row = await (await self._faults.execute(
                    f"UPDATE {LAB_TABLE} SET drop_produce_responses = drop_produce_responses - 1, "
                    "responses_dropped = responses_dropped + 1 "
                    "WHERE proxy = %s AND lab = %s AND drop_produce_responses > 0 RETURNING drop_produce_responses",
                    [self.name, lab])).fetchone()
        except psycopg.Error as error:
            # Without the database no drop can be accounted for: pass the response on.
            log.warning("cannot claim a drop: %s", error)
            await self._reconnect_faults()
            return False
        if row is None:
            faults.drop_produce_responses = 0
            return False
        (faults.drop_produce_responses,) = row
        faults.responses_dropped += 1
        self.responses_dropped += 1
        return True

    async def dropped(self, request: RequestHeader, peer: str) -> None:
        await super().dropped(request, peer)
        lab = lab_of(request.client_id)
        left = self.labs[lab].drop_produce_responses if lab in self.labs else 0
        await self._record(
            lab, f"fault proxy dropped the response to a Produce request (correlation id {request.correlation_id}) "
            f"and closed the producer's connection: the broker wrote the record, the producer never heard; "
            f"librdkafka will retry ({left} more to drop)",
            correlation_id=request.correlation_id, api_version=request.api_version,
            client_id=request.client_id, drops_left=left)

    async def commit_blocked(self, request: RequestHeader, peer: str) -> None:
        await super().commit_blocked(request, peer)
        await self._record(
            lab_of(request.client_id),
            f"fault proxy closed {request.client_id}'s connection carrying an OffsetCommit (correlation id "
            f"{request.correlation_id}): the broker never saw the commit, the group's committed offset did not move",
            correlation_id=request.correlation_id, client_id=request.client_id)

    async def _record(self, lab: str | None, summary: str, **detail) -> None:
        """Append a 'fault' entry to ``lab``'s timeline: the lab whose client the fault hit, the one
        that armed it."""
        if not lab:
            return
        schema = Lab(lab).schema
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
            log.warning("could not write to lab %s's timeline: %s", lab, error)
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
