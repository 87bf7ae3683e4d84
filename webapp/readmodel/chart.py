"""The chart: expected (exactly-once) vs actual credited total over time, one actual line per copy
of the accounts, in time buckets (from the rows, or from the running sums per second).
"""
from __future__ import annotations

import math
from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from ..domain.lab import Lab
from ..store.schema import quoted
from ..summary import reads as summary
from .groups import effects_schemas

CHART_BUCKETS = 240

# Cumulative credited cents over time: ``truth`` (each transaction once, when the log reader saw its
# first record: the same clock as the effects' rows)
# and the effects of each copy of the accounts, summed into time buckets of ``:width`` seconds.
CHART_TRUTH_SQL = """
SELECT floor(date_part('epoch', at) / :width) * :width AS t, sum(amount_cents) FROM (
    SELECT amount_cents, read_at AS at FROM log_records WHERE first_of_transaction AND type = 'credit'
) truth GROUP BY 1 ORDER BY 1
"""
CHART_EFFECTS_SQL = """
SELECT floor(date_part('epoch', at) / :width) * :width AS t, sum(amount_cents) FROM (
    SELECT applied_at AS at, amount_cents FROM {s}.payments
    UNION ALL SELECT recorded_at, amount_cents FROM {s}.ledger
) effects GROUP BY 1 ORDER BY 1
"""
# The time span, to choose the bucket width: ids grow with time, so the first and last rows by
# id (index lookups) stand for the earliest and latest; buckets are cut from the data itself,
# so a row just outside this span still lands in a bucket of its own.
CHART_SPAN_SQL = """
SELECT extract(epoch FROM least((SELECT min(read_at) FROM log_records){lanes_min})),
       extract(epoch FROM greatest((SELECT max(read_at) FROM log_records){lanes_max}))
"""


def chart_series(session: Session, lab: Lab, exact: bool = False) -> dict[str, Any]:
    """Expected (exactly-once) vs actual credited total over time, one actual line per copy."""
    schemas = effects_schemas(session, lab)
    lanes_min = "".join(f", (SELECT applied_at FROM {quoted(s)}.payments ORDER BY id LIMIT 1)" for s in schemas)
    lanes_max = "".join(f", (SELECT applied_at FROM {quoted(s)}.payments ORDER BY id DESC LIMIT 1)" for s in schemas)
    low, high = session.execute(text(CHART_SPAN_SQL.format(lanes_min=lanes_min, lanes_max=lanes_max))).one()
    if low is None:
        return {"x": [], "series": []}
    low, high = float(low), float(high)
    width = max(0.05, (high - low) / CHART_BUCKETS)
    truth_sql, effects_sql = CHART_TRUTH_SQL, CHART_EFFECTS_SQL
    if width >= 1:
        # Buckets of whole seconds: the running sums per second (summary/reads.py) add up to the
        # same buckets as the rows themselves, so either may answer.
        width = float(math.ceil(width))
        if not exact and summary.ready(session, lab.schema, schemas):
            truth_sql, effects_sql = summary.CHART_TRUTH_SQL, summary.CHART_EFFECTS_SQL
    steps = {"expected": dict(session.execute(text(truth_sql.format(journal=quoted(lab.schema))), {"width": width}).all())}
    for schema in schemas:
        label = "actual" if schema == lab.schema else f"actual · lane {lab.lane_of(schema)}"
        steps[label] = dict(session.execute(text(effects_sql.format(s=quoted(schema))), {"width": width}).all())
    times = sorted({float(t) for amounts in steps.values() for t in amounts})
    if not times:  # records, but no credit and no effect yet: nothing to draw
        return {"x": [], "series": []}
    # One point a bucket before the first, so every line starts from zero.
    x = [times[0] - width] + times
    series = []
    for label, amounts in steps.items():
        total, values = 0, [0]
        by_time = {float(t): int(cents) for t, cents in amounts.items()}
        for t in times:
            total += by_time.get(t, 0)
            values.append(total)
        series.append({"label": label, "values": values})
    return {"x": x, "series": series}
