"""The lanes panel: every copy of the accounts (the lab's own and each strategy lane's), balances
side by side, each with its first divergent event.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..store.schema import enter, quoted
from ..summary import reads as summary
from .groups import effects_schemas, groups_list


@dataclass
class Lane:
    """One copy of the accounts and the groups applying to it."""
    schema: str
    name: str
    groups: list[dict[str, Any]]
    balances: dict[str, int]  # account id -> actual cents
    first_divergence: dict[str, Any] | None

    @property
    def strategies(self) -> str:
        return ", ".join(sorted({g["strategy"] for g in self.groups})) or "no group"


def lanes(session: Session, lab: Lab, exact: bool = False) -> list[Lane]:
    """Every copy of the accounts (the lab's own and each lane's), balances side by side, each with
    its first divergent event (summary.first_divergence: from the running summaries when
    they are built, else, or when ``exact``, judged whole)."""
    groups = groups_list(session)
    schemas = effects_schemas(session, lab)
    summarized = not exact and summary.ready(session, lab.schema, schemas)
    result = []
    connection = session.connection()
    try:
        for schema in schemas:
            balances = dict(session.execute(text(
                f"SELECT a.id, (a.balance + coalesce((SELECT sum(amount_cents) FROM {quoted(schema)}.ledger l "
                f"WHERE l.account_id = a.id), 0))::bigint FROM {quoted(schema)}.accounts a ORDER BY a.id")).all())
            enter(connection, schema)  # the copy's own effects and summary
            first = summary.first_divergence(session, lab.schema, exact=not summarized)
            name = "lab" if schema == lab.schema else lab.lane_of(schema)
            result.append(Lane(schema, name, [g for g in groups if g["effects_schema"] == schema], balances, first))
    finally:
        enter(connection, lab.schema)
    return result
