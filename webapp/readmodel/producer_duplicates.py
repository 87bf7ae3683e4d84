"""The producer duplicates: records in the log whose event id is at more than one offset (a
producer's retry after a lost ack, a resend, another producer), from the log or from the running
summary of the events at several offsets.
"""
from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..summary import reads as summary

# Records in the log whose event id is at more than one offset, as the log reader saw them. The
# journal knows each record the lab's producer got a delivery report for: an event at several
# offsets with some of them unknown to the journal (and one known) was written again by the
# producer's retry after a lost ack; resends are journaled each time; another producer's
# records are in no journal at all. ``repeated``: the events at several offsets (REPEATED_EVENTS_SQL,
# or their running summary, summary.REPEATED_EVENTS_SQL).
PRODUCER_DUPLICATES_SQL = """
WITH {repeated}
SELECT x.event_id::text, count(*) AS records,
       count(*) FILTER (WHERE NOT EXISTS (SELECT 1 FROM published_events j WHERE j.partition = r.partition
                                          AND j."offset" = r."offset")) AS unreported,
       array_agg(r.partition || '@' || r."offset" ORDER BY r.partition, r."offset") AS positions
FROM repeated x JOIN log_records r ON r.event_id = x.event_id
GROUP BY x.event_id ORDER BY min(r.partition), min(r."offset")
"""


# Events at more than one offset: few, found by one pass over the event ids.
REPEATED_EVENTS_SQL = """
repeated AS (
    SELECT event_id FROM log_records WHERE event_id IS NOT NULL GROUP BY event_id HAVING count(*) > 1
)"""


def producer_duplicates(session: Session, lab: Lab, listed: int = 20, exact: bool = False) -> dict[str, Any]:
    """Producer-side duplicates: records in the log with an event id at more than one offset.

    ``producer_retry_duplicates`` counts the records written by a producer retry after a lost
    ack (the lab's journal has a report for another copy, none for these); ``extra_records``
    counts every record beyond the first of an event (resends, other producers' repeats).
    """
    # The events at several offsets, from the running summary when it can be read (summary/reads.py).
    summarized = not exact and session.execute(text(summary.JOURNAL_READY_SQL)).scalar()
    repeated = summary.REPEATED_EVENTS_SQL if summarized else REPEATED_EVENTS_SQL
    rows = session.execute(text(PRODUCER_DUPLICATES_SQL.format(repeated=repeated))).all()
    retried = [row for row in rows if 0 < row.unreported < row.records]
    return {
        "producer_retry_duplicates": sum(row.unreported for row in retried),
        "events_at_several_offsets": len(rows),
        "extra_records": sum(row.records - 1 for row in rows),
        "events": [{"event_id": row.event_id, "positions": row.positions, "written_by_retry": row.unreported}
                   for row in retried[:listed]],
    }
