"""Load held (issue 15): 40 viewers (a projector and a class) watch one lab while 1,000 ev/s flow.

A private stack in a temp dir: embedded PostgreSQL, the Tansu broker, a lab agent and the web app
under gunicorn with the image's config (gthread workers), each a process of its own. The lab's
group runs eventid-atomic with two consumers; the load generator (``start_load``, a thread of the
agent) produces at 1,000 events/s for the whole run. Each simulated viewer does what
static/js/live.js does in a browser: ``GET /live`` once a second, then ``GET /panels/<name>`` for
every panel whose fingerprint changed (the chart as ``/panels/chart.json``). Printed per endpoint:
requests, p50/p95/p99 in ms, errors (any answer but 200, or no answer), and the share of answers
that were a slow panel's last load, marked stale (LIVE_STALE_AFTER_SECONDS): the viewer keeps that
load's fingerprint, as live.js does, and so asks again. Goal: p95 < 100 ms, 0 errors.

    .venv/bin/python bench/viewers.py [--viewers 40] [--seconds 60] [--rate 1000] [--keep DIR]
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import requests

from webapp import ops
from webapp.dev.stack import Stack
from webapp.domain.waits import LOOPBACK, free_port, wait_until
from webapp.store import command_channel
from webapp.store.labs import Lab

POLL_SECONDS = 1.0   # static/js/live.js POLL_MS
GOAL_P95_MS = 100.0


class Viewer(threading.Thread):
    """One browser tab: polls /live, refetches what changed, records each answer's time."""

    def __init__(self, base_url: str, until: float, results: dict, lock: threading.Lock, offset: float):
        super().__init__(daemon=True)
        self.base_url, self.until, self.results, self.lock, self.offset = base_url, until, results, lock, offset
        self.session = requests.Session()
        self.fingerprints: dict[str, str] = {}

    def get(self, endpoint: str, path: str) -> requests.Response | None:
        started = time.perf_counter()
        try:
            response = self.session.get(self.base_url + path, timeout=10)
            ok = response.status_code == 200
        except requests.RequestException:
            response, ok = None, False
        elapsed = (time.perf_counter() - started) * 1000
        with self.lock:
            self.results[endpoint]["ms"].append(elapsed)
            self.results[endpoint]["errors"] += 0 if ok else 1
            age = stale_age(response) if ok else None
            self.results[endpoint]["stale"] += 1 if age is not None else 0
            self.results[endpoint]["ages"].append(age or 0.0)
        return response if ok else None

    def run(self) -> None:
        time.sleep(self.offset)  # the class does not open the page in the same millisecond
        while time.monotonic() < self.until:
            tick = time.monotonic()
            live = self.get("/live", "/live")
            if live is not None:
                for name, fingerprint in live.json()["fingerprints"].items():
                    if self.fingerprints.get(name) != fingerprint:
                        path = "/panels/chart.json" if name == "chart" else f"/panels/{name}"
                        answer = self.get(path, path)
                        if answer is not None:  # what the panel shows: an older load's, if stale
                            self.fingerprints[name] = shown_fingerprint(answer)
            rest = POLL_SECONDS - (time.monotonic() - tick)
            if rest > 0:
                time.sleep(rest)  # live.js waits a second between polls


def stale_age(response: requests.Response) -> float | None:
    """How old the answer is when it is a slow panel's last load (marked stale), else None."""
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return response.json().get("stale_for")
    found = re.search(r'data-stale="([0-9.]+)"', response.text)
    return float(found.group(1)) if found else None


def shown_fingerprint(response: requests.Response) -> str | None:
    if response.headers.get("Content-Type", "").startswith("application/json"):
        return response.json().get("fingerprint")
    found = re.search(r'data-fingerprint="([^"]*)"', response.text)
    return found.group(1) if found else None


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--viewers", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=int, default=1000, help="events per second from the load generator")
    parser.add_argument("--web-workers", default="2", help="gunicorn workers (WEB_WORKERS)")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs of every process)")
    args = parser.parse_args()
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        return run(args, args.keep.resolve())
    # The stack's files (the database, the broker's log) are a few hundred MB a run.
    with tempfile.TemporaryDirectory(prefix="viewers-") as base:
        return run(args, Path(base))


def run(args: argparse.Namespace, base: Path) -> int:
    """The stack in ``base``, the viewers against it; 0 when the goal held."""
    lab = Lab("viewers")
    port = free_port()
    # PostgreSQL, the broker and an agent (webapp/dev/stack.py), then the web app under gunicorn.
    with Stack(base, env={"LAB_NAME": lab.name, "LAB_PORT": str(port), "LAB_BROKER_KIND": "tansu",
                          "WEB_WORKERS": args.web_workers}, stop_timeout=30) as stack:
        stack.spawn("web", ["-m", "gunicorn", "--config", "gunicorn.conf.py", "app:app"], "web.log")
        engine = stack.engine()
        try:
            return measure(args, engine, lab, port)
        finally:
            engine.dispose()


def measure(args: argparse.Namespace, engine, lab: Lab, port: int) -> int:
    """The lab's group and load, the viewers against the web app; 0 when the goal held."""
    command_channel.run(engine, lab.name, "lab.ensure", {"partitions": 3}, timeout=60)
    ctx = ops.Context(engine, lab)
    ops.call("set_strategy", ctx, {"group": "payments", "strategy": "eventid-atomic"})
    for name in ("c1", "c2"):
        ops.call("start_consumer", ctx, {"name": name})
    base_url = f"http://{LOOPBACK}:{port}"
    wait_until(lambda: _answers(base_url), timeout=60, message="the web app did not answer")
    run = ops.call("start_load", ctx, {"events": int(args.rate * (args.seconds + 10)), "rate_per_second": args.rate,
                                        "resend_ratio": 0.02, "source_duplicate_ratio": 0.01})
    print(f"load {run.get('id', '')} at {args.rate} ev/s; {args.viewers} viewers for {args.seconds:g} s "
          f"on gunicorn ({args.web_workers} workers)")
    results: dict = defaultdict(lambda: {"ms": [], "errors": 0, "stale": 0, "ages": []})
    lock = threading.Lock()
    until = time.monotonic() + args.seconds
    viewers = [Viewer(base_url, until, results, lock, offset=i * POLL_SECONDS / args.viewers)
               for i in range(args.viewers)]
    for viewer in viewers:
        viewer.start()
    for viewer in viewers:
        viewer.join()
    load = ops.call("get_load", ctx)["runs"][0]
    ops.call("cancel_load", ctx)
    print(f"load generator: {load['sent']} sent at {float(load['rate'] or 0):.0f} ev/s (state {load['state']})\n")
    print(f"{'endpoint':<28}{'requests':>9}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}{'errors':>8}{'stale':>8}"
          f"{'age p95 s':>11}")
    worst = 0.0
    errors = 0
    for endpoint, data in sorted(results.items(), key=lambda item: -len(item[1]["ms"])):
        ms = data["ms"]
        p95 = percentile(ms, 0.95)
        worst, errors = max(worst, p95), errors + data["errors"]
        print(f"{endpoint:<28}{len(ms):>9}{statistics.median(ms):>9.1f}{p95:>9.1f}{percentile(ms, 0.99):>9.1f}"
              f"{data['errors']:>8}{data['stale'] / len(ms):>8.0%}{percentile(data['ages'], 0.95):>11.1f}")
    all_ms = [m for data in results.values() for m in data["ms"]]
    stale = sum(data["stale"] for data in results.values())
    ages = [age for data in results.values() for age in data["ages"]]
    print(f"{'all':<28}{len(all_ms):>9}{statistics.median(all_ms):>9.1f}{percentile(all_ms, 0.95):>9.1f}"
          f"{percentile(all_ms, 0.99):>9.1f}{errors:>8}{stale / len(all_ms):>8.0%}{percentile(ages, 0.95):>11.1f}")
    held = worst < GOAL_P95_MS and errors == 0
    print(f"\n{'✓' if held else '✕'} goal p95 < {GOAL_P95_MS:g} ms on every endpoint, 0 errors: worst p95 "
          f"{worst:.1f} ms, {errors} error(s)")
    return 0 if held else 1


def _answers(base_url: str) -> bool:
    try:
        return requests.get(base_url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    sys.exit(main())
