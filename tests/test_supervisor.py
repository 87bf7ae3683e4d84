"""The lab agent's process and Kafka controls: freeze/thaw, step mode, stop, offset resets,
scheduled TTL, strategy lanes. Real processes, real broker, real database."""
from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from sqlalchemy import text

from webapp.db import lab_session
from webapp.waits import wait_until


def start(lab, name="c1", **body) -> int:
    consumer_id = lab.start_consumer(name=name, **body)["consumer_id"]
    lab.wait_assigned(consumer_id)
    return consumer_id


def count(app, schema: str, sql: str) -> int:
    with app.app_context(), lab_session(schema) as session:
        return session.execute(text(sql)).scalar()


def test_freeze_stops_progress_and_thaw_resumes(lab):
    c1 = start(lab)
    lab.post(f"/consumers/{c1}/freeze")
    lab.wait_state(c1, "frozen")
    lab.credit("acc-2", 300)
    frozen = lab.consumer(c1)
    assert frozen["applied"] == 0
    lab.post(f"/consumers/{c1}/thaw")
    lab.wait_caught_up(45)  # a pause shorter than the session timeout may keep its partitions
    assert lab.account("acc-2")["actual"] == 300


def test_step_mode_stops_at_each_point_of_one_message(lab):
    c1 = start(lab)
    lab.post(f"/consumers/{c1}/step-mode", {"on": True})
    lab.credit("acc-1", 1000)
    seen = []
    for expected_point, balance in [("before-effect", 0), ("after-effect-before-commit", 1000), ("after-commit", 1000)]:
        row = lab.wait_consumer(c1, lambda c: c["state"] == "stepping" and c["step_at"] == expected_point,
                                f"did not stop at {expected_point}")
        seen.append(row["step_at"])
        assert lab.account("acc-1")["actual"] == balance
        if expected_point == "after-effect-before-commit":
            # The effect is committed in PostgreSQL; the offset is not committed in Kafka yet.
            record_partition = next(p for p in lab.state()["partitions"] if p["log_end"])
            assert not record_partition["committed"].get(lab.lab.group_id("payments"))
        lab.post(f"/consumers/{c1}/step")
    assert seen == ["before-effect", "after-effect-before-commit", "after-commit"]
    lab.wait_caught_up()


def test_stepping_without_step_mode_is_refused(lab):
    c1 = start(lab)
    response = lab.client.post(f"/api/v1/consumers/{c1}/step", json={})
    assert response.status_code == 400 and "not in step mode" in response.get_json()["error"]


def test_graceful_stop_leaves_the_group_and_reports_stopped(lab):
    c1 = start(lab)
    lab.post(f"/consumers/{c1}/stop")
    row = lab.wait_state(c1, "stopped")
    assert row["exit_code"] == 0 and row["assigned"] == []


def publish_three(lab) -> list[dict]:
    return [lab.credit("acc-1", amount) for amount in (100, 200, 400)]


@pytest.mark.parametrize("body,replayed_cents", [
    ({"mode": "earliest"}, 700),
    ({"mode": "back", "back": 1}, 400),
    ({"mode": "back", "back": 2}, 600),
])
def test_reset_offsets_replays_what_it_says(lab, body, replayed_cents):
    start(lab)
    publish_three(lab)
    lab.wait_caught_up()
    result = lab.post("/groups/payments/reset-offsets", body)
    assert result["restarted"]
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == "acc-1")["actual"] == 700 + replayed_cents,
             f"the reset {body} did not replay {replayed_cents}")
    lab.wait_caught_up()
    assert lab.account("acc-1")["actual"] == 700 + replayed_cents


def test_reset_to_an_offset_per_partition(lab):
    start(lab)
    records = publish_three(lab)
    lab.wait_caught_up()
    partition = records[0]["partition"]
    lab.post("/groups/payments/reset-offsets", {"mode": "offset", "offsets": {str(partition): records[1]["offset"]}})
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == "acc-1")["actual"] == 1300,
             "the offset reset did not replay the last two records")


def test_reset_to_a_timestamp(lab):
    start(lab)
    lab.credit("acc-1", 100)
    boundary = time.time() + 0.002
    wait_until(lambda: time.time() > boundary, timeout=1, message="the clock did not advance")
    lab.credit("acc-1", 200)
    lab.wait_caught_up()
    iso = datetime.fromtimestamp(boundary, timezone.utc).isoformat()
    lab.post("/groups/payments/reset-offsets", {"mode": "timestamp", "timestamp": iso})
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == "acc-1")["actual"] == 500,
             "the timestamp reset did not replay only the later record")


def test_scheduled_ttl_cleanup_deletes_old_keys(app, lab):
    lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    start(lab)
    lab.credit("acc-1", 100)
    lab.wait_caught_up()
    assert count(app, lab.lab.schema, "SELECT count(*) FROM processed_events") == 1
    lab.post("/ttl", {"ttl_seconds": 0, "ttl_schedule_seconds": 1})
    wait_until(lambda: count(app, lab.lab.schema, "SELECT count(*) FROM processed_events") == 0, timeout=15,
               message="the scheduled TTL cleanup never ran")
    assert count(app, lab.lab.schema, "SELECT count(*) FROM timeline WHERE kind = 'ttl'") >= 1


def test_a_strategy_lane_applies_to_its_own_copy_of_the_accounts(app, lab):
    lane = lab.post("/groups", {"group": "atomic", "strategy": "eventid-atomic", "lane": "atomic"})
    assert lane["effects_schema"] == f"{lab.lab.schema}__atomic"
    consumer = start(lab, name="a1", group="atomic")
    lab.credit("acc-1", 900)
    wait_until(lambda: count(app, lane["effects_schema"], "SELECT balance FROM accounts WHERE id = 'acc-1'") == 900,
               timeout=30, message="the lane's copy of acc-1 was never credited")
    assert lab.account("acc-1")["actual"] == 0  # the lab's own accounts: no consumer applies to them
    assert lab.consumer(consumer)["applied"] == 1
