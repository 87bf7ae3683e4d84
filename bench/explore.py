"""The explorer against each strategy: how many runs, how long to the first failure and to shrink it.

    .venv/bin/python bench/explore.py [--runs 30] [--seed 1] [--reproduce 3] [--faults crash,kill] [--strategy none ...]

One embedded stack (PostgreSQL, the Tansu broker, a lab agent), started fresh. Per strategy, one
exploration (webapp/explorer/search.py) with the same budget and seed, printed as:

- runs: every scenario run (search, shrinking, reproducing), each in a fresh lab dropped after;
- to first failure: seconds from the start to the end of the first run whose verdict showed an anomaly;
- to shrink: seconds the shrinking took (its runs included);
- final length: steps of the shrunk scenario, against the steps of the hand-written exercise that
  shows the same failure;
- reproduced: how often the final schedule failed again, out of how many runs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from webapp.dev.stack import Stack

# The hand-written exercise that shows each strategy's failure (or, for eventid-atomic, that it absorbs).
EXERCISES = {"none": "1", "check-then-act": "3", "eventid-split": "4", "eventid-atomic": "2"}


def make_app(stack: Stack, data_dir: Path):
    from webapp import create_app
    return create_app({
        "TESTING": True, "SECRET_KEY": "bench-explore", "WTF_CSRF_ENABLED": False,
        "DATABASE_URL": stack.database_url, "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers,
        "LAB_DATA_DIR": str(data_dir), "LAB_MAX_LABS": 0,
    })


def explore_one(app, strategy: str, runs: int, seed: int, reproduce: int, faults: tuple[str, ...] | None = None) -> dict:
    from webapp import ops
    from webapp.domain.lab import Lab
    from webapp.explorer.search import Budget, Target, explore
    from webapp.scenarios import find, load
    from webapp.web.db import db

    started = time.monotonic()
    marks: dict[str, float] = {}

    def note(progress) -> None:
        now = time.monotonic() - started
        if progress.anomaly_found and "found" not in marks:
            marks["found"] = now
        if progress.phase in ("reproducing", "done") and "shrunk" not in marks and "found" in marks:
            # Shrinking ended with the run before this one (its last candidate).
            marks["shrunk"] = marks["last"]
        marks["last"] = now
        print(f"    {time.monotonic() - started:6.1f} s  {progress.phase:<11} run {progress.runs_done:>3}  steps {progress.schedule_length or '-':>3}"
              f"  {'anomaly' if progress.anomaly_found else ''}", flush=True)

    with app.app_context():
        ctx = ops.Context(db.engine, Lab("bench"), app.config)
        result = explore(ctx, Target(strategy=strategy), Budget(runs=runs, faults=faults), seed, reproduce=reproduce,
                         on_progress=note)
    return {"strategy": strategy, "result": result, "exercise_steps": len(load(find(EXERCISES[strategy])).steps),
            "to_first_failure": marks.get("found"),
            "to_shrink": marks["shrunk"] - marks["found"] if "shrunk" in marks else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=30, help="the search's budget in runs, per strategy")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults", default=None,
                        help="the fault kinds, comma-separated (default: every kind the strategy is judged on)")
    parser.add_argument("--reproduce", type=int, default=3, help="how often the final schedule is run again")
    parser.add_argument("--strategy", action="append", choices=tuple(EXERCISES), default=[])
    args = parser.parse_args()
    if args.runs < 1 or args.reproduce < 0:
        parser.error("--runs must be at least 1 and --reproduce 0 or more")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-explore-") as tmp, Stack(Path(tmp)) as stack:
        app = make_app(stack, Path(tmp) / "data")
        for strategy in args.strategy or list(EXERCISES):
            print(f"{strategy}: seed {args.seed}, at most {args.runs} run(s) searching", flush=True)
            faults = tuple(k.strip() for k in args.faults.split(",") if k.strip()) if args.faults else None
            rows.append(explore_one(app, strategy, args.runs, args.seed, args.reproduce, faults))
            result = rows[-1]["result"]
            print("    " + (result.why or result.tried), flush=True)
        from webapp.web.db import db
        with app.app_context():
            db.engine.dispose()
    print(f"\n{'strategy':<16}{'runs':>5}{'seconds':>9}{'1st failure':>13}{'shrink':>9}{'steps':>7}"
          f"{'from':>6}{'exercise':>10}{'reproduced':>12}")
    for row in rows:
        r = row["result"]
        seconds = lambda v: f"{v:.0f} s" if v is not None else "—"  # noqa: E731
        print(f"{row['strategy']:<16}{r.runs:>5}{r.seconds:>8.0f}s{seconds(row['to_first_failure']):>13}"
              f"{seconds(row['to_shrink']):>9}{r.schedule_length or '—':>7}{r.original_length or '—':>6}"
              f"{row['exercise_steps']:>10}{(f'{r.reproduced}/{r.reproduce_attempts}' if r.found else '—'):>12}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
