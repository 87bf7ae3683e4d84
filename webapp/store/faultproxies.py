"""``lab_control.fault_proxies`` and ``fault_proxy_labs``: what each lab asks of the lost-ack fault
proxy, and what the proxy reports.

Every lab's faults are its own row in ``fault_proxy_labs``: a function here that reads or changes
faults takes the lab, and touches that lab's row only. Any change bumps the proxy's ``version``
in the same transaction; the proxy acknowledges the version it read (``taken``).
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, Engine, func, select, text, update
from sqlalchemy.dialects.postgresql import insert

from ..domain.vocabulary import FAULT_PROXY_CHANNEL
from ..domain.waits import wait_until
from .tables import fault_proxies as proxies
from .tables import fault_proxy_labs as lab_faults

# What a lab reads of its own row when it has none yet: nothing armed, nothing counted.
UNARMED = {"drop_produce_responses": 0, "delay_ms": 0, "connections": 0, "produce_requests": 0,
           "responses_dropped": 0, "responses_delayed": 0, "commits_blocked": 0, "connections_cut": 0}


def fresh(seconds: float):
    """The proxy reported within ``seconds``."""
    return proxies.c.heartbeat_at > func.now() - func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def report(conn: Connection, name: str, lab: str, fresh_seconds: float) -> dict[str, Any] | None:
    """The proxy's process (running, where, heartbeat age) and ``lab``'s own faults and counters;
    None when no proxy ``name`` ever reported. Nothing of another lab's row."""
    row = conn.execute(select(proxies.c.name, proxies.c.listen, proxies.c.upstream,
                              func.coalesce(fresh(fresh_seconds), False).label("running"),
                              func.extract("epoch", func.now() - proxies.c.heartbeat_at).label("heartbeat_age"))
                       .where(proxies.c.name == name)).mappings().first()
    if row is None:
        return None
    own = conn.execute(select(*(lab_faults.c[key] for key in UNARMED))
                       .where(lab_faults.c.proxy == name, lab_faults.c.lab == lab)).mappings().first()
    return {**dict(row), **UNARMED, **(dict(own) if own else {})}


def _bump(conn: Connection, name: str, fresh_seconds: float) -> int | None:
    """A new setting's version for a running proxy; None when none runs (nothing changes then)."""
    return conn.execute(update(proxies).where(proxies.c.name == name, fresh(fresh_seconds))
                        .values(version=proxies.c.version + 1).returning(proxies.c.version)).scalar()


def _upsert(conn: Connection, name: str, lab: str, **values: Any) -> dict[str, Any]:
    """Set ``values`` (which may refer to the row's columns) on the lab's row, created unarmed
    first if missing; the row as it is now."""
    conn.execute(insert(lab_faults).values(proxy=name, lab=lab).on_conflict_do_nothing())
    return dict(conn.execute(update(lab_faults).where(lab_faults.c.proxy == name, lab_faults.c.lab == lab)
                             .values(**values).returning(lab_faults)).mappings().one())


def arm(conn: Connection, name: str, lab: str, drops: int, delay_ms: int, fresh_seconds: float) -> int | None:
    """Ask a running proxy for new Produce faults on ``lab``'s requests; the setting's version, or
    None when no proxy runs."""
    version = _bump(conn, name, fresh_seconds)
    if version is not None:
        _upsert(conn, name, lab, drop_produce_responses=drops, delay_ms=delay_ms, armed_at=func.now())
    return version


def notify(conn: Connection, channel: str, name: str) -> None:
    conn.execute(text("SELECT pg_notify(:channel, :name)"), {"channel": channel, "name": name})


def forget_lab(conn: Connection, lab: str, channel: str = FAULT_PROXY_CHANNEL) -> None:
    """A lab being reset or dropped: its faults end at every proxy (a new consumer of the same
    name must not inherit its predecessor's block, a new lab no delay), without waiting."""
    names = conn.execute(lab_faults.delete().where(lab_faults.c.lab == lab).returning(lab_faults.c.proxy)
                         ).scalars().all()
    for name in sorted(set(names)):
        conn.execute(update(proxies).where(proxies.c.name == name).values(version=proxies.c.version + 1))
        notify(conn, channel, name)


def blocked_seen(conn: Connection, name: str, lab: str) -> list[str]:
    """The lab's blocked clients that had a connection through the proxy when it took its last setting."""
    return list(conn.execute(select(lab_faults.c.blocked_seen).where(lab_faults.c.proxy == name,
                                                                     lab_faults.c.lab == lab)).scalar() or [])


def taken(conn: Connection, name: str, version: int) -> bool:
    """The proxy acknowledged setting ``version``."""
    return bool(conn.execute(select(proxies.c.seen_version >= version).where(proxies.c.name == name)).scalar())


def cut(conn: Connection, name: str, lab: str, client_ids: list[str], fresh_seconds: float) -> int | None:
    """Ask a running proxy to close the connections of ``client_ids``, clients of ``lab`` (chaos);
    the request's version of the lab's cuts, or None when no proxy runs."""
    if _bump(conn, name, fresh_seconds) is None:
        return None
    return _upsert(conn, name, lab, cut_version=lab_faults.c.cut_version + 1,
                   cut_client_ids=list(client_ids))["cut_version"]


CUT_TIMEOUT = 5.0  # seconds for the proxy to carry out a cut


def cut_and_wait(engine: Engine, name: str, lab: str, client_ids: list[str], fresh_seconds: float,
                 timeout: float = CUT_TIMEOUT) -> int | None:
    """Ask the running proxy to close the connections of ``client_ids`` (clients of ``lab``) and
    wait until it has: how many it closed; None when no proxy runs. WaitTimeout when it did not
    carry the cut out within ``timeout``."""
    with engine.begin() as conn:
        before = conn.execute(select(lab_faults.c.connections_cut)
                              .where(lab_faults.c.proxy == name, lab_faults.c.lab == lab)).scalar() or 0
        version = cut(conn, name, lab, client_ids, fresh_seconds)
        if version is None:
            return None
        notify(conn, FAULT_PROXY_CHANNEL, name)

    def carried_out() -> tuple[int] | None:
        with engine.connect() as conn:
            total = connections_cut(conn, name, lab, version)
        return None if total is None else (total,)  # a tuple: a cut of 0 connections is carried out too
    (total,) = wait_until(carried_out, timeout=timeout, interval=0.05,
                          message=f"the fault proxy did not carry out the cut within {timeout:g} s")
    return total - int(before)


def connections_cut(conn: Connection, name: str, lab: str, version: int) -> int | None:
    """The proxy's count of the lab's cut connections once it carried out the lab's cut
    ``version``; None before."""
    row = conn.execute(select(lab_faults.c.seen_cut_version, lab_faults.c.connections_cut)
                       .where(lab_faults.c.proxy == name, lab_faults.c.lab == lab)).first()
    return int(row.connections_cut) if row is not None and row.seen_cut_version >= version else None


def block_commits(conn: Connection, name: str, lab: str, client_id: str, seconds: float | None,
                  fresh_seconds: float) -> int | None:
    """Block (for ``seconds``) or, with None, unblock the offset commits of ``client_id``, a
    consumer of ``lab``; the setting's version, or None when no proxy runs. The end time is on the
    database's clock, which the proxy reads it by."""
    blocked = lab_faults.c.blocked_commits
    if seconds is None:
        value = blocked.op("-")(client_id)
    else:
        until = func.extract("epoch", func.now()) + seconds
        value = blocked.op("||")(func.jsonb_build_object(client_id, until))
    version = _bump(conn, name, fresh_seconds)
    if version is not None:
        _upsert(conn, name, lab, blocked_commits=value, armed_at=func.now())
    return version


def blocked_commits_of(conn: Connection, name: str | None, lab: str, client_prefix: str) -> dict[str, float]:
    """The lab's consumers whose offset commits are blocked now by proxy ``name`` (by any, with
    None), by the rest of their client id after ``client_prefix`` (the consumer's name), with the
    seconds left."""
    rows = conn.execute(text(
        "SELECT key, value::float8 - extract(epoch FROM now()) FROM lab_control.fault_proxy_labs, "
        "jsonb_each_text(blocked_commits) WHERE (CAST(:name AS text) IS NULL OR proxy = :name) AND lab = :lab "
        "AND value::float8 > extract(epoch FROM now()) ORDER BY key"), {"name": name, "lab": lab}).all()
    return {client[len(client_prefix):]: float(left) for client, left in rows if client.startswith(client_prefix)}
