"""Exploring a lane: the explorer's faults against a learner's own consumer (tests/byoc/consumer.py,
run as its own OS process, started and stopped by PID), in the learner's own lab.

Seed 2 draws "publish a credit; resend it" first: the naive consumer applies the resend a second
time, so the search's first run fails (the tests check the judging, the shrinking and the scenario
handed back, not how long a search takes).
"""
from __future__ import annotations

import random

import pytest
from test_your_consumer import graded_app, start_outside_consumer  # noqa: F401  (graded_app: a fixture)

import support
from webapp import ops
from webapp.agent.processes import stop_process
from webapp.domain.lab import Lab
from webapp.explorer import lanes
from webapp.explorer.search import Budget, InvalidTarget, Target, explore
from webapp.scenarios.loader import loads
from webapp.web.db import db

FAILING_FIRST_SEED = 2


def test_lane_schedules_use_only_faults_outside_the_consumer_and_compile_to_scenarios_the_loader_accepts():
    rng = random.Random(1)
    for _ in range(40):
        schedule = lanes.generate(rng)
        kinds = [episode.kind for episode in schedule]
        assert 1 <= sum(kind in lanes.LANE_FAULTS for kind in kinds) <= 2
        assert not {"crash", "restart", "freeze-join"} & set(kinds), kinds
        assert lanes.LaneExplorer.valid(schedule), kinds
        scenario = loads(lanes.compile_scenario(schedule, "mine", title="t", narrative="n",
                                                expect_verdict={"duplicates_applied": 1}))
        assert scenario.outside_lane == "mine"
        actions = [step.action for step in scenario.steps]
        assert ("block_yours_commits" in actions) == ("commits-blocked" in kinds), actions


def test_a_lane_the_lab_does_not_have_is_refused_naming_what_to_create(app, lab, lab_name, agent):
    with app.app_context(), pytest.raises(InvalidTarget, match=r"no lane nobody .*POST /yours"):
        explore(ops.Context(db.engine, Lab(lab_name), app.config), Target(lane="nobody"), Budget(runs=1), 1)


@pytest.mark.long
def test_a_lane_with_no_consumer_running_is_refused_naming_what_to_start(graded_app, monkeypatch):  # noqa: F811
    monkeypatch.setattr(lanes, "READY_TIMEOUT", 5)  # nothing will apply the probe's credit: no need to wait long
    lab = support.open_lab(graded_app, graded_app.config["LAB_NAME"])
    info = lab.post("/yours", {"lane": "mine"})
    with graded_app.app_context(), pytest.raises(InvalidTarget) as refused:
        explore(ops.Context(db.engine, Lab(graded_app.config["LAB_NAME"]), graded_app.config), Target(lane="mine"),
                Budget(runs=1), 1)
    assert "start your consumer" in str(refused.value) and info["group_id"] in str(refused.value), refused.value


@pytest.mark.long
def test_exploring_a_naive_consumer_finds_a_duplicate_shrinks_it_and_hands_back_a_scenario(
        graded_app, tmp_path):  # noqa: F811
    lab_name = graded_app.config["LAB_NAME"]
    lab = support.open_lab(graded_app, lab_name)
    info = lab.post("/yours", {"lane": "mine"})
    consumer = start_outside_consumer("naive", info, tmp_path / "naive.log")
    progress = []
    try:
        with graded_app.app_context():
            result = explore(ops.Context(db.engine, Lab(lab_name), graded_app.config), Target(lane="mine"),
                             Budget(runs=2), FAILING_FIRST_SEED, reproduce=1, on_progress=progress.append)
        log = (tmp_path / "naive.log").read_text()
        assert consumer.poll() is None, log[-2000:]
    finally:
        stop_process(consumer)
    assert result.found, f"{result.tried}\n{log[-2000:]}"
    assert result.reproduced == 1 and result.reproduce_attempts == 1, result
    assert [p.phase for p in progress][-1] == "done" and progress[0].phase == "searching", progress
    scenario = loads(result.scenario_yaml)
    assert scenario.outside_lane == "mine"
    # Shrunk: the credit and its resend, nothing less fails (a resend alone repeats no credit of the run).
    assert [step.action for step in scenario.steps][1:3] == ["publish", "publish"], result.scenario_yaml
    assert scenario.steps[2].args.get("mode") == "resend", result.scenario_yaml
    assert "duplicates_applied: 1" in result.scenario_yaml, result.scenario_yaml
    assert result.why and "same event_id again" in result.why, result.why
    assert "no crash points" in result.tried, result.tried
