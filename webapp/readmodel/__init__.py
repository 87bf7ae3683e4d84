"""What panels and ``GET /api/v1/state`` show: one module per panel, the verdict, ``why`` per anomaly.
May import summary, store, strategies and domain; never ops (callers pass what an operation answers).

Per panel: partitions, consumers, dedup, accounts, lanes, chart, timeline, drilldown,
producer_duplicates, health (the agent's), chaos, outbox, ordering, notifications, scale; shared:
groups (the groups and the copies of the accounts they apply to), fingerprints (what changed, for
the live dashboard); state (the lab's accounts and verdict); verdict (ground truth from the log vs
actual, in SQL) and why (one sentence per anomaly)."""
