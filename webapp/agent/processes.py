"""The agent's process pool: the consumer processes it started, and nothing else.

Spawn ``python -m webapp.consumer``; kill (SIGKILL: no commit, no group leave, even when frozen),
freeze (SIGSTOP, a real process pause), thaw (SIGCONT), stop (SIGTERM, graceful; SIGKILL after a
deadline); reap the ones that exited. Every signal goes to a child of this process, by its
Popen, never by a pid read from the database.

Output: a file per consumer under ``<data dir>/logs`` by default; with ``LAB_LOG_TO_STDOUT=1``
(docker compose sets it) every line goes to the agent's stdout, prefixed with the consumer's
lab and name, so ``docker compose logs`` shows them all.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

ROOT = Path(__file__).resolve().parent.parent.parent
STOP_TIMEOUT = 15.0
_stdout_lock = threading.Lock()
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """For ``preexec_fn``: ask Linux to SIGTERM this child when its parent dies, even by SIGKILL,
    so a killed launcher or test run leaves no broker or database behind."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's own shutdown is all there is


def stop_process(process: subprocess.Popen, stop_signal: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Stop a child we started, by its PID: ``stop_signal``, up to ``timeout`` s, then SIGKILL; always reap."""
    if process.poll() is not None:
        return
    process.send_signal(stop_signal)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


class NotRunning(ValueError):
    """The consumer has no running process in this pool."""


def truthy(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Child:
    process: subprocess.Popen
    label: str
    reader: threading.Thread | None = field(default=None)


def _copy_lines(pipe: BinaryIO, prefix: bytes, out: BinaryIO) -> None:
    """Copy a child's output to ``out`` line by line, each line prefixed (a reader thread per child)."""
    with pipe:
        for line in iter(pipe.readline, b""):
            with _stdout_lock:
                out.write(prefix + (line if line.endswith(b"\n") else line + b"\n"))
                out.flush()


class Pool:
    def __init__(self, database_url: str, bootstrap_servers: str, data_dir: str | Path, log_to_stdout: bool = False):
        self.database_url = database_url
        self.bootstrap_servers = bootstrap_servers
        self.log_to_stdout = log_to_stdout
        self.log_dir = Path(data_dir) / "logs"
        if not log_to_stdout:
            self.log_dir.mkdir(parents=True, exist_ok=True)
        self.children: dict[int, Child] = {}  # consumer id -> its process
        self.env: dict[str, str] = {}  # what every consumer is told on top of the agent's environment

    def log_hint(self, lab: str, consumer_id: int) -> str:
        """Where a person finds the consumer's output."""
        if self.log_to_stdout:
            return "see `docker compose logs consumers`: its lines start with [lab/name]"
        return f"see its log {self.log_dir / f'{lab}-consumer-{consumer_id}.log'}"

    def spawn(self, lab: str, consumer_id: int, name: str) -> subprocess.Popen:
        env = {**os.environ, **self.env, "DATABASE_URL": self.database_url,
               "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
               "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "webapp.consumer", "--lab", lab, "--consumer-id", str(consumer_id)]
        label = f"{lab}/{name}"
        if self.log_to_stdout:
            process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, start_new_session=True, cwd=ROOT)
            reader = threading.Thread(target=_copy_lines, name=f"log {label}", daemon=True,
                                      args=(process.stdout, f"[{label}] ".encode(), sys.stdout.buffer))
            reader.start()
            self.children[consumer_id] = Child(process, label, reader)
            return process
        with open(self.log_dir / f"{lab}-consumer-{consumer_id}.log", "ab") as log:
            process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, cwd=ROOT)
        self.children[consumer_id] = Child(process, label)
        return process

    def running(self, consumer_id: int) -> subprocess.Popen:
        child = self.children.get(consumer_id)
        if child is None or child.process.poll() is not None:
            raise NotRunning(f"consumer {consumer_id} is not running")
        return child.process

    def pid(self, consumer_id: int) -> int:
        return self.running(consumer_id).pid

    def kill(self, consumer_id: int) -> None:
        process = self.running(consumer_id)
        process.kill()
        process.wait(timeout=10)

    def freeze(self, consumer_id: int) -> None:
        self.running(consumer_id).send_signal(signal.SIGSTOP)

    def thaw(self, consumer_id: int) -> None:
        self.running(consumer_id).send_signal(signal.SIGCONT)

    def stop(self, consumer_id: int, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (after SIGCONT: a frozen process must run to hear it); SIGKILL after ``timeout``."""
        child = self.children.get(consumer_id)
        if child is None or child.process.poll() is not None:
            return
        child.process.send_signal(signal.SIGCONT)
        stop_process(child.process, timeout=timeout)

    def forget(self, consumer_id: int) -> None:
        self.children.pop(consumer_id, None)

    def reap(self) -> list[tuple[int, int]]:
        """(consumer id, exit code) of every child that exited and is not forgotten yet: the caller
        forgets each once its end is recorded, so an end it could not record (PostgreSQL down) is
        returned again by the next call."""
        ended = []
        for consumer_id, child in list(self.children.items()):
            code = child.process.poll()
            if code is None:
                continue
            if child.reader is not None:
                child.reader.join(timeout=2)  # the last lines it wrote before dying
            ended.append((consumer_id, code))
        return ended

    def stop_all(self) -> None:
        for consumer_id in list(self.children):
            self.stop(consumer_id)


class Sidecar:
    """A helper process the agent keeps running and restarts when it exits: the log mirror
    (``python -m webapp.logreader``). Its own process, so that a crash of its Kafka client (librdkafka
    segfaults on Tansu when an assigned topic is deleted, as a lab reset does) never takes the agent
    down with it. It dies with the agent (PDEATHSIG)."""

    RESTART_AFTER = 1.0  # seconds between two starts

    def __init__(self, name: str, module: str, env: dict[str, str], log_dir: Path, log_to_stdout: bool):
        self.name, self.module, self.env = name, module, env
        self.log_dir, self.log_to_stdout = log_dir, log_to_stdout
        self.process: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self.started_at = 0.0
        self.exits: list[int] = []

    def ensure(self, now: bool = False) -> None:
        """Start it if it is not running (at most once per RESTART_AFTER seconds, unless ``now``)."""
        if self.process is not None:
            code = self.process.poll()
            if code is None:
                return
            self.exits.append(code)
            self.process = None
        if not now and time.monotonic() - self.started_at < self.RESTART_AFTER:
            return
        self.started_at = time.monotonic()
        argv = [sys.executable, "-m", self.module]
        env = {**self.env, "PYTHONUNBUFFERED": "1"}
        if self.log_to_stdout:
            self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, cwd=ROOT, preexec_fn=die_with_parent)
            self.reader = threading.Thread(target=_copy_lines, name=f"log {self.name}", daemon=True,
                                           args=(self.process.stdout, f"[{self.name}] ".encode(), sys.stdout.buffer))
            self.reader.start()
        else:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            with open(self.log_dir / f"{self.name.replace(' ', '-')}.log", "ab") as log:
                self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=ROOT, preexec_fn=die_with_parent)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        stop_process(self.process, timeout=timeout)
        if self.reader is not None:
            self.reader.join(timeout=2)
