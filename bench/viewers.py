"""Load held: viewers (a projector and a class) watch one lab while events flow.

A private stack in a temp dir: embedded PostgreSQL, the Tansu broker, a lab agent and the web app
under gunicorn with the image's config (gthread workers), each a process of its own. The lab's
group runs eventid-atomic with two consumers; the load generator (``start_load``, a thread of the
agent) produces at ``--rate`` events/s for the whole run.

Two ways to watch (``--mode``, one run per mode and viewer count, side by side on one stack):

- ``poll``: each simulated viewer does what static/js/live-refresh.js does without a stream: ``GET /live``
  once a second, then ``GET /panels/<name>`` for every panel whose fingerprint changed (the chart
  as ``/panels/chart.json``);
- ``push``: each viewer holds ``GET /stream`` (web/push.py) and reads the panels it is sent (the
  chart's series too).

Freshness: a probe sets the lab's lock_timeout to a new value once a second (one committed
transaction; a few seconds, harmless to the consumers) and notes when it committed; a viewer notes
when it first has that value (the SQL panel's session settings: a panel the load does not churn). Printed per run: freshness p50/p95 (commit to the viewer having the
panel's HTML, not the browser's paint), values the viewer never showed (overwritten first), the web
tier's CPU seconds per minute (gunicorn's master and workers, from /proc), requests, errors (any
answer but 200, no answer, a dropped or refused stream) and the share of answers that were a slow
panel's last load, marked stale.

    .venv/bin/python bench/viewers.py [--viewers 10,40] [--mode poll,push] [--seconds 60] [--rate 1000]
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

import psutil
import requests

from webapp import ops
from webapp.dev.stack import Stack
from webapp.domain.lab import Lab
from webapp.domain.waits import LOOPBACK, free_port, wait_until
from webapp.store import command_channel, labdata, schema

POLL_SECONDS = 1.0   # static/js/live-refresh.js POLL_MS
PROBE_SECONDS = 1.0  # one TTL change a second: the freshness probe
PROBE_SHOWN = re.compile(r"<b>lock_timeout</b> (\d+) ms")  # the SQL panel's session settings
# Values below the consumers' bound (a quarter of max.poll.interval.ms, 7,500 ms by default): the
# panel shows the effective lock_timeout, which a larger value would not move.
PROBE_BASE_MS = 1_000
GOAL_P95_MS = 1000.0  # freshness p95


class Run:
    """What one run's viewers saw: answer times per endpoint, freshness, errors."""

    def __init__(self, committed: dict[int, float]):
        self.lock = threading.Lock()
        self.committed = committed  # TTL value -> when its transaction had committed
        self.endpoints: dict = defaultdict(lambda: {"ms": [], "errors": 0, "stale": 0, "ages": []})
        self.freshness: list[float] = []
        self.errors = 0
        self.kinds: Counter = Counter()  # a stream's errors by kind
        self.events = 0
        self.bytes = 0

    def answer(self, endpoint: str, elapsed_ms: float, response: requests.Response | None) -> None:
        with self.lock:
            data = self.endpoints[endpoint]
            data["ms"].append(elapsed_ms)
            data["errors"] += 0 if response is not None else 1
            self.errors += 0 if response is not None else 1
            age = stale_age(response) if response is not None else None
            data["stale"] += 1 if age is not None else 0
            data["ages"].append(age or 0.0)

    def shown(self, viewer: "Viewer", html: str) -> None:
        """An SQL panel reached ``viewer``: the lock_timeout it shows, the first time, is a freshness sample."""
        now = time.time()
        with self.lock:
            for found in PROBE_SHOWN.finditer(html):
                value = int(found.group(1))
                if value not in viewer.seen and value in self.committed:
                    viewer.seen.add(value)
                    self.freshness.append(max(0.0, now - self.committed[value]) * 1000)

    def error(self, kind: str) -> None:
        with self.lock:
            self.errors += 1
            self.kinds[kind] += 1


class Viewer(threading.Thread):
    """One browser tab that polls (static/js/live-refresh.js without a stream): /live, then what changed."""

    def __init__(self, base_url: str, until: float, run: Run, offset: float):
        super().__init__(daemon=True)
        self.base_url, self.until, self.run_, self.offset = base_url, until, run, offset
        self.session = requests.Session()
        self.fingerprints: dict[str, str] = {}
        self.seen: set[int] = set()

    def get(self, endpoint: str, path: str, **kwargs) -> requests.Response | None:
        started = time.perf_counter()
        try:
            response = self.session.get(self.base_url + path, timeout=10, **kwargs)
            ok = response.status_code == 200
        except requests.RequestException:
            response, ok = None, False
        self.run_.answer(endpoint, (time.perf_counter() - started) * 1000, response if ok else None)
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
                            if name == "sql":
                                self.run_.shown(self, answer.text)
            rest = POLL_SECONDS - (time.monotonic() - tick)
            if rest > 0:
                time.sleep(rest)  # live-refresh.js waits a second between polls


class PushViewer(Viewer):
    """One browser tab on the stream: reads the panels it is sent; the chart's event fetches its JSON."""

    def run(self) -> None:
        time.sleep(self.offset)
        while time.monotonic() < self.until:
            try:
                with self.session.get(self.base_url + "/stream", stream=True, timeout=(10, 30)) as response:
                    if response.status_code != 200:
                        self.run_.error(f"HTTP {response.status_code}")
                        continue
                    for name, data in events(response):
                        if name == "refused":
                            self.run_.error("refused")
                            return
                        with self.run_.lock:
                            self.run_.events += 1
                            self.run_.bytes += len(data)
                        if name == "sql":
                            self.run_.shown(self, data)
                        if time.monotonic() >= self.until:
                            return
            except requests.RequestException as error:
                if time.monotonic() < self.until:
                    self.run_.error(type(error).__name__)


def events(response: requests.Response):
    """The server-sent events of a streamed response, as ``(name, data)``."""
    name, data = None, []
    for line in response.iter_lines(decode_unicode=True):
        if line == "":
            if name:
                yield name, "\n".join(data)
            name, data = None, []
        elif line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data.append(line[6:])


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
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))]


def web_cpu_seconds(master: psutil.Process) -> float:
    """CPU seconds (user + system) of gunicorn's master and its workers so far."""
    total = 0.0
    for process in [master, *master.children(recursive=True)]:
        try:
            times = process.cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--viewers", default="10,40", help="viewer counts, one run each: 10,40")
    parser.add_argument("--mode", default="poll,push", help="poll, push or both: poll,push")
    parser.add_argument("--seconds", type=float, default=60.0, help="each run's length")
    parser.add_argument("--rate", type=int, default=1000, help="events per second from the load generator")
    parser.add_argument("--web-workers", default="2", help="gunicorn workers (WEB_WORKERS)")
    parser.add_argument("--keep", type=Path, help="run in this directory and keep it (logs of every process)")
    args = parser.parse_args()
    args.viewer_counts = [int(n) for n in args.viewers.split(",")]
    args.modes = [mode.strip() for mode in args.mode.split(",")]
    if set(args.modes) - {"poll", "push"}:
        parser.error("--mode: poll, push or poll,push")
    if args.seconds > 95 or len(args.viewer_counts) * len(args.modes) > 60:
        parser.error("at most 95 s a run and 60 runs: the probe's values must stay below the consumers' bound")
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
        web = stack.spawn("web", ["-m", "gunicorn", "--config", "gunicorn.conf.py", "app:app"], "web.log")
        engine = stack.engine()
        try:
            return measure(args, engine, lab, port, psutil.Process(web.pid))
        finally:
            engine.dispose()


def measure(args: argparse.Namespace, engine, lab: Lab, port: int, web: psutil.Process) -> int:
    """The lab's group and load, each run's viewers against the web app; 0 when the goal held."""
    command_channel.run(engine, lab.name, "lab.ensure", {"partitions": 3}, timeout=60)
    ctx = ops.Context(engine, lab)
    ops.call("set_strategy", ctx, {"group": "payments", "strategy": "eventid-atomic"})
    for name in ("c1", "c2"):
        ops.call("start_consumer", ctx, {"name": name})
    base_url = f"http://{LOOPBACK}:{port}"
    wait_until(lambda: _answers(base_url), timeout=60, message="the web app did not answer")
    runs = [(mode, viewers) for viewers in args.viewer_counts for mode in args.modes]
    total = (args.seconds + 15) * len(runs) + 30  # headroom: the load outlasts the last run
    ops.call("start_load", ctx, {"events": int(args.rate * total), "rate_per_second": args.rate,
                                 "resend_ratio": 0.02, "source_duplicate_ratio": 0.01})
    print(f"load at {args.rate} ev/s; runs of {args.seconds:g} s on gunicorn ({args.web_workers} workers)")
    rows = []
    for number, (mode, viewers) in enumerate(runs):
        rows.append(one_run(args, ctx, base_url, web, mode, viewers, number))
    load = ops.call("get_load", ctx)["runs"][0]
    ops.call("cancel_load", ctx)
    print(f"\nload generator: {load['sent']} sent at {float(load['rate'] or 0):.0f} ev/s (state {load['state']})\n")
    print(f"{'mode':<6}{'viewers':>8}{'fresh p50 ms':>14}{'fresh p95 ms':>14}{'unseen':>8}{'web CPU s/min':>15}"
          f"{'requests':>10}{'events':>8}{'errors':>8}{'stale':>7}")
    held = True
    for row in rows:
        print(f"{row['mode']:<6}{row['viewers']:>8}{row['p50']:>14.0f}{row['p95']:>14.0f}{row['unseen']:>8.0%}"
              f"{row['cpu']:>15.1f}{row['requests']:>10}{row['events']:>8}{row['errors']:>8}{row['stale']:>7.0%}")
        held = held and (row["mode"] != "push" or (row["p95"] <= GOAL_P95_MS and row["errors"] == 0))
    print(f"\n{'✓' if held else '✕'} goal (push): freshness p95 <= {GOAL_P95_MS:g} ms, 0 errors")
    return 0 if held else 1


def one_run(args, ctx, base_url: str, web: psutil.Process, mode: str, count: int, run_number: int) -> dict:
    """``count`` viewers in ``mode`` for ``args.seconds``, the probe writing meanwhile."""
    committed: dict[int, float] = {}
    result = Run(committed)
    until = time.monotonic() + args.seconds
    kind = PushViewer if mode == "push" else Viewer
    viewers = [kind(base_url, until, result, offset=i * POLL_SECONDS / count) for i in range(count)]
    cpu_before, started = web_cpu_seconds(web), time.monotonic()
    for viewer in viewers:
        viewer.start()
    value = PROBE_BASE_MS + run_number * 100  # fresh values every run (one a second: runs up to 100 s)
    time.sleep(2)  # the viewers have their first state: the probe measures changes, not page loads
    while time.monotonic() < until - 2:
        value += 1
        with schema.begin_in(ctx.engine, ctx.lab.schema) as conn:
            labdata.put_setting(conn, "lock_timeout_ms", value)
        committed[value] = time.time()  # after the commit
        time.sleep(PROBE_SECONDS)
    for viewer in viewers:
        viewer.join(timeout=40)
    cpu = (web_cpu_seconds(web) - cpu_before) / ((time.monotonic() - started) / 60)
    expected = len(committed) * count
    all_ms = [m for data in result.endpoints.values() for m in data["ms"]]
    stale = sum(data["stale"] for data in result.endpoints.values())
    row = {"mode": mode, "viewers": count, "p50": percentile(result.freshness, 0.5),
           "p95": percentile(result.freshness, 0.95), "unseen": 1 - len(result.freshness) / max(expected, 1),
           "cpu": cpu, "requests": len(all_ms), "events": result.events, "errors": result.errors,
           "stale": stale / max(len(all_ms), 1)}
    print(f"{mode} x{count}: freshness p50 {row['p50']:.0f} ms p95 {row['p95']:.0f} ms, web CPU {cpu:.1f} s/min, "
          f"{row['errors']} error(s) {dict(result.kinds)}, {result.bytes / 1e6 / count:.1f} MB of events per viewer",
          flush=True)
    time.sleep(5)  # the streams of this run end (their viewers have left) before the next one
    return row


def _answers(base_url: str) -> bool:
    try:
        return requests.get(base_url + "/healthz", timeout=2).status_code == 200
    except requests.RequestException:
        return False


if __name__ == "__main__":
    sys.exit(main())
