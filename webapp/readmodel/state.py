"""The read model: what the panels and ``GET /api/v1/state`` show, read from PostgreSQL only.

Kafka facts arrive here through the lab agent (committed offsets in ``group_offsets``), the
consumers (positions in their control rows) and the log reader (``log_records``: every record of
the topic, whoever wrote it). The log-end offset is the log reader's: the last record it fetched,
never the broker's high watermark (wrong on Tansu for multi-record batches, docs/concepts/broker.md). The
journal (``published_events``) is shown beside the log as "what the lab asked to publish".

This module holds the lab's accounts and verdict (by ``Lab``); each panel has a module of its own:
partitions, consumers, dedup, lanes, chart, timeline, drilldown, producer_duplicates, health (the
agent's), fingerprints (what changed), groups (what they all start from). ``GET /api/v1/state``
puts them together in ops/reads.py.
"""
from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy.orm import Session

from ..domain.lab import Lab
from . import verdict as verdict_module


def accounts(session: Session, lab: Lab, exact: bool = False) -> list[verdict_module.AccountLine]:
    return verdict_module.accounts(session, lab.schema, exact=exact)


def verdict(session: Session, lab: Lab, exact: bool = False, explain: bool = True) -> verdict_module.Verdict:
    """The verdict of the current schema's accounts against the lab's log; ``explain`` False leaves
    out the why of each anomaly (a reader that shows only the counts, the class board)."""
    return verdict_module.verdict(session, lab.schema, explain=explain, exact=exact)


def now() -> datetime:
    return datetime.now(timezone.utc)
