"""The explorer as an operation and a background job (ops/explorations.py, agent/explorations.py,
explorer/job.py): input refused with a clear 400, classroom caps, one exploration per lab, a real
exploration run by its own process on the real agent, broker and PostgreSQL, its progress on its row
and the Explorer panel, a cancel that stops it and its process, and the panel in every state."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import sqlalchemy
from sqlalchemy import insert

import support
from webapp import strategies
from webapp.domain.waits import wait_until
from webapp.explorer import schedule as schedules
from webapp.scenarios.loader import loads
from webapp.store import explorations as store
from webapp.store.tables import explorations as table
from webapp.web.db import db

# A run of the explorer starts consumers, publishes, waits for the verdict and drops its fresh lab:
# seconds to a minute on the test machine. These deadlines leave room for two.
RUN_TIMEOUT = 240.0


def explorations(lab) -> list[dict]:
    response = lab.client.get("/api/v1/explorations")
    assert response.status_code == 200, response.get_data(as_text=True)
    return response.get_json()["explorations"]


def wait_exploration(lab, exploration_id: int, predicate, message: str, timeout: float = RUN_TIMEOUT) -> dict:
    last: list[dict] = []

    def check():
        last[:] = explorations(lab)
        return next((row for row in last if row["id"] == exploration_id and predicate(row)), None)
    return wait_until(check, timeout=timeout, interval=0.5,
                      message=lambda: f"exploration {exploration_id}: {message}; last rows: {last}")


def process_gone(pid: int) -> bool:
    """The process has exited and was reaped (its agent's watcher waits for it)."""
    return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def exploring(lab):
    yield lab
    # An exploration still going when a test fails is cancelled with it (it stops after its run).
    lab.client.post("/api/v1/explorations/cancel", json={})


@pytest.mark.parametrize("body, field, says", [
    ({"strategy": "no-such-strategy", "runs": 1}, "strategy", "must be one of none, check-then-act"),
    ({"strategy": "none", "runs": 0}, "runs", "must be a whole number from 1 to 10000"),
    ({"strategy": "none", "runs": -3}, "runs", "must be a whole number from 1 to 10000"),
    ({"strategy": "none", "minutes": 0}, "minutes", "must be a number from 0.1 to 1440.0"),
    ({"strategy": "none", "minutes": "soon"}, "minutes", "must be a number from 0.1 to 1440.0"),
    ({"strategy": "none"}, "runs", "give a budget: runs, minutes, or both"),
    ({"strategy": "eventid-atomic", "runs": 1, "faults": ["kill", "source-duplicate"]}, "faults",
     "source-duplicate is judged only against business-key and payload-hash"),
    ({"runs": 1}, "strategy", "give a strategy to explore, or the lane of your own consumer"),
    ({"strategy": "none", "lane": "mine", "runs": 1}, "strategy", "(one of them)"),
    ({"strategy": "none", "runs": 1, "seed": -1}, "seed", "must be a whole number from 0 to 2147483647"),
])
def test_bad_input_is_a_400_naming_the_field(client, lab, body, field, says):
    response = client.post("/api/v1/explorations", json=body)
    assert response.status_code == 400, response.get_data(as_text=True)
    answer = response.get_json()
    assert answer["field"] == field and says in answer["error"], answer
    assert explorations(lab) == [], "nothing was queued"


@pytest.mark.long
def test_a_lane_is_offered_and_explored_in_this_lab_and_with_no_consumer_running_says_what_to_start(exploring):
    lab = exploring
    client = lab.client
    missing = client.post("/api/v1/explorations", json={"lane": "mine", "runs": 1})
    assert missing.status_code == 404 and "has no lane mine" in missing.get_json()["error"], missing.get_json()
    assert 'value="mine"' not in client.get("/").get_data(as_text=True)
    info = lab.post("/yours", {"lane": "mine"})
    # The form offers the lab's lanes for your consumer.
    form = client.get("/").get_data(as_text=True)
    assert '<option value="mine"' in form and "your consumer&#39;s lane" in form, form[-3000:]
    started = lab.post("/explorations", {"lane": "mine", "runs": 1, "seed": 2}, expect=201)
    assert started["lane"] == "mine" and started["strategy"] is None, started
    # No consumer runs on the lane: the probe's credit is never applied, and the row says what to start.
    ended = wait_exploration(lab, started["id"], lambda r: r["state"] not in store.ACTIVE_STATES, "never ended")
    assert ended["state"] == "failed", ended
    assert "start your consumer" in ended["error"] and info["group_id"] in ended["error"], ended


def test_in_a_class_a_budget_above_the_caps_is_refused_naming_them(app_factory, lab_name, lab):
    capped = app_factory(LAB_NAME=lab_name, LAB_EXPLORER_MAX_RUNS=3, LAB_EXPLORER_MAX_MINUTES=2.0).test_client()
    for body, field, cap in [({"strategy": "none", "runs": 4}, "runs", "must be at most 3 on this lab "
                                                                        "(LAB_EXPLORER_MAX_RUNS)"),
                             ({"strategy": "none", "minutes": 2.5}, "minutes", "must be at most 2 on this lab "
                                                                               "(LAB_EXPLORER_MAX_MINUTES)")]:
        response = capped.post("/api/v1/explorations", json=body)
        assert response.status_code == 400, response.get_data(as_text=True)
        assert response.get_json()["field"] == field and cap in response.get_json()["error"], response.get_json()
    assert explorations(lab) == []


def test_an_exploration_runs_in_its_own_process_and_ends_with_what_it_tried(exploring):
    lab = exploring
    started = lab.post("/explorations", {"strategy": "eventid-atomic", "runs": 1, "seed": 5,
                                         "faults": "crash, resend"}, expect=201)
    assert started["state"] == "queued" and started["budget_runs"] == 1 and started["pid"], started
    assert started["faults"] == ["crash", "resend"], started
    ended = wait_exploration(lab, started["id"], lambda r: r["state"] not in store.ACTIVE_STATES,
                             "never ended")
    # eventid-atomic keeps its dedup key and its effect in one transaction: no schedule breaks it.
    assert ended["state"] == "nothing-found", ended
    assert ended["runs_done"] == 1 and ended["phase"] == "done", ended
    result = ended["result"]
    assert result["found"] is False and result["runs"] == 1 and result["scenario_yaml"] is None, result
    assert "1 run(s) of schedules from seed 5 against eventid-atomic" in result["tried"], result
    assert "among crash, resend, at the crash points" in result["tried"], result
    wait_until(lambda: process_gone(started["pid"]), timeout=10, message=f"process {started['pid']} still there")
    page = lab.client.get("/panels/explorer").get_data(as_text=True)
    assert f'data-exploration="{started["id"]}"' in page and 'data-state="nothing-found"' in page
    assert "No schedule broke eventid-atomic within the budget" in page and "Tried: 1 run(s)" in page


def test_one_exploration_per_lab_and_a_cancel_stops_it_and_its_process(exploring):
    lab = exploring
    started = lab.post("/explorations", {"strategy": "eventid-atomic", "runs": 50, "seed": 9}, expect=201)
    second = lab.client.post("/api/v1/explorations", json={"strategy": "none", "runs": 1})
    assert second.status_code == 409, second.get_json()
    assert f"exploration {started['id']} is" in second.get_json()["error"] \
        and "POST /api/v1/explorations/cancel" in second.get_json()["error"], second.get_json()
    # Its progress appears as it runs: a run done, the current schedule's length, the phase.
    going = wait_exploration(lab, started["id"], lambda r: r["state"] == "running" and r["runs_done"] >= 1,
                             "no run reported")
    assert going["phase"] == "searching" and going["schedule_length"] >= 1, going
    page = lab.client.get("/panels/explorer").get_data(as_text=True)
    assert 'data-state="running"' in page and 'data-runs-done="' in page and "Cancel the exploration" in page
    assert 'data-phase="searching"' in page and "of 50 run(s) done" in page
    cancelled = lab.post("/explorations/cancel")
    assert cancelled["cancelled"] == [started["id"]], cancelled
    ended = wait_exploration(lab, started["id"], lambda r: r["state"] not in store.ACTIVE_STATES,
                             "the cancel never took")
    assert ended["state"] == "cancelled" and ended["error"] == "cancelled on request", ended
    assert ended["runs_done"] < 50 and ended["result"]["cancelled"] is True, ended
    wait_until(lambda: process_gone(started["pid"]), timeout=10, message=f"process {started['pid']} still there")
    # The lab is free again; nothing left to cancel.
    nothing = lab.client.post("/api/v1/explorations/cancel", json={})
    assert nothing.status_code == 400 and "no exploration is queued or running" in nothing.get_json()["error"]


def _insert(app, lab_name: str, **values) -> int:
    row = {"lab": lab_name, "strategy": "none", "budget_runs": 10, "seed": 3, **values}
    with app.app_context(), db.engine.begin() as conn:
        return conn.execute(insert(table).values(**row).returning(table.c.id)).scalar_one()


def _found_result() -> dict:
    strategy = strategies.get("none")
    schedule = (schedules.Episode("crash", point=strategy.points[-1]),)
    scenario = schedules.compile_scenario(schedule, "none", schedules.plan_of(strategy), title="Explored: none",
                                          narrative="a crash after the effect, before the commit")
    return {"found": True, "cancelled": False, "runs": 4, "seconds": 80.0, "schedule_length": 6,
            "original_length": 11, "reproduced": 3, "reproduce_attempts": 3,
            "why": "event e-1 was applied twice: the crash came after its effect and before its offset commit",
            "tried": "4 run(s) of schedules from seed 3 against none", "scenario_yaml": scenario}


def test_the_panel_shows_each_state(app, lab, lab_name):
    client = lab.client
    assert "No exploration yet" in client.get("/panels/explorer").get_data(as_text=True)
    states = [
        ({"state": "queued"}, ["waiting for its process", "Cancel the exploration"]),
        ({"state": "running", "phase": "shrinking", "runs_done": 4, "schedule_length": 7},
         ['data-phase="shrinking"', 'data-schedule-length="7"', "4</b> of 10 run(s) done", "Cancel the exploration"]),
        ({"state": "running", "phase": "searching", "runs_done": 2, "cancel_requested": True},
         ["cancelling", "Cancel requested: it stops after the run in progress"]),
        ({"state": "found", "phase": "done", "runs_done": 4, "result": _found_result()},
         ["anomaly found", "A schedule of 6 step(s) breaks none", "(shrunk from 11)", 'data-reproduced="3/3"',
          "<b>Why:</b> event e-1 was applied twice", 'class="explored-steps"', "data-scenario-download",
          "href=\"data:text/yaml;charset=utf-8,", "flask scenario run explored-none-"]),
        ({"state": "nothing-found", "phase": "done", "runs_done": 10,
          "result": {**_found_result(), "found": False, "scenario_yaml": None, "tried": "10 run(s) from seed 3"}},
         ["nothing found", "No schedule broke none within the budget", "Tried: 10 run(s) from seed 3"]),
        ({"state": "cancelled", "error": "cancelled on request"}, ['data-state="cancelled"', "cancelled on request"]),
        ({"state": "failed", "error": "its process ended without a result (killed by SIGKILL)"},
         ['badge bad">failed', "its process ended without a result (killed by SIGKILL)"]),
    ]
    for values, shown in states:
        exploration_id = _insert(app, lab_name, **values)
        page = client.get("/panels/explorer").get_data(as_text=True)
        assert f'data-exploration="{exploration_id}"' in page, page
        for text in shown:
            assert text in page, f"{values['state']}: {text!r} not in the panel:\n{page}"
        if values["state"] in store.ACTIVE_STATES:  # one active per lab: end it before the next
            with app.app_context(), db.engine.begin() as conn:
                store.finish(conn, exploration_id, store.CANCELLED, error="test")


def test_a_process_that_dies_without_a_word_ends_failed_saying_how(exploring):
    lab = exploring
    started = lab.post("/explorations", {"strategy": "eventid-atomic", "runs": 1}, expect=201)
    # Killed while it is still starting (importing takes seconds), before it started any run: the
    # agent that watches it is the only one left to say how it ended.
    os.kill(started["pid"], signal.SIGKILL)
    ended = wait_exploration(lab, started["id"], lambda r: r["state"] not in store.ACTIVE_STATES, "never ended",
                             timeout=30)
    assert ended["state"] == "failed", ended
    assert "its process ended without a result (killed by SIGKILL)" in ended["error"], ended
    assert f"exploration-{started['id']}.log" in ended["error"], "it says where the process's output is"
    # The lab is free again.
    again = lab.post("/explorations", {"strategy": "eventid-atomic", "runs": 1}, expect=201)
    lab.post("/explorations/cancel")
    wait_exploration(lab, again["id"], lambda r: r["state"] not in store.ACTIVE_STATES, "the cancel never took")


def test_a_lab_reset_stops_its_exploration(exploring):
    lab = exploring
    started = lab.post("/explorations", {"strategy": "eventid-atomic", "runs": 50}, expect=201)
    wait_exploration(lab, started["id"], lambda r: r["state"] == "running", "never started")
    lab.post("/lab/reset")
    ended = wait_exploration(lab, started["id"], lambda r: r["state"] not in store.ACTIVE_STATES,
                             "the reset did not stop it")
    assert ended["state"] == "cancelled" and ended["error"] == "the lab was reset or deleted while it ran", ended
    wait_until(lambda: process_gone(started["pid"]), timeout=10, message=f"process {started['pid']} still there")


def test_the_dashboard_has_the_explorer_form_and_panel_and_the_form_says_what_is_wrong(lab):
    page = lab.client.get("/").get_data(as_text=True)
    assert 'id="panel-explorer"' in page and 'id="form-explore"' in page, "the form and the panel are on the page"
    refused = lab.client.post("/controls/op/explore", data={"strategy": "none", "runs": "0"})
    assert refused.status_code == 422, refused.get_data(as_text=True)
    assert "must be a whole number from 1 to 10000" in refused.get_data(as_text=True)
    melt = lab.client.post("/controls/op/explore", data={"strategy": "none", "runs": "1", "faults": "kill, melt"})
    assert melt.status_code == 422 and "&#39;async-commit&#39; or &#39;source-duplicate&#39;" in melt.get_data(as_text=True), melt.get_data(as_text=True)
    assert 'name="faults"' in page and "empty: every kind (crash, resend, restart, freeze-join, kill, join" in page
    nothing = lab.client.post("/controls/op/cancel_exploration", data={})
    assert nothing.status_code == 422 and "no exploration is queued or running" in nothing.get_data(as_text=True)


def _double_credit_result() -> dict:
    """What an exploration of ``none`` hands back: the crash after the effect and before the offset
    commit, compiled by the explorer with the anomaly its run saw as the file's expectation."""
    strategy = strategies.get("none")
    schedule = (schedules.Episode("crash", point="after-effect-before-commit"),)
    scenario = schedules.compile_scenario(
        schedule, "none", schedules.plan_of(strategy), title="Explored: none — duplicates applied 1",
        narrative="The explorer's shortest schedule.\n\n**Why:** P0@0 was applied again after the restart.",
        expect={"verdict": {"duplicates_applied": 1}, "accounts": {"acc-1": {"actual": 20000, "expected": 10000}}})
    return {**_found_result(), "schedule_length": 7, "scenario_yaml": scenario}


@pytest.mark.long
def test_a_found_explorations_scenario_replays_guided_to_the_same_verdict(app, app_factory, lab, lab_name):
    exploration_id = _insert(app, lab_name, state="found", phase="done", runs_done=4, result=_double_credit_result())
    panel = lab.client.get("/panels/explorer").get_data(as_text=True)
    assert f'data-replay-guided="{exploration_id}"' in panel and "Replay guided" in panel, panel
    assert f'action="/scenarios/explorations/{exploration_id}/runs"' in panel, panel
    steps = len(loads(_double_credit_result()["scenario_yaml"]).steps)
    run = support.run_guided_from(app, f"/scenarios/explorations/{exploration_id}/runs", steps)
    try:
        support.assert_passed(run)
        # The lab's preparation, then every step of the file; its expectations (the double credit) held.
        assert [step["status"] for step in run.steps] == ["ok"] * (steps + 1), run.steps
        assert any("duplicates" in check["label"] and check["ok"] for check in run.checks), run.checks
        with app.app_context(), db.engine.connect() as conn:
            run_id = conn.execute(sqlalchemy.text("SELECT id FROM lab_control.scenario_runs WHERE lab = :lab"),
                                  {"lab": run.lab}).scalar_one()
        page = lab.client.get(f"/scenarios/runs/{run_id}").get_data(as_text=True)
        assert f'data-explored-from="{exploration_id}"' in page and f"came from exploration {exploration_id}" in page
        assert "Explored: none" in page and "data-docs-link" not in page
    finally:
        support.judge_and_drop_run(app_factory, app, run.lab)


def test_a_guided_replay_of_an_exploration_without_a_scenario_is_refused_saying_why(app, lab, lab_name):
    unknown = lab.client.post("/scenarios/explorations/999999999/runs")
    assert unknown.status_code == 404
    exploration_id = _insert(app, lab_name, state="nothing-found", phase="done", runs_done=10,
                             result={**_found_result(), "found": False, "scenario_yaml": None})
    refused = lab.client.post(f"/scenarios/explorations/{exploration_id}/runs")
    assert refused.status_code == 409
    assert f"exploration {exploration_id} handed back no scenario (it is nothing-found)" in refused.get_data(as_text=True)
    assert "Replay guided" not in lab.client.get("/panels/explorer").get_data(as_text=True)
