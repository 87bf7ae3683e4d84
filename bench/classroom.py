"""A class on one server: N simulated attendees each run a guided exercise in their own lab at once.

Starts a private stack the way `make run` does (embedded PostgreSQL and Tansu, one lab agent,
the web app under gunicorn with its own config) in classroom mode, then N attendees, each a
browser session of its own over HTTP: join with a name and the class code, start the exercise
(guided mode, in the attendee's own lab; by default exercise 16, two consumers at once, each
crashed and restarted), press "next step" until the run ends, as a person clicking would.
Meanwhile the instructor's board (/class) and GET /healthz (the machine's floor: a request that
reads nothing) are each asked once a second, and a board page's stream (/class/stream) is held
open as the instructor's browser holds it.

Prints how many runs passed, the wall time, the peak memory (RSS) and CPU time of the agent
(with its consumers and log reader), the web app (gunicorn master and workers) and PostgreSQL;
the board's response times against /healthz's in the same run (goal: p95 within 3× of it); and
the memory of each consumer process as its proportional set size (PSS: each shared page split
between the processes that map it; the consumers are forked from one server that loaded their
modules, webapp/consumer/forkserver.py), goal at most 40 MB each.

    .venv/bin/python bench/classroom.py [--attendees 30] [--web-workers 2] [--exercise NAME]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import requests

from webapp.dev.stack import Stack
from webapp.domain.waits import free_port

EXERCISE = "16_last_batch_redelivered"
PSS_GOAL_MB = 40
BOARD_GOAL_RATIO = 3.0
CLASS_CODE = "bench-class"
TOKEN = "bench-instructor"
FINISHED = ("passed", "failed", "not-run", "error")
CSRF = re.compile(r'name="csrf-token" content="([^"]+)"')


class Attendee(threading.Thread):
    """One browser session: join, wait for the whole class to have joined, start exercise 1, click
    "next step" until it ends."""

    def __init__(self, url: str, name: str, deadline: float, everyone_joined: threading.Barrier, exercise: str):
        super().__init__(name=name, daemon=True)
        self.url, self.deadline, self.everyone_joined, self.exercise_name = url, deadline, everyone_joined, exercise
        self.http = requests.Session()
        self.status, self.error, self.seconds, self.join_seconds = "not started", None, 0.0, None

    def csrf(self, path: str) -> str:
        return CSRF.search(self.http.get(self.url + path, timeout=30).text).group(1)

    def run(self) -> None:
        try:
            self.join_class()
        finally:
            self.everyone_joined.wait()
        if self.error:
            return
        # The wait for the whole class outlasts the server's keep-alive (gunicorn closes an idle
        # connection after 2 s): a reused pooled connection would be reset under the first POST, which
        # requests does not retry (a browser opens a new connection). Start on fresh connections.
        self.http.close()
        started = time.monotonic()
        try:
            self.exercise()
        except Exception as error:  # noqa: BLE001 - a failed attendee is a result of the bench
            self.error = f"{type(error).__name__}: {error}"
        self.seconds = time.monotonic() - started

    def join_class(self) -> None:
        started = time.monotonic()
        try:
            token = self.csrf("/join")
            joined = self.http.post(self.url + "/join", data={"name": self.name, "code": CLASS_CODE,
                                                              "csrf_token": token}, timeout=120)
            # A new attendee's answer is the page showing their rejoin code, once (the session is bound).
            if joined.status_code != 200 or "data-rejoin-code" not in joined.text:
                why = re.search(r"data-join-error>([^<]+)<", joined.text)
                raise RuntimeError(f"join answered {joined.status_code}: {why.group(1).strip() if why else ''}")
            self.join_seconds = time.monotonic() - started
        except Exception as error:  # noqa: BLE001 - a failed attendee is a result of the bench
            self.error = f"join: {type(error).__name__}: {error}"

    def exercise(self) -> None:
        """Start the exercise in guided mode and press "next step" until the run ends."""
        token = self.csrf("/scenarios/")
        run = self.http.post(f"{self.url}/scenarios/{self.exercise_name}/runs", data={"csrf_token": token},
                             timeout=60)
        run_id = int(run.url.rstrip("/").split("/")[-1])
        while time.monotonic() < self.deadline:
            guide = self.http.get(f"{self.url}/scenarios/runs/{run_id}/guide", timeout=30).text
            self.status = re.search(r'data-run-status="([a-z-]+)"', guide).group(1)
            if self.status in FINISHED:
                reason = re.search(r"data-run-reason>([^<]*)<", guide)
                self.error = reason.group(1).strip()[:300] if reason and self.status != "passed" else None
                break
            if 'data-busy="true"' in guide:
                time.sleep(0.3)  # a person watching the step run; the agent carries it out
                continue
            self.http.post(f"{self.url}/scenarios/runs/{run_id}/next", headers={"X-CSRFToken": token}, timeout=60)


class Asker(threading.Thread):
    """One path asked once a second while the class works: its response times and failures."""

    def __init__(self, url: str, path: str, stop: threading.Event):
        super().__init__(name=path, daemon=True)
        self.url, self.path, self.stop = url, path, stop
        self.times: list[float] = []
        self.failures: list[float] = []
        self.http = requests.Session()

    def sign_in(self) -> None:
        pass

    def run(self) -> None:
        self.sign_in()
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                ok = self.http.get(self.url + self.path, timeout=60).status_code == 200
            except requests.RequestException:
                ok = False
            (self.times if ok else self.failures).append(time.monotonic() - started)
            self.stop.wait(1.0)

    def p95(self) -> float:
        times = sorted(self.times)
        return times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]

    def line(self) -> str:
        times = sorted(self.times)
        return (f"{self.path}: {len(times)} requests, p50 {1000 * statistics.median(times):.0f} ms, "
                f"p95 {1000 * self.p95():.0f} ms, max {1000 * times[-1]:.0f} ms; {len(self.failures)} failed")


class Board(Asker):
    """The instructor's board (signed in with the token)."""

    def __init__(self, url: str, stop: threading.Event):
        super().__init__(url, "/class", stop)

    def sign_in(self) -> None:
        sign_in(self.http, self.url)


def sign_in(http: requests.Session, url: str) -> None:
    """Sign ``http`` in as the instructor (the token)."""
    token = CSRF.search(http.get(url + "/sign-in", timeout=60).text).group(1)
    http.post(url + "/sign-in", data={"token": TOKEN, "next": "/healthz", "csrf_token": token}, timeout=60)


class BoardStream(threading.Thread):
    """The instructor's board as a browser keeps it open: one ``GET /class/stream`` (reconnecting
    when the server ends it), its ``board`` events counted, the gaps between them, and how far
    behind its lab a pushed card said it was (``data-behind``)."""

    def __init__(self, url: str, stop: threading.Event):
        super().__init__(name="board-stream", daemon=True)
        self.url, self.stop = url, stop
        self.http = requests.Session()
        self.arrivals: list[float] = []
        self.behind: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        sign_in(self.http, self.url)
        while not self.stop.is_set():
            try:
                with self.http.get(self.url + "/class/stream", stream=True, timeout=(10, 30)) as response:
                    event = None
                    for line in response.iter_lines(decode_unicode=True):
                        if self.stop.is_set():
                            return
                        if line.startswith("event: "):
                            event = line[7:]
                            if event == "board":
                                self.arrivals.append(time.monotonic())
                            elif event == "refused":
                                self.errors.append("refused")
                        elif line.startswith("data: ") and event == "board":
                            self.behind += [float(v) for v in re.findall(r'data-behind="([0-9.]+)"', line)]
            except requests.RequestException as error:
                self.errors.append(type(error).__name__)
                self.stop.wait(1.0)

    def line(self) -> str:
        gaps = sorted(b - a for a, b in zip(self.arrivals, self.arrivals[1:]))
        if not gaps:
            return f"/class/stream: {len(self.arrivals)} board events; {len(self.errors)} errors"
        p95 = gaps[min(len(gaps) - 1, int(round(0.95 * (len(gaps) - 1))))]
        behind = f"cards shown behind their lab: {len(self.behind)}, longest {max(self.behind):.1f} s" if self.behind \
            else "no card shown behind its lab"
        return (f"/class/stream: {len(self.arrivals)} board events, gap between two p50 "
                f"{statistics.median(gaps):.1f} s, p95 {p95:.1f} s; {behind}; {len(self.errors)} errors")


class Meter(threading.Thread):
    """CPU seconds and peak RSS of process trees (a root and its descendants), sampled every 0.5 s."""

    def __init__(self, roots: dict[str, int], stop: threading.Event):
        super().__init__(name="meter", daemon=True)
        self.roots, self.stop = roots, stop
        self.peak_rss = {name: 0 for name in roots}
        self.cpu: dict[str, dict[int, float]] = {name: {} for name in roots}
        self.consumer_pss: dict[int, tuple[str, int]] = {}  # consumer pid -> (its lab, its peak PSS)
        self.forkserver_pss = 0

    def tree(self, pid: int) -> list[psutil.Process]:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def sample(self) -> None:
        for name, pid in self.roots.items():
            rss = 0
            for process in self.tree(pid):
                try:
                    rss += process.memory_info().rss
                    times = process.cpu_times()
                    self.cpu[name][process.pid] = times.user + times.system
                    if name == "agent":
                        self.sample_pss(process)
                except psutil.NoSuchProcess:
                    continue
            self.peak_rss[name] = max(self.peak_rss[name], rss)

    def sample_pss(self, process: psutil.Process) -> None:
        """A consumer's (or the fork server's) proportional set size, its peak kept."""
        argv = " ".join(process.cmdline())
        if "webapp.consumer.forkserver" in argv:
            self.forkserver_pss = max(self.forkserver_pss, process.memory_full_info().pss)
        elif "webapp.consumer --lab" in argv:
            lab = argv.split("--lab", 1)[1].split()[0]
            pss = process.memory_full_info().pss
            self.consumer_pss[process.pid] = (lab, max(pss, self.consumer_pss.get(process.pid, (lab, 0))[1]))

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            self.stop.wait(0.5)

    def cpu_seconds(self, name: str, baseline: dict[int, float]) -> float:
        return sum(total - baseline.get(pid, 0.0) for pid, total in self.cpu[name].items())


def postgres_pid(data_dir: Path) -> int:
    return int((data_dir / "postmaster.pid").read_text().split()[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attendees", type=int, default=30)
    parser.add_argument("--exercise", default=EXERCISE, help=f"the guided exercise each attendee runs ({EXERCISE})")
    parser.add_argument("--web-workers", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds the whole class may take")
    options = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="bench-classroom-"))
    port = free_port()
    # PostgreSQL, the broker and an agent (webapp/dev/stack.py), then the web app under gunicorn;
    # their logs in the base directory (agent.log, web.log), which is kept.
    with Stack(base, env={"LAB_CLASS_CODE": CLASS_CODE, "LAB_TOKEN": TOKEN, "LAB_PORT": str(port),
                          "LAB_MAX_LABS": str(options.attendees + 10), "WEB_WORKERS": str(options.web_workers),
                          "LAB_BROKER_KIND": "tansu"}) as stack:
        web = stack.start_web("127.0.0.1", port, "web.log")
        return run_class(options, base, port, stack.agent, web)


def run_class(options: argparse.Namespace, base: Path, port: int, agent, web) -> int:
    """The attendees against the web app at ``port``; 0 when every run passed."""
    url = f"http://127.0.0.1:{port}"

    stop = threading.Event()
    meter = Meter({"agent": agent.pid, "web": web.pid, "postgres": postgres_pid(base / "postgres")}, stop)
    meter.sample()
    baseline = {name: dict(values) for name, values in meter.cpu.items()}
    board = Board(url, stop)
    board_stream = BoardStream(url, stop)
    floor = Asker(url, "/healthz", stop)
    deadline = time.monotonic() + options.timeout
    started = 0.0

    def class_starts() -> None:  # the barrier's action: everyone has joined, the exercise starts now
        nonlocal started
        started = time.monotonic()
        meter.sample()
        baseline.update({name: dict(values) for name, values in meter.cpu.items()})
        board.start()
        board_stream.start()
        floor.start()

    everyone_joined = threading.Barrier(options.attendees, action=class_starts)
    attendees = [Attendee(url, f"Attendee {n:02d}", deadline, everyone_joined, options.exercise)
                 for n in range(1, options.attendees + 1)]
    joining = time.monotonic()
    meter.start()
    for attendee in attendees:
        attendee.start()
    for attendee in attendees:
        attendee.join(timeout=max(1.0, deadline - time.monotonic()))
    wall = time.monotonic() - started
    join_wall = started - joining
    stop.set()
    meter.join(timeout=5)
    board.join(timeout=60)
    board_stream.join(timeout=60)
    floor.join(timeout=60)
    meter.sample()

    passed = [a for a in attendees if a.status == "passed"]
    print(f"attendees: {len(attendees)} each running {options.exercise} in their own lab, one agent, "
          f"gunicorn {options.web_workers} worker(s); {os.cpu_count()} CPU(s)")
    print(f"passed: {len(passed)}/{len(attendees)}")
    for attendee in attendees:
        if attendee.status != "passed":
            print(f"  {attendee.name}: {attendee.status} {attendee.error or ''}")
    joins = sorted(a.join_seconds for a in attendees if a.join_seconds is not None)
    if joins:
        print(f"join (all at once): {len(joins)} labs created in {join_wall:.1f} s; one join: median "
              f"{statistics.median(joins):.1f} s, longest {joins[-1]:.1f} s")
    durations = sorted(a.seconds for a in attendees)
    print(f"exercise wall time: {wall:.1f} s (one attendee: median {statistics.median(durations):.1f} s, "
          f"longest {durations[-1]:.1f} s)")
    for name in ("agent", "web", "postgres"):
        cpu = meter.cpu_seconds(name, baseline[name])
        print(f"{name:<9} peak RSS {meter.peak_rss[name] / 2**20:7.0f} MB   CPU {cpu:7.1f} s "
              f"({100 * cpu / wall:.0f}% of one core on average)")
    if meter.consumer_pss:
        peaks = sorted(pss for _, pss in meter.consumer_pss.values())
        per_lab: dict[str, int] = {}
        for lab, pss in meter.consumer_pss.values():
            per_lab[lab] = per_lab.get(lab, 0) + pss
        labs = sorted(per_lab.values())
        mb = 2 ** 20
        print(f"consumer processes: {len(peaks)}, peak PSS each: median {statistics.median(peaks) / mb:.1f} MB, "
              f"max {peaks[-1] / mb:.1f} MB (goal ≤ {PSS_GOAL_MB} MB); their fork server "
              f"{meter.forkserver_pss / mb:.1f} MB; per attendee lab (its consumers over the run, summed): "
              f"median {statistics.median(labs) / mb:.1f} MB")
    ratio = None
    if board.times and floor.times:
        ratio = board.p95() / floor.p95()
        print(f"board {board.line()}")
        print(f"floor {floor.line()}")
        print(f"board p95 / floor p95: {ratio:.1f}× (goal ≤ {BOARD_GOAL_RATIO:.0f}×)")
    print(f"board {board_stream.line()}")
    return 0 if len(passed) == len(attendees) else 1


if __name__ == "__main__":
    sys.exit(main())
