"""The parts a lab depends on are shown down within 5 s of going down, and back when back.

Real processes, real signals, by PID: the session's lab agent and its two sidecars (the log reader,
the notification service) are frozen with SIGSTOP and thawed with SIGCONT, so the session's
services outlive the test; a broker of the test's own, watched by an agent of its own, is SIGKILLed
and started again. PostgreSQL is stopped in the test that already restarts it on a stack of its
own (tests/test_recovery.py::test_a_postgresql_restart_under_a_running_lab), and a SIGKILLed agent
is shown down there too (test_a_sigkilled_agent_its_consumers_go_and_the_dashboard_says_so).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from support import CLASS_TOKEN, ROOT, service_env, wait_for_agent
from webapp.agent.processes import stop_process
from webapp.dev.embedded import EmbeddedBroker
from webapp.domain.waits import wait_until
from webapp.store.connection import sqlalchemy_url
from webapp.store.service_heartbeats import LOG_READER, NOTIFICATION_SERVICE

DOWN_WITHIN = 5.0  # a service is shown down within 5 s of going down
BACK_WITHIN = 5.0


def parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def beating_pid(services, service: str, agent_pid: int) -> int | None:
    """The pid of the session agent's ``service``, from its fresh heartbeat row."""
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            pids = conn.execute(text("SELECT pid FROM lab_control.service_heartbeats WHERE service = :s "
                                     "AND heartbeat_at > now() - interval '2 seconds'"), {"s": service}).scalars()
            return next((pid for pid in pids if os.path.exists(f"/proc/{pid}") and parent_of(pid) == agent_pid), None)
    finally:
        engine.dispose()


def part_of(lab, part: str) -> dict:
    return next(p for p in lab.state()["services"] if p["part"] == part)


def shown_down(lab, part: str) -> str | None:
    """The status bar's HTML once both the bar and the state API say ``part`` is down (the bar
    first: it is the cheap read a page polls)."""
    bar = lab.client.get("/panels/status")
    assert bar.status_code == 200, bar.status_code
    html = bar.get_data(as_text=True)
    if f'data-part="{part}"' not in html:
        return None
    return html if part_of(lab, part)["up"] is False else None


def frozen_then_thawed(lab, pid: int, part: str, also=None) -> tuple[str, float]:
    """SIGSTOP ``pid``, wait until ``part`` is shown down, SIGCONT, wait until it is shown up again;
    (the status bar's HTML while it was down, seconds from the freeze to the bar saying so). With
    ``also`` (another page's HTML), that page must say it down too before the thaw."""
    os.kill(pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    try:
        html = wait_until(lambda: shown_down(lab, part), timeout=DOWN_WITHIN, interval=0.25,
                          message=lambda: f"{part} (pid {pid}) frozen, not shown down: {part_of(lab, part)}")
        took = time.monotonic() - frozen_at
        if also is not None:
            other = also()
            assert f'data-part="{part}"' in other, other
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_until(lambda: part_of(lab, part)["up"] is True and f'data-part="{part}"' not in
               lab.client.get("/panels/status").get_data(as_text=True), timeout=BACK_WITHIN, interval=0.25,
               message=lambda: f"{part} thawed, still not shown up: {part_of(lab, part)}")
    return html, took


def test_each_part_frozen_or_killed_is_shown_down_within_5_s_then_back(services, agent, lab, app_factory, lab_name,
                                                                      tmp_path):
    lab.credit("acc-1", 500)
    mirrored = lab.wait(lambda s: [p for p in s["partitions"] if p["log_end"]], "the log reader never mirrored it")
    assert all(p["up"] for p in lab.state()["services"]), lab.state()["services"]
    assert "✓ PostgreSQL · agent · Kafka · log reader · notifications" in lab.client.get("/panels/status").get_data(
        as_text=True)

    reader = wait_until(lambda: beating_pid(services, LOG_READER, agent.pid), timeout=10,
                        message="no log reader of the session's agent beats")
    html, took = frozen_then_thawed(lab, reader, "log_reader")
    where = ", ".join(f"P{p['partition']} at offset {p['log_end'] - 1}" for p in mirrored)
    assert f"The log reader (pid {reader} on" in html and f"the verdict stop at what it mirrored ({where})" in html, html
    assert f"kill -CONT {reader}" in html
    print(f"log reader frozen: shown down after {took:.1f} s")

    notifier = wait_until(lambda: beating_pid(services, NOTIFICATION_SERVICE, agent.pid), timeout=10,
                          message="no notification service of the session's agent beats")
    # The classroom board's header says it too (a class of nobody: the board's own read).
    board = app_factory(LAB_NAME=lab_name, LAB_CLASS_CODE=f"health-{os.getpid()}",
                        LAB_TOKEN=CLASS_TOKEN).test_client()
    assert board.post("/sign-in", data={"token": CLASS_TOKEN, "next": "/class"}).status_code == 302
    html, took = frozen_then_thawed(lab, notifier, "notify", also=lambda: board.get("/class/cards").get_data(as_text=True))
    assert f"The notification service (pid {notifier} on" in html and "nothing waits on it yet" in html, html
    print(f"notification service frozen: shown down after {took:.1f} s")

    # The agent last: frozen for less than its consumers' and commands' freshness (5 s), so nothing
    # it serves is given up for dead meanwhile.
    html, took = frozen_then_thawed(lab, agent.pid, "agent")
    assert 'data-agent="down"' in html and "no control works" in html and f"kill -CONT {agent.pid}" in html, html
    # Thawed, it asks the broker again: a probe that timed out while it was frozen said "down", and
    # the next one (a few seconds on, under load) says "up" again.
    wait_until(lambda: part_of(lab, "broker")["up"] is True, timeout=BACK_WITHIN, interval=0.25,
               message=lambda: f"the thawed agent never reported the broker up again: {part_of(lab, 'broker')}")
    print(f"agent frozen: shown down after {took:.1f} s")

    # The broker: one of this test's own, watched by an agent of its own (an agent that cannot
    # reach Kafka is the one the status bar shows), SIGKILLed, then started again on its port.
    broker = EmbeddedBroker(tmp_path / "tansu.log").start()
    log = open(tmp_path / "agent.log", "ab")
    watcher = subprocess.Popen([sys.executable, "-m", "webapp.agent"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                               env=service_env(services, KAFKA_BOOTSTRAP_SERVERS=broker.bootstrap_servers))
    try:
        wait_for_agent(services.database_url, watcher, tmp_path / "agent.log")
        wait_until(lambda: lab.client.get("/healthz").status_code == 200, timeout=15,
                   message="healthz never became healthy")
        broker.process.kill()
        broker.process.wait(timeout=10)
        killed_at = time.monotonic()
        html = wait_until(lambda: shown_down(lab, "broker"), timeout=DOWN_WITHIN, interval=0.25,
                          message=lambda: f"the broker SIGKILLed, not shown down: {part_of(lab, 'broker')}")
        print(f"broker killed: shown down after {time.monotonic() - killed_at:.1f} s")
        assert 'data-agent="no-kafka"' in html and "Kafka is unreachable" in html and "What to do" in html, html
        health = lab.client.get("/healthz")
        assert health.status_code == 503 and health.get_json()["kafka"]["ok"] is False, health.get_json()
        broker.start()  # the same port: the agent's next look finds it
        wait_until(lambda: part_of(lab, "broker")["up"] is True, timeout=15, interval=0.25,
                   message=lambda: f"the broker restarted, still not shown up: {part_of(lab, 'broker')}")
    finally:
        stop_process(watcher)
        broker.stop()
        log.close()
