"""The deduplication strategies, by name: each module holds its SQL text and ``apply``.
May import domain and notify's protocol; nothing of Flask or Kafka."""
from __future__ import annotations

from ..domain.vocabulary import ON_UNIQUE_VIOLATION
from . import (
    business_key,
    check_then_act,
    check_then_act_rr,
    eventid_atomic,
    eventid_split,
    insert_first,
    natural,
    natural_audit,
    natural_audit_keyed,
    natural_clock,
    none,
    payload_hash,
)
from .base import POINTS, Strategy

STRATEGIES: dict[str, Strategy] = {
    module.STRATEGY.name: module.STRATEGY
    for module in (none, check_then_act, check_then_act_rr, insert_first, eventid_atomic, eventid_split, business_key,
                   payload_hash, natural, natural_clock, natural_audit, natural_audit_keyed)
}
NAMES = tuple(STRATEGIES)


class UnknownStrategy(ValueError):
    pass


def get(name: str, partitioned: bool = False) -> Strategy:
    """The strategy ``name``; with ``partitioned``, its variant for a ``processed_events``
    partitioned by day (strategies/partitioned.py), for the strategies that claim in that table."""
    try:
        strategy = STRATEGIES[name]
    except KeyError:
        raise UnknownStrategy(f"strategy must be one of {', '.join(NAMES)}: {name!r}") from None
    if partitioned:
        from .partitioned import STRATEGIES as PARTITIONED
        return PARTITIONED.get(name, strategy)
    return strategy


__all__ = ["NAMES", "ON_UNIQUE_VIOLATION", "POINTS", "STRATEGIES", "Strategy", "UnknownStrategy", "get"]
