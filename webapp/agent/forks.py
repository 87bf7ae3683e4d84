"""The agent's side of the consumer fork server (webapp/consumer/forkserver.py).

:class:`ForkServer` starts the server on first use (and again if it died), sends it a request per
consumer, and reads its answers on a thread of its own: the pid of each consumer it forked, and
how each one ended. :class:`ForkedProcess` is what the pool holds for a consumer: the part of
``subprocess.Popen`` the pool uses (``pid``, ``poll``, ``wait``, ``send_signal``, ``kill``).

A consumer is the server's child, not the agent's: the agent signals it through a pidfd (never a
bare pid, which the system could give to another process once the consumer is reaped), and
learns its exit code from the server, which reaps it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
START_TIMEOUT = 30.0  # seconds for the server to answer a request (its first one waits for its imports)
UNKNOWN_END = 1  # the code of a consumer that ended while no server was there to tell how
RECHECK_SECONDS = 0.5  # a wait looks at the process itself this often when its server is gone


class ForkServerError(RuntimeError):
    """The fork server could not start a consumer."""


class ForkedProcess:
    """A consumer forked by the server."""

    def __init__(self, pid: int, server: "ForkServer"):
        self.pid = pid
        self.returncode: int | None = None
        self._server = server
        self._ended = threading.Condition()
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self._pidfd = None  # already ended and reaped: the server's report says how

    def _set_code(self, code: int) -> None:
        with self._ended:
            if self.returncode is None:
                self.returncode = code
                if self._pidfd is not None:
                    os.close(self._pidfd)
                    self._pidfd = None
            self._ended.notify_all()

    def _gone_without_report(self) -> bool:
        """With no server to report it: has the process ended? (Its pidfd is readable then.)"""
        if self._pidfd is None:
            return True
        readable, _, _ = select.select([self._pidfd], [], [], 0)
        return bool(readable)

    def poll(self) -> int | None:
        if self.returncode is None and not self._server.alive and self._gone_without_report():
            self._set_code(UNKNOWN_END)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit code, once the server reports it; with no server (it died), once the process
        is gone. Raises ``subprocess.TimeoutExpired`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._ended:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(f"consumer {self.pid}", timeout)
                # Woken by the server's report; the bound is for an end no report will announce.
                self._ended.wait(RECHECK_SECONDS if left is None else min(left, RECHECK_SECONDS))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with self._ended:
            if self.returncode is not None or self._pidfd is None:
                return  # ended: as Popen, signalling it does nothing
            try:
                signal.pidfd_send_signal(self._pidfd, sig)
            except ProcessLookupError:
                pass  # ended, not reported yet

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    def __init__(self, log: Path | None, env: dict[str, str] | None = None):
        """``log``: the file for the server's own lines; None: the agent's stdout, where the
        consumers' lines go too (each prefixed with its name)."""
        self.log = log
        self.env = env
        self.process: subprocess.Popen | None = None
        self.children: dict[int, ForkedProcess] = {}
        self._lock = threading.Lock()  # one request at a time
        self._answers: list[dict] = []
        self._answered = threading.Condition()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _start(self) -> None:
        if self.process is not None:  # the last one died: what is left of its pipe
            self._close_requests()
        env = {**(self.env or os.environ), "PYTHONUNBUFFERED": "1"}
        argv = [sys.executable, "-m", "webapp.consumer.forkserver"]
        if self.log is None:
            self.process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                            stderr=sys.stdout, cwd=ROOT)
        else:
            with open(self.log, "ab") as log:
                self.process = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                stderr=log, cwd=ROOT)
        reader = threading.Thread(target=self._read_answers, args=(self.process,), name="fork server answers",
                                  daemon=True)
        reader.start()

    def _read_answers(self, process: subprocess.Popen) -> None:
        for line in process.stdout:
            message = json.loads(line)
            if "exited" in message:
                child = self.children.pop(message["exited"], None)
                if child is not None:
                    child._set_code(message["code"])
                continue
            if "pid" in message:
                # Registered here, before any report of its end (the server answers first).
                message["child"] = self.children[message["pid"]] = ForkedProcess(message["pid"], self)
            with self._answered:
                self._answers.append(message)
                self._answered.notify_all()
        process.stdout.close()
        process.wait()
        with self._answered:
            self._answered.notify_all()
        for child in list(self.children.values()):
            child.poll()  # ended meanwhile, with no report: the server is gone

    def spawn(self, argv: list[str], env: dict[str, str], log: Path | None, prefix: str | None) -> ForkedProcess:
        """A consumer forked with these arguments (those of ``python -m webapp.consumer``),
        environment and output (its log file, or the server's output with ``prefix``)."""
        request = {"argv": argv, "env": env, "cwd": str(ROOT), "log": str(log) if log else None, "prefix": prefix}
        with self._lock:
            if not self.alive:
                self._start()
            try:
                self.process.stdin.write((json.dumps(request) + "\n").encode())
                self.process.stdin.flush()
            except BrokenPipeError:
                raise ForkServerError("the consumer fork server is gone (see the agent's log)") from None
            with self._answered:
                if not self._answered.wait_for(lambda: self._answers or not self.alive, START_TIMEOUT):
                    raise ForkServerError(f"the consumer fork server did not answer within {START_TIMEOUT:.0f} s")
                if not self._answers:
                    raise ForkServerError(f"the consumer fork server exited ({self.process.returncode}): "
                                          "see the agent's log")
                answer = self._answers.pop(0)
        if "error" in answer:
            raise ForkServerError(f"the consumer fork server could not start it: {answer['error']}")
        return answer["child"]

    def _close_requests(self) -> None:
        try:
            self.process.stdin.close()
        except BrokenPipeError:
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """Close the server's requests: it exits (its consumers, stopped before, are gone)."""
        if self.process is None:
            return
        self._close_requests()
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
