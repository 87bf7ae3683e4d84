"""The soak: events under chaos and a PostgreSQL restart, then the truth read independently.

A private stack in a temp dir: embedded PostgreSQL, the Tansu broker advertising a fault proxy (so
every Kafka client, consumers included, talks through it and chaos can cut their connections), the
fault proxy and a lab agent, each a process of its own. One lab, one group per strategy, each on its
own lane (copy of the accounts), three consumers per group. The lab's load generator publishes N
events (5% resends of a recent event, 5% source duplicates of a recent transaction) in two halves
spread over the run, while chaos acts on every group about every 2 s (kill, freeze then thaw,
restart, terminate the effects session, cut the broker connections); between the halves
PostgreSQL is restarted once (stop, start on the same data directory) under the running lab. Then
it stops chaos, waits until every group has consumed the log (a group the lab shows stalled is
recovered with the lab's own recover_group, each recovery listed with its time; one still stalled
after two recoveries is a failure), and reads the truth from the log mirror and the effect tables
with its own SQL, not the lab's verdict:

- lost: transactions with a valid credit in the log and no payment row;
- applied twice: the same event applied more than once (a redelivery not absorbed);
- source dups twice: a transaction credited under two event ids (only a business key absorbs these);
- absorbed: deliveries the strategy absorbed;
- verdict agrees: the lab's verdict counts the same duplicates and the same losses.

    .venv/bin/python bench/soak.py            # 10,000 events over about 3 minutes (make soak)
    .venv/bin/python bench/soak.py --short    # 1,000 events over 30 s (tests/test_soak.py)
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlalchemy import text

from webapp import ops
from webapp.dev.stack import Stack
from webapp.domain.chaos_plan import ACTIONS
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.store import command_channel

STRATEGIES = ("none", "eventid-atomic", "insert-first", "business-key")
# The strategies whose guarantee covers redeliveries: nothing lost, nothing applied twice.
GUARANTEED = ("eventid-atomic", "insert-first", "business-key")
CONSUMERS_PER_GROUP = 3
CHAOS_EVERY_SECONDS = 2.0
DOWN_SECONDS = 3.0
# Chaos goes on until every group has taken at least this many actions (the publish may be over
# sooner on a fast machine, and a loaded one acts less often than every 2 s).
MIN_ACTIONS_PER_GROUP = 5
RESEND_SHARE = 0.05
SOURCE_DUPLICATE_SHARE = 0.05

TRUTH_SQL = """
WITH credits AS (
    SELECT r.transaction_id, r.partition, r."offset",
           r."offset" < coalesce((SELECT g.committed FROM {log}.group_offsets g
                                  WHERE g.group_id = :group_id AND g.partition = r.partition), 0)
           OR EXISTS (SELECT 1 FROM {lane}.deliveries d WHERE d.partition = r.partition AND d."offset" = r."offset")
               AS consumed
    FROM {log}.log_records r WHERE r.type = 'credit' AND r.invalid_reason IS NULL
),
per_event AS (SELECT transaction_id, event_id, count(*) AS n FROM {lane}.payments GROUP BY 1, 2),
per_tx AS (SELECT transaction_id, sum(n) AS n FROM per_event GROUP BY 1)
SELECT (SELECT count(DISTINCT c.transaction_id) FROM credits c WHERE c.consumed AND NOT EXISTS (
            SELECT 1 FROM {lane}.payments p WHERE p.transaction_id = c.transaction_id)) AS lost,
       (SELECT coalesce(sum(n - 1), 0)::bigint FROM per_event WHERE n > 1) AS applied_twice,
       (SELECT coalesce(sum(n - 1), 0)::bigint FROM per_tx WHERE n > 1) AS duplicates,
       (SELECT count(*) FROM {lane}.deliveries WHERE outcome = 'absorbed') AS absorbed,
       (SELECT count(DISTINCT transaction_id) FROM credits) AS transactions,
       (SELECT count(*) FROM credits WHERE NOT consumed) AS not_consumed
"""


@dataclass
class Row:
    strategy: str
    transactions: int
    lost: int
    applied_twice: int
    source_duplicates_twice: int
    absorbed: int
    verdict_duplicates: int
    verdict_lost: int
    not_consumed: int      # records the group never consumed (a failure: a wedged group)
    wedged: bool

    @property
    def verdict_agrees(self) -> bool:
        return (self.verdict_duplicates == self.applied_twice + self.source_duplicates_twice
                and self.verdict_lost == self.lost)


def load(ctx: ops.Context, events: int, seconds: float, seed: int) -> dict:
    """Produce ``events`` records over ``seconds`` with the lab's load generator (a thread of the
    agent with its own producer, so chaos's commands never queue behind publishing); wait for it."""
    rate = max(1, round(events / seconds))
    run = ops.call("start_load", ctx, {"events": events, "accounts": 5, "rate_per_second": rate, "seed": seed,
                                       "resend_ratio": RESEND_SHARE, "source_duplicate_ratio": SOURCE_DUPLICATE_SHARE})
    return wait_until(lambda: (r := _newest_run(ctx, run["run_id"])) and r["state"] not in ("starting", "running") and r,
                      timeout=seconds * 4 + 60, interval=0.5, message=lambda: f"the load never finished: "
                                                                           f"{_newest_run(ctx, run['run_id'])}")


def _newest_run(ctx: ops.Context, run_id: int) -> dict | None:
    runs = _try(lambda: ops.call("get_load", ctx)["runs"]) or []
    return next((r for r in runs if r["id"] == run_id), None)


def truth(engine, lab: Lab, lane_schema: str, group_id: str, strategy: str, verdict: dict, wedged: bool) -> Row:
    """Counted here from the log mirror and the lane's effect tables: the lab's verdict is only compared."""
    with engine.connect() as conn:
        row = conn.execute(text(TRUTH_SQL.format(log=f'"{lab.schema}"', lane=f'"{lane_schema}"')),
                           {"group_id": group_id}).mappings().one()
    return Row(strategy, row["transactions"], row["lost"], row["applied_twice"],
               row["duplicates"] - row["applied_twice"], row["absorbed"], verdict["duplicates_applied"],
               verdict["effects_lost"], row["not_consumed"], wedged)


def lane(strategy: str) -> str:
    return strategy.replace("-", "_")


def lane_settled(lane_state: dict) -> bool:
    verdict = lane_state["verdict"]
    return verdict["pending"] == 0 and verdict["not_yet_applied"] == 0 and verdict["records"] > 0


def soak(events: int, seconds: float, base: Path, restart_postgres: bool = True, say=print,
         kafka_debug: str = "") -> dict:
    # PostgreSQL, the broker behind a fault proxy, the proxy and an agent (webapp/dev/stack.py).
    # PYTHONFAULTHANDLER: a process that crashes (or gets SIGABRT while stuck) logs every thread's stack.
    # kafka_debug: librdkafka's debug contexts in every consumer's log (LAB_KAFKA_DEBUG), to trace a stall.
    stack = Stack(base, fault_proxy=True, env={"PYTHONFAULTHANDLER": "1", "LAB_KAFKA_DEBUG": kafka_debug},
                  stop_timeout=30).start()
    engine = stack.engine()
    lab = Lab("soak")
    ctx = ops.Context(engine, lab)
    timings: dict[str, float] = {}
    try:
        command_channel.run(engine, lab.name, "lab.ensure", {"partitions": 3}, timeout=60)
        for strategy in STRATEGIES:
            ops.call("create_group", ctx, {"group": lane(strategy), "strategy": strategy, "lane": lane(strategy)})
            for n in range(1, CONSUMERS_PER_GROUP + 1):
                ops.call("start_consumer", ctx, {"group": lane(strategy), "name": f"{lane(strategy)[:8]}_{n}"})
        wait_until(lambda: sum(1 for c in ops.call("get_state", ctx)["consumers"] if c["assigned"])
                   >= len(STRATEGIES), timeout=120, message="the groups were never assigned")
        say(f"stack up; {len(STRATEGIES)} groups x {CONSUMERS_PER_GROUP} consumers; publishing {events} events "
            f"over {seconds:g} s under chaos every {CHAOS_EVERY_SECONDS:g} s")
        for index, strategy in enumerate(STRATEGIES):
            ops.call("start_chaos", ctx, {"group": lane(strategy), "seed": 1000 + index, "actions": list(ACTIONS),
                                          "every_seconds": CHAOS_EVERY_SECONDS, "down_seconds": DOWN_SECONDS})
        started = time.monotonic()
        halves = (events // 2, events - events // 2)
        runs = [load(ctx, halves[0], seconds / 2, seed=1)]
        if restart_postgres:
            # Once, halfway: the consumers are still working through the first half, under chaos.
            down = time.monotonic()
            stack.postgres.stop()
            stack.postgres.start()
            timings["postgres_down_s"] = round(time.monotonic() - down, 2)
            say(f"PostgreSQL restarted after {runs[0]['sent']} events (down {timings['postgres_down_s']} s)")
            wait_until(lambda: _try(lambda: command_channel.run(engine, lab.name, "lab.ensure", {"partitions": 3})),
                       timeout=60, message="the agent did not take commands again after the restart")
        runs.append(load(ctx, halves[1], seconds / 2, seed=2))
        timings["publish_s"] = round(time.monotonic() - started, 1)
        wait_until(lambda: _chaos_done_enough(ctx), timeout=180, interval=0.5,
                   message=lambda: f"chaos fell short of {MIN_ACTIONS_PER_GROUP} actions per group: "
                                   f"{_actions_by_group(ctx)}")
        stopped = wait_until(lambda: _try(lambda: ops.call("stop_chaos", ctx, {})), timeout=120,
                             message="chaos did not stop")
        chaos_sessions = ops.call("get_chaos", ctx)["sessions"]
        settle_started = time.monotonic()
        state, wedged, recoveries = settle(ctx, say)
        timings["settle_s"] = round(time.monotonic() - settle_started, 1)
        rows = []
        for lane_state in sorted(state["lanes"], key=lambda l: STRATEGIES.index(l["groups"][0]["strategy"])):
            strategy = lane_state["groups"][0]["strategy"]
            group_id = lane_state["groups"][0]["group_id"]
            rows.append(truth(engine, lab, lane_state["schema"], group_id, strategy, lane_state["verdict"],
                              group_id in wedged))
        return {"events": sum(r["sent"] for r in runs), "log_records": state["lanes"][0]["verdict"]["records"],
                "load_runs": [{k: r[k] for k in ("state", "sent", "resends", "source_duplicates", "failed")}
                              for r in runs], "chaos_actions": sum(s["actions_done"] for s in chaos_sessions),
                "chaos_actions_by_group": {s["group_id"]: s["actions_done"] for s in chaos_sessions}, "wedged": wedged,
                "recoveries": recoveries,
                "chaos_stopped": stopped["stopped"], "rows": [asdict(r) | {"verdict_agrees": r.verdict_agrees} for r in rows],
                **timings}
    finally:
        engine.dispose()
        stack.stop()


def _actions_by_group(ctx: ops.Context) -> dict[str, int]:
    """Actions taken so far by each group's chaos session."""
    return {s["group_id"]: s["actions_done"] for s in (_try(lambda: ops.call("get_chaos", ctx)) or {}).get("sessions", [])}


def _chaos_done_enough(ctx: ops.Context) -> bool:
    counts = _actions_by_group(ctx)
    return len(counts) == len(STRATEGIES) and min(counts.values()) >= MIN_ACTIONS_PER_GROUP


MAX_RECOVERIES = 2   # a group the lab shows stalled again after this many recoveries is wedged: a failure


def settle(ctx: ops.Context, say) -> tuple[dict, list[str], list[dict]]:
    """Wait until every group has consumed the whole log. A group the lab itself shows stalled (its
    group health: live members, nothing assigned or no progress, past the group's threshold) is
    recovered through the lab's own control, recover_group, as an instructor would click it; each
    recovery is listed with when it started and how long it took. A group stalled again after
    MAX_RECOVERIES recoveries is reported wedged, and the soak fails."""
    recoveries: list[dict] = []
    wedged: list[str] = []
    started = time.monotonic()
    deadline = started + 300
    state = None
    while time.monotonic() < deadline:
        state = _try(lambda: ops.call("get_state", ctx)) or state
        if state is None:
            time.sleep(1)  # PostgreSQL or the agent not answering yet
            continue
        health = {group["group_id"]: group.get("health") or {} for group in state["groups"]}
        waiting = False
        for lane_state in state["lanes"]:
            group_id = lane_state["groups"][0]["group_id"]
            if lane_settled(lane_state) or group_id in wedged:
                continue
            waiting = True
            if health.get(group_id, {}).get("state") != "stalled":
                continue
            if sum(r["group_id"] == group_id for r in recoveries) >= MAX_RECOVERIES:
                say(f"{group_id}: stalled again after {MAX_RECOVERIES} recoveries: wedged")
                wedged.append(group_id)
                continue
            say(f"{group_id}: {health[group_id].get('sentence')} Recovering it.")
            began = time.monotonic()
            result = _try(lambda: ops.call("recover_group", ctx, {"group": ctx.lab.local_group(group_id)}))
            recoveries.append({"group_id": group_id, "at_s": round(began - started, 1),
                               "took_s": round(time.monotonic() - began, 1),
                               "moved": bool(result and result.get("moved")),
                               "steps": result["steps"] if result else ["the recovery did not answer"]})
            say(f"{group_id}: {'; '.join(recoveries[-1]['steps'])}")
        if not waiting:
            return state, wedged, recoveries
        time.sleep(1)  # the state is read once a second, as the dashboard does
    raise TimeoutError("the groups neither consumed the whole log nor wedged within 300 s")


def _try(call):
    """The call's result, or None while PostgreSQL is still coming back."""
    try:
        return call()
    except Exception:
        return None


def expected_failures(report: dict) -> list[str]:
    """What the issue expects, as sentences for each way the report falls short."""
    problems = [f"{group_id} stayed stalled through {MAX_RECOVERIES} recoveries: wedged"
                for group_id in report["wedged"]]
    for row in report["rows"]:
        if row["strategy"] in GUARANTEED and (row["lost"] or row["applied_twice"]):
            problems.append(f"{row['strategy']}: {row['lost']} lost, {row['applied_twice']} applied twice")
        if row["strategy"] == "business-key" and row["source_duplicates_twice"]:
            problems.append(f"business-key credited {row['source_duplicates_twice']} source duplicate(s) twice")
        if row["not_consumed"] and not row["wedged"]:
            problems.append(f"{row['strategy']}: {row['not_consumed']} record(s) never consumed")
        if not row["verdict_agrees"]:
            problems.append(f"{row['strategy']}: the verdict ({row['verdict_duplicates']} duplicates, "
                            f"{row['verdict_lost']} lost) differs from the independent count")
    return problems


def print_table(report: dict) -> None:
    print(f"\n{report['events']} events published ({report['log_records']} records in the log), "
          f"{report['chaos_actions']} chaos actions, publish {report['publish_s']} s, settle {report['settle_s']} s, "
          f"PostgreSQL down {report.get('postgres_down_s', '-')} s; load runs {report['load_runs']}\n")
    header = ("strategy", "transactions", "lost", "applied twice", "source dups twice", "absorbed", "verdict agrees",
              "not consumed")
    print(" | ".join(f"{h:>17}" for h in header))
    for row in report["rows"]:
        cells = (row["strategy"], row["transactions"], row["lost"], row["applied_twice"], row["source_duplicates_twice"],
                 row["absorbed"], "yes" if row["verdict_agrees"] else
                 f"NO ({row['verdict_duplicates']} dup, {row['verdict_lost']} lost)",
                 f"{row['not_consumed']} (wedged)" if row["wedged"] else row["not_consumed"])
        print(" | ".join(f"{str(c):>17}" for c in cells))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--short", action="store_true", help="1,000 events over 30 s (the CI version)")
    parser.add_argument("--events", type=int, help="events to publish (default 10,000; --short 1,000)")
    parser.add_argument("--seconds", type=float, help="spread them over this long (default 180; --short 30)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--kafka-debug", default="", metavar="CONTEXTS",
                        help="librdkafka debug contexts in each consumer's log, e.g. cgrp,protocol (with --keep)")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs of every process)")
    args = parser.parse_args()
    events = args.events or (1000 if args.short else 10_000)
    seconds = args.seconds or (30.0 if args.short else 180.0)
    say = (lambda *a: None) if args.json else print
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        report = soak(events, seconds, args.keep.resolve(), say=say, kafka_debug=args.kafka_debug)
    else:
        with tempfile.TemporaryDirectory(prefix="soak-") as base:
            report = soak(events, seconds, Path(base), say=say, kafka_debug=args.kafka_debug)
    if args.json:
        print(json.dumps(report))
    else:
        print_table(report)
    for recovery in report["recoveries"]:
        print(f"↻ {recovery['group_id']} recovered at {recovery['at_s']} s of the settle, in {recovery['took_s']} s"
              f"{' (moved to a fresh group id)' if recovery['moved'] else ''}", file=sys.stderr)
    problems = expected_failures(report)
    for problem in problems:
        print(f"✕ {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
