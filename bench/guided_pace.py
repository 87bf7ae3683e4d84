"""Every exercise clicked through in guided mode at a person's pace, on a stack of its own.

    .venv/bin/python bench/guided_pace.py [--pause 3] [--only 21 --only 03] [--stop-on-failure]

A workshop's learner reads between two clicks; the suite clicks at machine speed. An exercise
whose steps race the broker (a member handed a partition before the step that arms its fault,
a wait for a state that has already passed) passes in the suite and fails in the room. This bench
brings up the lab's services (webapp/dev/stack.py: the embedded PostgreSQL, the Tansu broker, the
fault proxy and a lab agent), then runs each exercise as the guided page does: *Start* makes a run
with a lab of its own, and each *Next step* is a ``scenario.step`` command the agent carries out;
the bench waits until that click has finished, then ``--pause`` seconds more (the learner's
reading time: 3 s by default, 0 for machine speed), then clicks again.

Printed per exercise: passed / failed / not-run / error, the wall time from the first click to
the verdict (pauses included), and for a failure the learner's message and the checks that did
not hold. Exits 1 when an exercise it ran did not pass.

Not driven unless named with --only: exercise 18 (a million keys: `flask --app app scenario run 18`
or tests/test_dedup_scale.py) and exercise 19 (it grades a consumer of the learner's own, which
nothing here runs).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text

from webapp.dev.stack import Stack
from webapp.domain.waits import wait_until
from webapp.scenarios import built_in, load
from webapp.scenarios.runner import RunState

# Exercises this bench skips unless asked for by name, and why.
NOT_DRIVEN = {
    "18": "a million dedup keys: its size is the lesson (tests/test_dedup_scale.py runs it scaled down)",
    "19": "it grades your own consumer, which this bench does not run",
}
# One click's longest wait (a step's wait has its own timeout, at most a couple of minutes).
CLICK_TIMEOUT = 300.0


def make_app(stack: Stack, data_dir: Path):
    from webapp import create_app
    return create_app({
        "TESTING": True, "SECRET_KEY": "bench-guided-pace", "WTF_CSRF_ENABLED": False,
        "DATABASE_URL": stack.database_url, "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "LAB_DATA_DIR": str(data_dir), "LAB_MAX_LABS": 0,
        # The embedded broker keeps every record in memory, as in the tests.
        "LAB_MAX_LOAD_EVENTS": 20_000, "LAB_MAX_WARMUP_KEYS": 20_000,
    })


def run_at_pace(app, exercise: Path, pause: float) -> tuple[RunState, float, int]:
    """Click through one exercise as the guided page does; (its final run, seconds, clicks)."""
    from webapp.web.db import db

    client = app.test_client()
    run_page = client.post(f"/scenarios/{exercise.stem}/runs").headers["Location"]
    run_id = int(run_page.rstrip("/").rsplit("/", 1)[1])

    def progress() -> tuple[bool, RunState]:
        with app.app_context(), db.engine.connect() as conn:
            busy, saved = conn.execute(text("SELECT busy, progress FROM lab_control.scenario_runs WHERE id = :id"),
                                       {"id": run_id}).one()
        return busy, RunState.from_dict(saved)

    started, clicks = time.monotonic(), 0
    run = progress()[1]
    for _ in range(len(load(exercise).steps) + 3):
        if clicks:
            time.sleep(pause)  # the learner reads the page before the next click: the point of this bench
        answer = client.post(run_page + "/next", headers={"HX-Request": "true"})
        if answer.status_code != 200:
            raise RuntimeError(f"{exercise.stem}: the click answered {answer.status_code}")
        clicks += 1
        wait_until(lambda: not progress()[0], timeout=CLICK_TIMEOUT, interval=0.2,
                   message=f"{exercise.stem}: a guided step never finished")
        run = progress()[1]
        if run.finished:
            break
    return run, time.monotonic() - started, clicks


def drop(app, lab_name: str) -> None:
    """The run's lab (its consumers stopped, topics and schema dropped): the next exercise runs alone."""
    from webapp.store import command_channel
    from webapp.web.db import db
    with app.app_context():
        command_channel.run(db.engine, lab_name, "lab.drop", {}, timeout=120)


def why_not_passed(run: RunState) -> str:
    failed_step = next((s for s in run.steps if s.get("status") not in ("ok", None)), None)
    lines = [f"      {run.reason or run.error or ''}".rstrip()]
    if failed_step and not run.reason:  # the reason names the failed step already
        lines.append(f"      step {failed_step.get('index')}: {failed_step.get('description')} — {failed_step.get('observed')}")
    lines += [f"      ✗ {c.get('label')}: wanted {c.get('wanted')}, observed {c.get('observed')}"
              for c in run.checks if not c.get("ok")]
    return "\n".join(line for line in lines if line.strip())


def chosen(only: list[str]) -> list[Path]:
    exercises = built_in()
    if not only:
        return [p for p in exercises if p.stem[:2] not in NOT_DRIVEN]
    picked = [p for p in exercises if any(p.stem == o or p.stem[:2] == o.zfill(2) for o in only)]
    unknown = [o for o in only if not any(p.stem == o or p.stem[:2] == o.zfill(2) for p in exercises)]
    if unknown:
        raise SystemExit(f"no exercise {', '.join(unknown)} (give a number like 21 or a file's name)")
    return picked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between a click's end and the next click")
    parser.add_argument("--only", action="append", default=[], help="an exercise's number or name (repeatable)")
    parser.add_argument("--stop-on-failure", action="store_true")
    args = parser.parse_args()
    if args.pause < 0:
        parser.error("--pause must be 0 or more seconds")
    exercises = chosen(args.only)

    results = []
    with tempfile.TemporaryDirectory(prefix="bench-guided-pace-") as tmp, Stack(Path(tmp), fault_proxy=True) as stack:
        app = make_app(stack, Path(tmp) / "data")
        print(f"guided, {args.pause:g} s between clicks, {len(exercises)} exercise(s)", flush=True)
        for exercise in exercises:
            run, seconds, clicks = run_at_pace(app, exercise, args.pause)
            results.append((exercise.stem, run.status, seconds))
            print(f"  {exercise.stem:<50} {run.status:<8} {seconds:6.1f} s  ({clicks} clicks)", flush=True)
            if run.status != "passed":
                print(why_not_passed(run), flush=True)
            drop(app, run.lab)
            if run.status != "passed" and args.stop_on_failure:
                break
        from webapp.web.db import db
        with app.app_context():
            db.engine.dispose()
    passed = sum(1 for _, status, _ in results if status == "passed")
    print(f"{passed}/{len(results)} passed; {sum(s for _, _, s in results):.0f} s in all")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
