"""Regressed sets: a set applied after a newer set of the same account and kind, an older value
written over a newer one. A common table expression the verdict counts them with (verdict.py) and
the whys name them from (why.py)."""
from __future__ import annotations

# Set deliveries applied after a newer set of the same account and kind had been applied: an
# older value written over a newer one (idempotent is not commutative). "Newer" is the truth's
# order: a transaction's first record in the log, by (partition, offset), as latest_set reads it
# (accounts.py). One ordered pass over the applied set deliveries, per account and kind.
REGRESSED_SETS = """
applied AS (
    SELECT d.id, d.consumer, d.generation, d.strategy, d.partition, d."offset", r.account_id, r.type,
           r.transaction_id, r.status, r.balance_cents, r.score,
           f.partition::bigint * 1099511627776 + f."offset" AS place,  -- 2^40: (partition, offset) as one number
           count(*) OVER (PARTITION BY r.transaction_id) AS applications
    FROM deliveries d
    JOIN {journal}.log_records r ON r.partition = d.partition AND r."offset" = d."offset"
    JOIN {journal}.log_records f ON f.transaction_id = r.transaction_id AND f.first_of_transaction
    WHERE d.outcome = 'applied' AND r.type IN ('set_status', 'set_balance', 'set_score') AND r.invalid_reason IS NULL
),
ordered AS (
    SELECT *, max(place) OVER (PARTITION BY account_id, type ORDER BY id
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS newest_before
    FROM applied
),
regressions AS (SELECT * FROM ordered WHERE newest_before > place)"""
