"""The short soak (bench/soak.py --short) as part of `make test`: 1,000 events over 30 s, three
consumers per strategy under chaos every 2 s, PostgreSQL restarted once, then the truth read from
the log and the effect tables, independently of the lab's verdict. Its own stack, in its own
process (the benchmark's command line), so nothing of the session's services is touched."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import ROOT

pytestmark = pytest.mark.soak


@pytest.mark.timeout(480)
def test_the_short_soak_loses_nothing_applies_nothing_twice_and_the_verdict_agrees(tmp_path):
    # PYTHONPATH: the bench imports `webapp` of this checkout, whichever one the environment installed.
    done = subprocess.run([sys.executable, "bench/soak.py", "--short", "--json", "--keep", str(tmp_path / "soak")],
                          cwd=ROOT, capture_output=True, text=True, timeout=450,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.strip(), f"no report (exit {done.returncode}): {done.stderr[-3000:]}"
    report = json.loads(done.stdout.strip().splitlines()[-1])
    rows = {row["strategy"]: row for row in report["rows"]}
    assert set(rows) == {"none", "eventid-atomic", "insert-first", "business-key"}, report
    assert report["events"] >= 1000, report
    # Chaos runs until every group has taken at least 5 actions (bench/soak.py waits for it).
    assert len(report["chaos_actions_by_group"]) == 4 and min(report["chaos_actions_by_group"].values()) >= 5, report
    for strategy in ("eventid-atomic", "insert-first", "business-key"):
        assert rows[strategy]["lost"] == 0 and rows[strategy]["applied_twice"] == 0, rows[strategy]
    assert rows["business-key"]["source_duplicates_twice"] == 0, rows["business-key"]
    assert all(row["verdict_agrees"] for row in rows.values()), rows
    # Every group consumed the whole log: a group the lab showed stalled was recovered through the
    # lab's own recover_group (listed with its time), and none stayed stalled.
    assert report["wedged"] == [], report["recoveries"]
    assert all(row["not_consumed"] == 0 for row in rows.values()), rows
    assert all(r["steps"] != ["the recovery did not answer"] for r in report["recoveries"]), report["recoveries"]
    assert rows["none"]["verdict_duplicates"] == rows["none"]["applied_twice"] + rows["none"]["source_duplicates_twice"]
    assert done.returncode == 0, done.stderr[-3000:]
