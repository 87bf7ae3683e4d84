"""What a scenario observes: one read of a lab from PostgreSQL, through the read model's panels and
verdict.py.

The same read model the panels use: consumers as they report themselves, the verdict and the
accounts (ground truth vs actual) of the lab and of each strategy lane, committed offsets as
the lab agent last read them from Kafka, the log end from the journal of delivery reports.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, text

from ..domain.lab import Lab
from ..readmodel import notifications as notifications_readmodel
from ..readmodel import ordering
from ..readmodel import partitions as partitions_readmodel
from ..readmodel import verdict as verdict_module
from ..readmodel.dedup import dedup_counts
from ..store.connection import CONTROL_SCHEMA
from ..store.schema import enter

C = CONTROL_SCHEMA


@dataclass
class Snapshot:
    consumers: dict[str, dict[str, Any]] = field(default_factory=dict)   # by name (newest row wins)
    consumers_by_id: dict[int, dict[str, Any]] = field(default_factory=dict)
    verdicts: dict[str | None, dict[str, Any]] = field(default_factory=dict)    # lane (None: the lab) -> verdict
    accounts: dict[str | None, dict[str, dict[str, Any]]] = field(default_factory=dict)
    dedup: dict[str | None, dict[str, dict[str, Any]]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)      # local name -> {strategy, schema, lane}
    committed: dict[str, dict[int, int | None]] = field(default_factory=dict)
    log_ends: dict[str | None, dict[int, int]] = field(default_factory=dict)
    partitions: int = 1
    notifications: dict[str, dict[str, Any]] = field(default_factory=dict)  # account -> sent, received, ...
    out_of_order: dict[str, int] = field(default_factory=dict)  # account -> records that landed out of order

    def log_end_total(self) -> int:
        """Records in the topic as the lab knows them: per partition, the furthest of the journal
        and of every lane's deliveries (an idempotent retry's report may carry no offset)."""
        ends: dict[int, int] = {}
        for lane_ends in self.log_ends.values():
            for partition, end in lane_ends.items():
                ends[partition] = max(ends.get(partition, 0), end)
        return sum(ends.values())

    def caught_up(self, group: str) -> bool:
        info = self.groups.get(group)
        if info is None:
            return False
        ends = self.log_ends.get(info["lane"], {})
        committed = self.committed.get(group, {})
        return bool(ends) and all((committed.get(p) or 0) >= end for p, end in ends.items() if end)

    def no_committed_offset(self, group: str) -> bool:
        """The lab's last reading of the group's offsets found none committed on any partition (and
        it has read them: a group never read is not judged)."""
        committed = self.committed.get(group, {})
        return bool(committed) and all(offset is None for offset in committed.values())


def observe(engine: Engine, lab: Lab, *, verdicts_only: bool = False) -> Snapshot:
    """Everything a scenario can wait on or expect, read in one transaction; with ``verdicts_only``
    the consumers and each lane's verdict and nothing else (what a session log entry keeps, read
    before every recorded operation)."""
    snap = Snapshot()
    with engine.connect() as conn:
        for row in conn.execute(text(
                f"SELECT id, name, group_id, state, assigned, applied, absorbed, dead_lettered, commit_failures, "
                f"step_at, step_mode, armed_point, last_error FROM {C}.consumers WHERE lab = :lab ORDER BY id"),
                {"lab": lab.name}).mappings():
            item = dict(row)
            item["assigned"] = list(item["assigned"] or [])
            snap.consumers[row["name"]] = item
            snap.consumers_by_id[row["id"]] = item
        exists = conn.execute(text("SELECT 1 FROM information_schema.tables WHERE table_schema = :s "
                                   "AND table_name = 'consumer_groups'"), {"s": lab.schema}).first()
        if exists is None:
            return snap
        enter(conn, lab.schema)
        if not verdicts_only:
            settings = dict(conn.execute(text("SELECT key, value FROM settings")).all())
            snap.partitions = int(settings.get("partitions", 1))
            snap.notifications = {row["account_id"]: row for row in notifications_readmodel.accounts(conn)}
            snap.out_of_order = ordering.by_account(conn)
        lanes: dict[str, str | None] = {lab.schema: None}
        for group_id, strategy, schema in conn.execute(text(
                "SELECT group_id, strategy, effects_schema FROM consumer_groups")):
            lane = lab.lane_of(schema)
            lanes[schema] = lane
            local = lab.local_group(group_id)
            snap.groups[local] = {"group_id": group_id, "strategy": strategy, "schema": schema, "lane": lane}
        if not verdicts_only:
            by_id = {info["group_id"]: local for local, info in snap.groups.items()}
            for group_id, partition, committed in conn.execute(text("SELECT group_id, partition, committed FROM group_offsets")):
                if group_id in by_id:
                    snap.committed.setdefault(by_id[group_id], {})[int(partition)] = committed
        for schema, lane in lanes.items():
            enter(conn, schema)
            snap.verdicts[lane] = verdict_module.verdict(conn, lab.schema).as_dict()
            if verdicts_only:
                continue
            snap.accounts[lane] = {line.id: {"actual": line.actual, "expected": line.expected, "status": line.status,
                                             "expected_status": line.expected_status, "difference": line.difference}
                                   for line in verdict_module.accounts(conn, lab.schema)}
            snap.dedup[lane] = dedup_counts(conn)
            enter(conn, lab.schema)
            snap.log_ends[lane] = partitions_readmodel.log_ends(conn, schema)
        conn.rollback()
    return snap


def as_dict(snap: Snapshot) -> dict[str, Any]:
    """A JSON-friendly view (for --json and the guided page)."""
    return {"consumers": snap.consumers, "verdicts": {str(k or ""): v for k, v in snap.verdicts.items()},
            "accounts": {str(k or ""): v for k, v in snap.accounts.items()},
            "dedup": {str(k or ""): v for k, v in snap.dedup.items()},
            "committed": snap.committed, "log_end": snap.log_end_total()}
