"""``lab_control.fault_proxies``: what the lab asks of the lost-ack fault proxy, and what it reports."""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, func, select, text, update

from ..domain.vocabulary import FAULT_PROXY_CHANNEL
from .tables import FaultProxy

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


def unblock_clients(conn: Connection, client_prefix: str, channel: str = FAULT_PROXY_CHANNEL) -> None:
    """End every commit block of the clients whose id starts with ``client_prefix`` (a lab being
    reset: a new consumer of the same name must not inherit its predecessor's block)."""
    rows = conn.execute(text(
        "UPDATE lab_control.fault_proxies SET version = version + 1, blocked_commits = coalesce("
        "(SELECT jsonb_object_agg(key, value) FROM jsonb_each(blocked_commits) WHERE NOT starts_with(key, :prefix)), "
        "'{}') WHERE EXISTS (SELECT 1 FROM jsonb_object_keys(blocked_commits) k WHERE starts_with(k, :prefix)) "
        "RETURNING name"), {"prefix": client_prefix}).scalars().all()
    for name in rows:
        notify(conn, channel, name)


def blocked_seen(conn: Connection, name: str) -> list[str]:
    """The blocked clients that had a connection through the proxy when it took its last setting."""
    return list(conn.execute(select(proxies.c.blocked_seen).where(proxies.c.name == name)).scalar() or [])


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


def block_commits(conn: Connection, name: str, lab: str, client_id: str, seconds: float | None,
                  fresh_seconds: float) -> int | None:
    """Block (for ``seconds``) or, with None, unblock the offset commits of ``client_id``; the
    setting's version, or None when no proxy runs. The end time is on the database's clock, which
    the proxy reads it by."""
    blocked = proxies.c.blocked_commits
    if seconds is None:
        value = blocked.op("-")(client_id)
    else:
        until = func.extract("epoch", func.now()) + seconds
        value = blocked.op("||")(func.jsonb_build_object(client_id, until))
    return conn.execute(update(proxies).where(proxies.c.name == name, fresh(fresh_seconds))
                        .values(lab=lab, blocked_commits=value, version=proxies.c.version + 1, armed_at=func.now())
                        .returning(proxies.c.version)).scalar()


def blocked_commit_clients(conn: Connection, name: str | None = None) -> dict[str, float]:
    """The client ids whose offset commits are blocked now by proxy ``name`` (by any, with None),
    with the seconds left for each."""
    rows = conn.execute(text(
        "SELECT key, value::float8 - extract(epoch FROM now()) FROM lab_control.fault_proxies, "
        "jsonb_each_text(blocked_commits) WHERE (CAST(:name AS text) IS NULL OR name = :name) "
        "AND value::float8 > extract(epoch FROM now())"), {"name": name}).all()
    return {key: float(left) for key, left in rows}


def blocked_commits_of(conn: Connection, name: str | None, client_prefix: str) -> dict[str, float]:
    """Of the blocked clients, those whose id starts with ``client_prefix`` (one lab's consumers),
    by the rest of their id (the consumer's name), with the seconds left."""
    return {client[len(client_prefix):]: left for client, left in sorted(blocked_commit_clients(conn, name).items())
            if client.startswith(client_prefix)}
