"""Revision 6: the producer-ordering lesson's columns on the log mirror.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

- every lab schema: log_records: new columns producer_id, producer_seq (the event's producer
  and its running number there) and out_of_order_after (set by the log reader: the highest
  earlier number of the same producer in the partition, when above the record's own), with the
  partial index of stamped records the reader's "highest so far" reads

Frozen: a later model change gets a revision of its own.
"""
from alembic import op

from webapp.store.migrations import for_each_lab_schema

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

LAB = [
    """ALTER TABLE log_records ADD COLUMN IF NOT EXISTS producer_id VARCHAR(64)""",
    """ALTER TABLE log_records ADD COLUMN IF NOT EXISTS producer_seq BIGINT""",
    """ALTER TABLE log_records ADD COLUMN IF NOT EXISTS out_of_order_after BIGINT""",
    """CREATE INDEX IF NOT EXISTS log_records_producer_seq ON log_records (partition, producer_id, producer_seq) WHERE producer_id IS NOT NULL""",
]


def upgrade() -> None:
    for_each_lab_schema(op.get_bind(), LAB)


def downgrade() -> None:
    raise NotImplementedError("the lab's migrations go forward only")
