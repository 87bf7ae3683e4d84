"""Regressed sets (a set applied after a newer set of the same account and kind, an older value
written over a newer one) and changed sets (a set whose redelivery changed the row). Common table
expressions the verdict counts them with (verdict.py) and the whys name them from (why.py)."""
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


# A set is idempotent only if every value it writes comes from its event (source text 000:
# `UPDATE orders SET status = 'PAID', paid_at = ?`). Each account's latest status transaction in the
# log, applied more than once, whose account holds its status but not its time: the row changed at
# a redelivery (status_at = now(), the time of each application), a set that is not idempotent.
# The status itself differing is a mismatch or a regression, counted and explained as such.
CHANGED_SETS = """
latest_status AS (
    SELECT DISTINCT ON (account_id) account_id, transaction_id, status, occurred_at, partition, "offset"
    FROM {journal}.log_records WHERE first_of_transaction AND type = 'set_status' AND invalid_reason IS NULL
    ORDER BY account_id, partition DESC, "offset" DESC
),
changed AS (
    SELECT s.*, a.status_at,
           (SELECT count(*) FROM deliveries d WHERE d.transaction_id = s.transaction_id AND d.outcome = 'applied')
               AS applications
    FROM latest_status s JOIN accounts a ON a.id = s.account_id
    WHERE a.status = s.status AND a.status_at IS DISTINCT FROM s.occurred_at::timestamptz
)"""
