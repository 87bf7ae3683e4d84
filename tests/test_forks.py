"""The consumer fork server (webapp/consumer/forkserver.py) and the agent's side of it
(webapp/agent/forks.py), on the session's PostgreSQL: real forks, real signals.

What the pool does with a forked consumer (kill, freeze, thaw, stop, reap, its output) is
exercised by every test that runs a consumer; these check the server's own promises."""
from __future__ import annotations

import os
import signal

import psutil
import pytest

from support import service_env
from webapp.agent.forks import ForkServer
from webapp.domain.waits import wait_until

MISSING = ["--lab", "nolab", "--consumer-id", "987654"]


@pytest.fixture
def forks(services, tmp_path):
    server = ForkServer(tmp_path / "fork-server.log", env=service_env(services))
    yield server
    server.stop()


def test_a_forked_consumer_runs_the_consumer_main_with_the_request_s_arguments_and_output(forks, services, tmp_path):
    log = tmp_path / "consumer.log"
    child = forks.spawn(MISSING, service_env(services), log, prefix=None)
    assert child.wait(timeout=30) == 2, "the consumer's main returns 2 for a consumer with no row"
    assert "no consumer 987654" in log.read_text()
    assert psutil.Process(forks.process.pid).is_running()


def test_a_forked_consumer_is_named_in_ps_is_the_server_s_child_and_is_signalled_through_its_pidfd(
        forks, services, tmp_path):
    log = tmp_path / "consumer.log"
    # PostgreSQL unreachable: the consumer waits for it (connect_when_up) long enough to look at it.
    env = {**service_env(services), "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"}
    child = forks.spawn(MISSING, env, log, prefix=None)
    try:
        process = psutil.Process(child.pid)
        assert process.ppid() == forks.process.pid
        title = "webapp.consumer --lab nolab --consumer-id 987654"
        wait_until(lambda: title in " ".join(process.cmdline()), timeout=10,
                   message=lambda: f"the consumer is not named in ps: {process.cmdline()}")
        assert process.pid == os.getsid(process.pid), "not in a session of its own"
        assert child.poll() is None
        child.send_signal(signal.SIGSTOP)
        assert wait_status(process, psutil.STATUS_STOPPED)
        child.send_signal(signal.SIGCONT)
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL
        child.kill()  # ended: signalling it again does nothing, as with Popen
    finally:
        child.kill()


def wait_status(process: psutil.Process, status: str) -> bool:
    return wait_until(lambda: process.status() == status, timeout=10,
                      message=lambda: f"process {process.pid} is {process.status()}, not {status}")


def test_a_dead_server_is_replaced_at_the_next_start_and_its_orphans_end_without_a_report(forks, services, tmp_path):
    env = {**service_env(services), "DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none?connect_timeout=1"}
    orphan = forks.spawn(MISSING, env, tmp_path / "orphan.log", prefix=None)
    first = forks.process
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    assert orphan.poll() is None, "its consumer still runs: nothing told it to stop"
    psutil.Process(orphan.pid).kill()
    assert orphan.wait(timeout=10) == 1, "ended with no server to report how: the unknown end"
    child = forks.spawn(MISSING, service_env(services), tmp_path / "after.log", prefix=None)
    assert forks.process is not first
    assert child.wait(timeout=30) == 2


def test_closing_the_requests_ends_the_server(forks, services, tmp_path):
    child = forks.spawn(MISSING, service_env(services), tmp_path / "c.log", prefix=None)
    child.wait(timeout=30)
    server = forks.process
    forks.stop(timeout=10)
    assert server.returncode == 0
