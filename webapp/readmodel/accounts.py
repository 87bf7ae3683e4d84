"""The accounts panel: each account's balance and status against what the log says they should be.

Expected is the log's truth (its first record of each transaction, the latest distinct set); actual
is the effects schema's ``accounts`` (and the natural strategy's ``ledger``). The verdict counts the
accounts that differ (verdict.py), and ``why`` names them.
"""
from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..store.schema import quoted
from ..summary import reads as summary

EXPECTED = """
latest_set AS (
    -- per account and kind of set: the latest distinct transaction (where its first record is),
    -- so re-sending or re-delivering an old one does not move it
    SELECT DISTINCT ON (account_id, type) account_id, type, status, balance_cents, score, partition, "offset"
    FROM {journal}.log_records WHERE first_of_transaction AND type IN ('set_status', 'set_balance', 'set_score')
    ORDER BY account_id, type, partition DESC, "offset" DESC
),
{credited}
overwritten AS (
    -- an absolute set of the balance replaces what was credited before it (few accounts have one)
    SELECT b.account_id, sum(f.amount_cents) AS cents
    FROM latest_set b JOIN {journal}.log_records f ON f.account_id = b.account_id AND f.first_of_transaction
         AND f.type = 'credit' AND (f.partition, f."offset") < (b.partition, b."offset")
    WHERE b.type = 'set_balance' GROUP BY b.account_id
),
expected AS (
    SELECT c.account_id, c.cents - coalesce(o.cents, 0) AS cents
    FROM credited c LEFT JOIN overwritten o ON o.account_id = c.account_id
)"""

# One credit per transaction (read from the index of first records, in account order), and the
# natural strategy's ledger per account: aggregated here; kept running by the summaries (summary/fold.py).
CREDITED = """
credited AS (
    SELECT account_id, sum(amount_cents) AS cents FROM {journal}.log_records
    WHERE first_of_transaction AND type = 'credit' GROUP BY account_id
),
ledger_sum AS (SELECT account_id, sum(amount_cents) AS cents FROM ledger GROUP BY account_id),"""

ACCOUNTS_SQL = f"""
WITH {EXPECTED}
SELECT a.id, a.owner, (a.balance + coalesce(l.cents, 0))::bigint AS actual,
       (coalesce(sb.balance_cents, 0) + coalesce(e.cents, 0))::bigint AS expected,
       a.status, coalesce(ss.status, 'ACTIVE') AS expected_status,
       {{score}} AS score, sc.score AS expected_score
FROM accounts a
LEFT JOIN expected e ON e.account_id = a.id
LEFT JOIN ledger_sum l ON l.account_id = a.id
LEFT JOIN latest_set ss ON ss.account_id = a.id AND ss.type = 'set_status'
LEFT JOIN latest_set sb ON sb.account_id = a.id AND sb.type = 'set_balance'
LEFT JOIN latest_set sc ON sc.account_id = a.id AND sc.type = 'set_score'
ORDER BY a.id
"""


@dataclass(frozen=True)
class AccountLine:
    id: str
    owner: str
    actual: int
    expected: int
    status: str
    expected_status: str
    score: int | None = None
    expected_score: int | None = None

    @property
    def difference(self) -> int:
        return self.actual - self.expected

    @property
    def ok(self) -> bool:
        return (self.difference == 0 and self.status == self.expected_status
                and (self.expected_score is None or self.score == self.expected_score))


def accounts_sql(session: Session, journal_schema: str, exact: bool = False) -> str:
    """The accounts' query: with the running sums (summary/reads.py) when they can be read, else
    aggregated from the log and the ledger."""
    journal = quoted(journal_schema)
    # The score is a set_score's upsert into ``scores`` (a table of its own, one row per account).
    has_scores = session.execute(text("SELECT to_regclass('scores') IS NOT NULL")).scalar()
    score = "(SELECT s.score FROM scores s WHERE s.account_id = a.id)::bigint" if has_scores else "NULL::bigint"
    credited = CREDITED
    if not exact and session.execute(text(summary.ACCOUNTS_READY_SQL.format(journal=journal))).scalar():
        credited = summary.CREDITED_SQL + ","
    return ACCOUNTS_SQL.format(journal=journal, score=score, credited=credited.format(journal=journal))


def accounts(session: Session, journal_schema: str, exact: bool = False) -> list[AccountLine]:
    rows = session.execute(text(accounts_sql(session, journal_schema, exact))).all()
    return [AccountLine(*row) for row in rows]
