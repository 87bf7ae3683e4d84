"""`make run`: one command starts everything; SIGTERM leaves no process behind."""
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import psutil

from support import ROOT
from webapp.domain.waits import free_port, wait_until


def lab_env(**settings: str) -> dict[str, str]:
    """This environment without lab or service settings (no running lab leaks in), plus ``settings``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "KAFKA_", "LAB_", "MAKE"))}
    env.update(settings)
    return env


def wait_healthy(process: subprocess.Popen, port: int, log: Path) -> None:
    """Wait until the launcher says the dashboard is ready, then check /healthz answers 200; fail with
    the log if the process exits first.

    The launcher's own start waits for each service with its own timeout and exits saying which did
    not come up; its readiness line is the condition. On a loaded machine (six test workers each
    starting PostgreSQL and a broker) a start takes 40 s or more, so the guard here is generous.
    """
    def ready():
        assert process.poll() is None, log.read_text()
        return "Dashboard: http://" in log.read_text()
    wait_until(ready, timeout=240, interval=0.3, message=lambda: f"the lab did not say it is ready: {log.read_text()}")

    def healthy():
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
                return response.status == 200
        except OSError:
            return False
    wait_until(healthy, timeout=10, interval=0.3,
               message=lambda: f"the lab said it is ready but /healthz does not answer 200: {log.read_text()}")


def test_make_run_serves_the_dashboard_and_sigterm_stops_everything(tmp_path):
    port = free_port()
    env = lab_env(LAB_PORT=str(port), LAB_DATA_DIR=str(tmp_path / "lab"))
    output = open(tmp_path / "run.log", "wb")
    make = subprocess.Popen(["make", "--no-print-directory", "run"], cwd=ROOT, env=env, stdout=output,
                            stderr=subprocess.STDOUT, start_new_session=True)
    tree: list[psutil.Process] = []
    try:
        wait_healthy(make, port, tmp_path / "run.log")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as response:
            assert b"Idempotency" in response.read()
        tree = psutil.Process(make.pid).children(recursive=True)
        names = " ".join(" ".join(p.cmdline()) for p in tree)
        assert "postgres -D" in names and "tansu" in names and "webapp.agent" in names and "gunicorn" in names

        make.send_signal(signal.SIGTERM)
        make.wait(timeout=30)
        wait_until(lambda: not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE],
                   timeout=45, interval=0.3,
                   message=lambda: "still running after SIGTERM: "
                   + ", ".join(f"{p.pid} {p.name()}" for p in tree if p.is_running()))
        log = (tmp_path / "run.log").read_text()
        assert "Dashboard: http://127.0.0.1:" in log and "Idempotency Lab stopped" in log
    finally:
        output.close()
        for process in [*tree, psutil.Process(make.pid) if make.poll() is None else None]:
            if process is not None and process.is_running():
                process.kill()


def test_with_both_variables_set_nothing_embedded_starts(services, tmp_path, lab_name):
    port = free_port()
    env = lab_env(LAB_PORT=str(port), LAB_DATA_DIR=str(tmp_path / "lab"), LAB_NAME=lab_name,
                  DATABASE_URL=services.database_url, KAFKA_BOOTSTRAP_SERVERS=services.bootstrap_servers)
    output = open(tmp_path / "run.log", "wb")
    launcher = subprocess.Popen([str(ROOT / ".venv/bin/python"), "-m", "webapp.dev.launcher"], cwd=ROOT, env=env,
                                stdout=output, stderr=subprocess.STDOUT)
    try:
        wait_healthy(launcher, port, tmp_path / "run.log")
        commands = [" ".join(p.cmdline()) for p in psutil.Process(launcher.pid).children(recursive=True)]
        assert not [c for c in commands if "postgres -D" in c or "tansu" in c], commands
        log = (tmp_path / "run.log").read_text()
        assert "from DATABASE_URL" in log and "from KAFKA_BOOTSTRAP_SERVERS" in log
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=40)
        output.close()


def run_launcher(tmp_path, **settings: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "webapp.dev.launcher"], cwd=ROOT, capture_output=True, text=True,
                          env=lab_env(LAB_DATA_DIR=str(tmp_path / "lab"), **settings), timeout=60)


def test_a_taken_port_is_named_in_one_line_and_nothing_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_launcher(tmp_path, LAB_PORT=str(port))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"port {port} on 127.0.0.1 is taken" in lines[0] and "LAB_PORT=" in lines[0]
    assert not (tmp_path / "lab" / "postgres").exists(), "it started PostgreSQL before refusing"


def test_a_data_directory_in_use_is_named_in_one_line(tmp_path):
    with socket.socket() as database:
        database.bind(("127.0.0.1", 0))
        database.listen()
        db_port = database.getsockname()[1]
        (tmp_path / "lab").mkdir()
        (tmp_path / "lab" / "running.json").write_text(json.dumps(
            {"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{db_port}/postgres"}))
        result = run_launcher(tmp_path, LAB_PORT=str(free_port()))
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "\n" not in line and f"another lab is running from {tmp_path / 'lab'}" in line and "LAB_DATA_DIR=" in line
    assert (tmp_path / "lab" / "running.json").exists(), "it removed the other lab's running file"
