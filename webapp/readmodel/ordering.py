"""Producer ordering: records that landed after a record their own producer sent later.

The lab's producer stamps every event with its id and a running number (``producer_id``,
``producer_seq``, events.py). The log reader keeps, per record, the highest number the same
producer had already written to the same partition when that is above the record's own
(``log_records.out_of_order_after``). Such a record is *out of order*: a consumer of that
partition gets seq 7 after seq 8.

How it happens: with ``enable.idempotence=false`` a lost acknowledgement makes librdkafka send
the batch again. Two different things then show as a lower number after a higher one:

- a *copy*: the broker had written the first attempt (the lab's fault proxy drops only the
  response), so the retried batch is appended again. With one request in flight it can only be
  appended after its own first copy: seq 0 after seq 19 of the same batch, a duplicate batch,
  not a reordering;
- a *reordering*: the broker refused the first attempt (NOT_LEADER_OR_FOLLOWER, a timeout), a
  later batch already in flight was written (only with more than one request in flight), and the
  retry, the only copy, lands after it. The lab's proxy does not produce this case.

With idempotence the broker checks each producer's sequence numbers per partition and neither
happens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import text

# The out-of-order records of one partition's offsets [low, high], each with the first offset of
# its own number (an earlier one: the record is a copy) and where the higher number was written.
OUT_OF_ORDER_SQL = """
SELECT r."offset", r.producer_id, r.producer_seq, r.out_of_order_after,
       (SELECT min(x."offset") FROM log_records x WHERE x.partition = r.partition AND x.producer_id = r.producer_id
          AND x.producer_seq = r.producer_seq AND x."offset" < r."offset") AS copy_of,
       (SELECT min(x."offset") FROM log_records x WHERE x.partition = r.partition AND x.producer_id = r.producer_id
          AND x.producer_seq = r.out_of_order_after) AS after_offset
FROM log_records r
WHERE r.partition = :partition AND r."offset" BETWEEN :low AND :high AND r.out_of_order_after IS NOT NULL
ORDER BY r."offset"
"""

# Out-of-order records per account: what a scenario expects.
BY_ACCOUNT_SQL = """
SELECT account_id, count(*) FROM log_records WHERE out_of_order_after IS NOT NULL GROUP BY account_id
"""


@dataclass(frozen=True)
class OutOfOrder:
    partition: int
    offset: int
    producer_id: str
    producer_seq: int
    after_seq: int
    after_offset: int | None
    copy_of: int | None  # the earlier offset holding the same number: the retried batch was written again

    @property
    def why(self) -> str:
        """One sentence a class can read aloud, naming both records."""
        after = f" (P{self.partition}@{self.after_offset})" if self.after_offset is not None else ""
        sentence = f"out of order: seq {self.producer_seq} after seq {self.after_seq}{after} from producer {self.producer_id}"
        if self.copy_of is not None:
            # The first attempt was written: a batch appended again, behind its own first copy
            # (and, with several requests in flight, behind later batches too).
            return sentence + (f"; seq {self.producer_seq} is also at P{self.partition}@{self.copy_of}: the broker had "
                               "written the first attempt, and the retried batch was appended again after it")
        return sentence + ", a retried batch that landed after a later batch sent while it was in flight"


def out_of_order(conn: Any, partition: int, low: int, high: int) -> dict[int, OutOfOrder]:
    """The out-of-order records of ``partition`` between offsets ``low`` and ``high``, by offset.

    ``conn`` is a SQLAlchemy session or connection already in the lab's schema.
    """
    rows = conn.execute(text(OUT_OF_ORDER_SQL), {"partition": partition, "low": low, "high": high}).all()
    return {row.offset: OutOfOrder(partition, row.offset, row.producer_id, row.producer_seq, row.out_of_order_after,
                                   row.after_offset, row.copy_of) for row in rows}


def by_account(conn: Any) -> dict[str, int]:
    """How many records of each account landed out of order (accounts with none are absent)."""
    return {account: int(count) for account, count in conn.execute(text(BY_ACCOUNT_SQL)).all()}
