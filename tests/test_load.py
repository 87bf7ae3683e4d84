"""The load generator (webapp/agent/load.py, ops start_load/cancel_load): N events over M
accounts with seeded ratios of resends and source duplicates, produced by the real agent to the
real broker and judged from the log mirror; its progress visible while it runs; cancellable."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from webapp.web.db import lab_session


def runs(lab) -> list[dict]:
    response = lab.client.get("/api/v1/load")
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["runs"]


def wait_run(lab, predicate, message: str, timeout: float = 60.0) -> dict:
    return lab.wait(lambda s: next((r for r in runs(lab) if predicate(r)), None), message, timeout)


def mirrored(app, lab, sql: str):
    with app.app_context(), lab_session(lab.lab.schema) as session:
        return session.execute(text(sql)).one()


@pytest.fixture
def loading(lab):
    yield lab
    lab.post("/load/cancel")  # a run still going when a test fails stops with it


def test_a_load_produces_n_events_over_m_accounts_with_its_ratios(app, loading):
    lab = loading
    started = lab.post("/load", {"events": 3000, "accounts": 8, "resend_ratio": 0.1, "source_duplicate_ratio": 0.05,
                                 "seed": 7})
    run = wait_run(lab, lambda r: r["id"] == started["run_id"] and r["state"] == "done", "the load never finished")
    assert run["sent"] == 3000 and run["failed"] == 0
    # Seeded: the shares are near the ratios (binomial over 3,000 draws), and exact in the log below.
    assert 200 <= run["resends"] <= 400 and 80 <= run["source_duplicates"] <= 230, run
    lab.wait(lambda s: sum(p["log_end"] or 0 for p in s["partitions"]) >= 3000, "the log mirror never read the load")
    records, events, transactions, accounts, top = mirrored(app, lab, (
        "SELECT count(*), count(DISTINCT event_id), count(DISTINCT transaction_id), count(DISTINCT account_id), "
        "max(substr(account_id, 5)::int) FROM log_records WHERE invalid_reason IS NULL"))
    assert records == 3000
    assert events == 3000 - run["resends"]                                   # a resend repeats an event id
    assert transactions == 3000 - run["resends"] - run["source_duplicates"]  # a source duplicate, a transaction
    assert accounts == 8 and top == 8
    # The accounts beyond the five seed ones were created, so no record goes to the DLQ for them.
    assert {a["id"] for a in lab.state()["accounts"]} >= {f"acc-{n}" for n in range(1, 9)}
    page = lab.client.get("/panels/load").get_data(as_text=True)
    assert f'data-run="{started["run_id"]}"' in page and 'data-sent="3000"' in page


def test_the_same_seed_gives_the_same_stream(app, loading):
    lab = loading
    counts = []
    for _ in range(2):
        run_id = lab.post("/load", {"events": 500, "accounts": 3, "resend_ratio": 0.2, "source_duplicate_ratio": 0.2,
                                    "seed": 42})["run_id"]
        run = wait_run(lab, lambda r: r["id"] == run_id and r["state"] == "done", "the load never finished")
        counts.append((run["resends"], run["source_duplicates"]))
    assert counts[0] == counts[1]


def test_a_paced_load_shows_its_progress_and_stops_when_cancelled(app, loading):
    lab = loading
    run_id = lab.post("/load", {"events": 20_000, "accounts": 5, "rate_per_second": 400})["run_id"]
    going = wait_run(lab, lambda r: r["id"] == run_id and r["state"] == "running" and r["sent"] > 0,
                     "no progress reported", timeout=20)
    assert going["sent"] < 20_000
    page = lab.client.get("/panels/load").get_data(as_text=True)
    assert 'data-state="running"' in page
    # One heavy job per lab at a time: another load, or a dedup warm-up, is a 409 saying what runs
    # and how to stop it.
    for path, body in [("/load", {"events": 10}), ("/dedup/warmup", {"keys": 10})]:
        refused = lab.client.post(f"/api/v1{path}", json=body)
        assert refused.status_code == 409, refused.get_json()
        assert f"load run {run_id} (20,000 events) is running" in refused.get_json()["error"] \
            and "POST /api/v1/load/cancel" in refused.get_json()["error"], refused.get_json()
    assert lab.post("/load/cancel")["cancelled"] == [run_id]
    stopped = wait_run(lab, lambda r: r["id"] == run_id and r["state"] == "cancelled", "the load never stopped",
                       timeout=20)
    # Paced at 400/s: far from done when it stopped, and every record it reports sent is in the log.
    assert 0 < stopped["sent"] < 20_000
    lab.wait(lambda s: sum(p["log_end"] or 0 for p in s["partitions"]) == stopped["sent"],
             "the log does not hold exactly what the cancelled run sent")


def test_a_running_warm_up_holds_the_lab_against_a_load(app, lab):
    """A warm-up's row as the agent writes it while it inserts: a load is refused (409) naming it."""
    with app.app_context(), lab_session(lab.lab.schema) as session:
        run_id = session.execute(text("INSERT INTO warmup_runs (keys, days, state) VALUES (90000, 3, 'running') "
                                      "RETURNING id")).scalar_one()
        session.commit()
    refused = lab.client.post("/api/v1/load", json={"events": 10})
    assert refused.status_code == 409 and refused.get_json()["field"] == "busy", refused.get_json()
    assert f"warm-up run {run_id} (90,000 keys) is running" in refused.get_json()["error"] \
        and "POST /api/v1/dedup/warmup/cancel" in refused.get_json()["error"]
    assert lab.post("/dedup/warmup/cancel")["cancelled"] == [run_id]


def test_as_fast_as_possible_is_paced_at_the_labs_rate_ceiling(app_factory, loading, lab_name):
    client = app_factory(LAB_NAME=lab_name, LAB_MAX_LOAD_RATE=300).test_client()
    answer = client.post("/api/v1/load", json={"events": 20_000})
    assert answer.status_code == 201, answer.get_json()
    (run,) = [r for r in runs(loading) if r["id"] == answer.get_json()["run_id"]]
    assert run["rate_per_second"] == 300
    too_fast = client.post("/api/v1/load", json={"events": 10, "rate_per_second": 301})
    assert too_fast.status_code == 400 and "LAB_MAX_LOAD_RATE" in too_fast.get_json()["error"]


@pytest.mark.parametrize("body,field", [
    ({"events": 10, "resend_ratio": 0.6, "source_duplicate_ratio": 0.5}, "source_duplicate_ratio"),
    ({"events": 0}, "events"),
    ({"events": 10_000_001}, "events"),
    ({"events": 20_001}, "events"),          # the test stack's ceiling (LAB_MAX_LOAD_EVENTS)
    ({"events": 10, "accounts": 0}, "accounts"),
    ({"events": 10, "rate_per_second": -1}, "rate_per_second"),
])
def test_bad_load_input_is_a_400_naming_the_field(lab, body, field):
    response = lab.client.post("/api/v1/load", json=body)
    assert response.status_code == 400, response.get_json()
    assert response.get_json()["field"] == field
