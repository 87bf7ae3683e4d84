"""Ground truth vs actual, computed in PostgreSQL from what the lab produced and what was applied.

Ground truth is what exactly-once delivery would give: each distinct ``transaction_id`` in the
journal credited once. The queries run in an effects schema (the lab's, or a lane's) and read
the journal from the lab's schema, so lanes are judged against the same stream.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

# Credits the lab published with a delivery report and no error: one row per transaction.
TRUTH = """
truth AS (
    SELECT DISTINCT ON (transaction_id) transaction_id, account_id, amount_cents
    FROM {journal}.published_events
    WHERE type = 'credit' AND error IS NULL
    ORDER BY transaction_id, id
)"""

# Effects per transaction: payment rows (delta strategies) plus ledger rows (natural).
EFFECTS = """
effects AS (
    SELECT transaction_id, count(*) AS n FROM (
        SELECT transaction_id FROM payments
        UNION ALL
        SELECT j.transaction_id FROM ledger l
        JOIN (SELECT DISTINCT event_id, transaction_id FROM {journal}.published_events) j USING (event_id)
    ) e GROUP BY transaction_id
)"""

ACCOUNTS_SQL = f"""
WITH {TRUTH},
expected AS (SELECT account_id, sum(amount_cents) AS cents FROM truth GROUP BY account_id),
ledger_sum AS (SELECT account_id, sum(amount_cents) AS cents FROM ledger GROUP BY account_id),
expected_status AS (
    SELECT DISTINCT ON (account_id) account_id, status FROM {{journal}}.published_events
    WHERE type = 'set_status' AND error IS NULL ORDER BY account_id, id DESC
)
SELECT a.id, a.owner, (a.balance + coalesce(l.cents, 0))::bigint AS actual, coalesce(e.cents, 0)::bigint AS expected,
       a.status, coalesce(s.status, 'ACTIVE') AS expected_status
FROM accounts a
LEFT JOIN expected e ON e.account_id = a.id
LEFT JOIN ledger_sum l ON l.account_id = a.id
LEFT JOIN expected_status s ON s.account_id = a.id
ORDER BY a.id
"""

VERDICT_SQL = f"""
WITH {TRUTH}, {EFFECTS},
sources AS (
    SELECT transaction_id, count(DISTINCT event_id) AS events FROM {{journal}}.published_events
    WHERE type = 'credit' AND error IS NULL GROUP BY transaction_id
),
consumed AS (
    -- a credit's record is behind the committed offset of a group applying to this schema
    SELECT DISTINCT j.transaction_id FROM {{journal}}.published_events j
    JOIN {{journal}}.group_offsets g ON g.partition = j.partition AND g.committed > j."offset"
    JOIN {{journal}}.consumer_groups cg ON cg.group_id = g.group_id AND cg.effects_schema = current_schema()
    WHERE j.type = 'credit' AND j.error IS NULL
)
SELECT
    (SELECT count(*) FROM truth) AS transactions,
    (SELECT coalesce(sum(e.n - 1), 0) FROM effects e) AS duplicates_applied,
    (SELECT count(*) FROM effects WHERE n > 1) AS transactions_applied_twice,
    (SELECT count(*) FROM truth t JOIN consumed c USING (transaction_id)
       LEFT JOIN effects e USING (transaction_id) WHERE e.n IS NULL) AS effects_lost,
    (SELECT count(*) FROM sources s JOIN effects e USING (transaction_id)
       WHERE s.events > 1 AND e.n = 1) AS source_duplicates_absorbed,
    (SELECT count(*) FROM sources WHERE events > 1) AS source_duplicates,
    (SELECT count(*) FROM deliveries WHERE outcome = 'absorbed') AS redeliveries_absorbed,
    (SELECT count(*) FROM deliveries WHERE outcome = 'dead-lettered') AS dead_letters,
    (SELECT count(*) FROM truth t LEFT JOIN effects e USING (transaction_id) WHERE e.n IS NULL) AS not_yet_applied
"""


@dataclass(frozen=True)
class Verdict:
    transactions: int
    duplicates_applied: int
    transactions_applied_twice: int
    effects_lost: int
    source_duplicates_absorbed: int
    source_duplicates: int
    redeliveries_absorbed: int
    dead_letters: int
    not_yet_applied: int

    @property
    def exactly_once(self) -> bool:
        """True when no effect was doubled and none was lost."""
        return self.duplicates_applied == 0 and self.effects_lost == 0

    def as_dict(self) -> dict:
        return {**asdict(self), "exactly_once": self.exactly_once}


@dataclass(frozen=True)
class AccountLine:
    id: str
    owner: str
    actual: int
    expected: int
    status: str
    expected_status: str

    @property
    def difference(self) -> int:
        return self.actual - self.expected

    @property
    def ok(self) -> bool:
        return self.difference == 0 and self.status == self.expected_status


def _journal(journal_schema: str) -> str:
    return f'"{journal_schema}"'


def accounts(session: Session, journal_schema: str) -> list[AccountLine]:
    rows = session.execute(text(ACCOUNTS_SQL.format(journal=_journal(journal_schema)))).all()
    return [AccountLine(*row) for row in rows]


def verdict(session: Session, journal_schema: str) -> Verdict:
    row = session.execute(text(VERDICT_SQL.format(journal=_journal(journal_schema)))).one()
    return Verdict(*(int(value) for value in row))
