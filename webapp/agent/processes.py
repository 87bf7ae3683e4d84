"""The agent's process pool: the consumer processes it started, and nothing else.

Spawn a consumer (``python -m webapp.consumer``, forked by the consumer fork server: forks.py);
kill (SIGKILL: no commit, no group leave, even when frozen), freeze (SIGSTOP, a real process
pause), thaw (SIGCONT), stop (SIGTERM, graceful; SIGKILL after a deadline); reap the ones that
exited. Every signal goes to a consumer this agent started, through the handle its start
returned, never by a pid read from the database. The helper processes (the log reader, the
notification service, the outbox relays) are Sidecars, started by exec.

Output: a file per consumer under ``<data dir>/logs`` by default; with ``LAB_LOG_TO_STDOUT=1``
(docker compose sets it) every line goes to the agent's stdout, prefixed with the consumer's
lab and name, so ``docker compose logs`` shows them all.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

from ..domain.vocabulary import AGENT_PID, HOLD_ACK_FD, HOLD_DONE, HOLD_READY
from .forks import ForkedProcess, ForkServer

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


def stop_process(process: subprocess.Popen | ForkedProcess, stop_signal: int = signal.SIGTERM, timeout: float = 20) -> None:
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
    process: ForkedProcess
    label: str


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
        # The agent's command workers and its tick use the pool at once: the children's map is
        # read and changed under this lock (a signal and a wait happen outside it).
        self._lock = threading.Lock()
        self.env: dict[str, str] = {}  # what every consumer is told on top of the agent's environment
        # Consumers are forked by the fork server (forks.py); its own lines go to its log file.
        self.forks = ForkServer(None if log_to_stdout else self.log_dir / "consumer-fork-server.log")

    def log_hint(self, lab: str, consumer_id: int) -> str:
        """Where a person finds the consumer's output."""
        if self.log_to_stdout:
            return "see `docker compose logs consumers`: its lines start with [lab/name]"
        return f"see its log {self.log_dir / f'{lab}-consumer-{consumer_id}.log'}"

    def spawn(self, lab: str, consumer_id: int, name: str) -> ForkedProcess:
        env = {**os.environ, **self.env, "DATABASE_URL": self.database_url,
               "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers, "PYTHONUNBUFFERED": "1",
               AGENT_PID: str(os.getpid())}
        argv = ["--lab", lab, "--consumer-id", str(consumer_id)]
        label = f"{lab}/{name}"
        log = None if self.log_to_stdout else self.log_dir / f"{lab}-consumer-{consumer_id}.log"
        process = self.forks.spawn(argv, env, log, prefix=f"[{label}] ")
        with self._lock:
            self.children[consumer_id] = Child(process, label)
        return process

    def _child(self, consumer_id: int) -> Child | None:
        with self._lock:
            return self.children.get(consumer_id)

    def running(self, consumer_id: int) -> ForkedProcess:
        child = self._child(consumer_id)
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
        child = self._child(consumer_id)
        if child is None or child.process.poll() is not None:
            return
        child.process.send_signal(signal.SIGCONT)
        stop_process(child.process, timeout=timeout)

    def forget(self, consumer_id: int) -> None:
        with self._lock:
            self.children.pop(consumer_id, None)

    def reap(self) -> list[tuple[int, int]]:
        """(consumer id, exit code) of every child that exited and is not forgotten yet: the caller
        forgets each once its end is recorded, so an end it could not record (PostgreSQL down) is
        returned again by the next call."""
        ended = []
        with self._lock:
            children = list(self.children.items())
        for consumer_id, child in children:
            code = child.process.poll()
            if code is not None:
                ended.append((consumer_id, code))
        return ended

    def stop_all(self) -> None:
        with self._lock:
            consumer_ids = list(self.children)
        for consumer_id in consumer_ids:
            self.stop(consumer_id)
        self.forks.stop()


class Sidecar:
    """A helper process the agent keeps running and restarts when it exits: the log mirror
    (``python -m webapp.logreader``). Its own process, so that a crash of its Kafka client (librdkafka
    segfaults on Tansu when an assigned topic is deleted, as a lab reset does) never takes the agent
    down with it. It dies with the agent (PDEATHSIG)."""

    RESTART_AFTER = 1.0  # seconds between two starts

    HOLD_TIMEOUT = 10.0  # seconds a held sidecar has to acknowledge before it is stopped instead

    def __init__(self, name: str, module: str, env: dict[str, str], log_dir: Path, log_to_stdout: bool,
                 holdable: bool = False):
        """``holdable``: the sidecar speaks the hold protocol (:meth:`held`, domain/vocabulary.py)."""
        self.name, self.module, self.env = name, module, env
        self.log_dir, self.log_to_stdout = log_dir, log_to_stdout
        self.holdable = holdable
        self.process: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None
        self._acks: int | None = None  # read end of the running process's acknowledgement pipe
        self._ready = False  # it said its signal handlers are installed
        self.started_at = 0.0
        self.exits: list[int] = []
        # Two labs' resets may hold it at once (the agent's command workers): the first hold holds
        # it, the last one's end lets it go; the tick's ensure() leaves a held sidecar alone.
        self._hold_lock = threading.Lock()
        self._holders = 0
        self._release: Callable[[], None] | None = None

    def ensure(self, now: bool = False) -> None:
        """Start it if it is not running (at most once per RESTART_AFTER seconds, unless ``now``);
        never while it is held, nor while a hold is being taken (the tick does not wait for one)."""
        if not self._hold_lock.acquire(blocking=False):
            return
        try:
            if self._holders == 0:
                self._ensure(now)
        finally:
            self._hold_lock.release()

    def _ensure(self, now: bool) -> None:
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
        ack_write = None
        if self.holdable:
            self._close_acks()
            self._acks, ack_write = os.pipe()
            os.set_blocking(self._acks, False)
            self._ready = False
            env[HOLD_ACK_FD] = str(ack_write)
        pass_fds = (ack_write,) if ack_write is not None else ()
        try:
            if self.log_to_stdout:
                self.process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, cwd=ROOT, preexec_fn=die_with_parent,
                                                pass_fds=pass_fds)
                self.reader = threading.Thread(target=_copy_lines, name=f"log {self.name}", daemon=True,
                                               args=(self.process.stdout, f"[{self.name}] ".encode(),
                                                     sys.stdout.buffer))
                self.reader.start()
            else:
                self.log_dir.mkdir(parents=True, exist_ok=True)
                with open(self.log_dir / f"{self.name.replace(' ', '-')}.log", "ab") as log:
                    self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, cwd=ROOT, preexec_fn=die_with_parent,
                                                    pass_fds=pass_fds)
        finally:
            if ack_write is not None:
                os.close(ack_write)  # the child has its copy: its death reads as end of file here

    def _close_acks(self) -> None:
        if self._acks is not None:
            os.close(self._acks)
            self._acks = None

    def _drain(self) -> None:
        """Read what is waiting on the acknowledgement pipe (noting a ready byte)."""
        while True:
            try:
                data = os.read(self._acks, 64)
            except BlockingIOError:
                return
            if not data:
                return
            self._ready = self._ready or HOLD_READY in data

    def _await(self, signal_byte: bytes, deadline: float) -> bool:
        """Read the acknowledgement pipe until ``signal_byte`` comes (True), the process is gone
        (end of file) or ``deadline`` (a ``time.monotonic()``) passes (False). A ready byte read on
        the way is remembered."""
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self._acks], [], [], left)
            if not ready:
                continue
            try:
                data = os.read(self._acks, 64)
            except BlockingIOError:
                continue
            if not data:
                return False
            self._ready = self._ready or HOLD_READY in data
            if signal_byte in data:
                return True
        return False

    @contextlib.contextmanager
    def held(self, timeout: float | None = None) -> Iterator[None]:
        """The sidecar held off its work for the block: SIGUSR1 once it has said it is ready
        (HOLD_READY), acknowledged (HOLD_DONE) on its pipe; SIGUSR2 after. One that cannot be held
        (not running, not holdable, no answer within ``timeout`` s) is stopped for the block
        instead and started again after it. Blocks of several threads at once share one hold,
        ended by the last of them."""
        with self._hold_lock:
            if self._holders == 0:
                self._release = self._hold(timeout)
            self._holders += 1
        try:
            yield
        finally:
            with self._hold_lock:
                self._holders -= 1
                if self._holders == 0 and self._release is not None:
                    release, self._release = self._release, None
                    release()

    def _hold(self, timeout: float | None) -> Callable[[], None]:
        """Hold the sidecar off its work; the function that lets it go again."""
        timeout = self.HOLD_TIMEOUT if timeout is None else timeout
        process = self.process
        holding = False
        if process is not None and process.poll() is None and self._acks is not None:
            deadline = time.monotonic() + timeout
            # Until it says it is ready, SIGUSR1 would kill it (the default action).
            if self._ready or self._await(HOLD_READY, deadline):
                self._drain()  # an answer left over must not pass for this hold's
                process.send_signal(signal.SIGUSR1)
                holding = self._await(HOLD_DONE, deadline)
        if not holding:
            self.stop()

        def release() -> None:
            if holding and process.poll() is None:
                process.send_signal(signal.SIGUSR2)
            else:
                self._ensure(now=True)
        return release

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)  # a stopped process must run to hear SIGTERM
        stop_process(self.process, timeout=timeout)
        if self.reader is not None:
            self.reader.join(timeout=2)
