"""``lab_control.fault_proxies``: what the lab asks of the lost-ack fault proxy, and what it reports."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select, text, update

from ..models import FaultProxy

proxies = FaultProxy.__table__


def fresh(seconds: float):
    """The proxy reported within ``seconds``."""
    return proxies.c.heartbeat_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def report(conn: Connection, name: str, fresh_seconds: float) -> dict[str, Any] | None:
    row = conn.execute(select(proxies, func.coalesce(fresh(fresh_seconds), False).label("running"),
                              func.extract("epoch", func.now() - proxies.c.heartbeat_at).label("heartbeat_age"))
                       .where(proxies.c.name == name)).mappings().first()
    return dict(row) if row else None


def arm(conn: Connection, name: str, lab: str, drops: int, delay_ms: int, fresh_seconds: float) -> int | None:
    """Ask a running proxy for new faults; the setting's version, or None when no proxy runs."""
    return conn.execute(update(proxies).where(proxies.c.name == name, fresh(fresh_seconds))
                        .values(lab=lab, drop_produce_responses=drops, delay_ms=delay_ms,
                                version=proxies.c.version + 1, armed_at=func.now())
                        .returning(proxies.c.version)).scalar()


def notify(conn: Connection, channel: str, name: str) -> None:
    conn.execute(text("SELECT pg_notify(:channel, :name)"), {"channel": channel, "name": name})


def taken(conn: Connection, name: str, version: int) -> bool:
    """The proxy acknowledged setting ``version``."""
    return bool(conn.execute(select(proxies.c.seen_version >= version).where(proxies.c.name == name)).scalar())


def cut(conn: Connection, name: str, client_ids: list[str], fresh_seconds: float) -> int | None:
    """Ask a running proxy to close the connections of ``client_ids`` (chaos); the request's
    version, or None when no proxy runs."""
    return conn.execute(update(proxies).where(proxies.c.name == name, fresh(fresh_seconds))
                        .values(cut_version=proxies.c.cut_version + 1, cut_client_ids=list(client_ids))
                        .returning(proxies.c.cut_version)).scalar()


def connections_cut(conn: Connection, name: str, version: int) -> int | None:
    """The proxy's count of cut connections once it carried out cut ``version``; None before."""
    row = conn.execute(select(proxies.c.seen_cut_version, proxies.c.connections_cut)
                       .where(proxies.c.name == name)).first()
    return int(row.connections_cut) if row is not None and row.seen_cut_version >= version else None
