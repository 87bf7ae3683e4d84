"""``python -m webapp.consumer.forkserver``: starts consumer processes by fork, not by exec.

A consumer process spent most of its start importing psycopg, confluent-kafka and its own
modules (about 0.3 s of CPU), paid again at every start, restart and chaos kill. The lab agent
starts this server once; it imports those modules once and forks a consumer per request. The
child begins with everything loaded, and shares those pages with the server (copy on write)
instead of holding a copy of its own.

The server stays single-threaded and opens no connection: a fork copies only the calling
thread, so a lock held by another thread, or a client's socket, would be inherited broken. It
refuses to serve if the preload started a thread.

Each child is what ``python -m webapp.consumer`` was, named so in ``ps`` (setproctitle), in
a session of its own (setsid), stdin
from /dev/null, its output in its log file (or, for ``docker compose logs``, through the server,
each line prefixed with its name), the environment and arguments of the request. It is the
server's child: when the server goes (the agent closed its pipe, or died), the consumers see
their parent change and stop themselves, as they did when the agent was their parent.

Protocol, one JSON object per line. The agent writes on the server's stdin::

    {"argv": [...], "env": {...}, "cwd": "...", "log": "<file>" | null, "prefix": "[lab/name] " | null}

and reads on the server's stdout, in order: ``{"pid": N}`` (or ``{"error": "..."}``), the answer
to each request; ``{"exited": N, "code": C}`` whenever a child ends, C as ``subprocess`` gives it
(minus the signal's number when a signal ended it). End of file on stdin: the server exits.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import sys
import threading
import traceback

from setproctitle import setproctitle

from . import __main__ as consumer


def _child(request: dict, inherited: list[int], output: int) -> None:
    """In the forked child: become the consumer the request describes, then exit with its code."""
    code = 1
    try:
        os.setsid()
        # What ps, and the reaper (agent/queue.py), read to know which consumer this process is.
        # Before the environment changes: setproctitle moves the environment block to make room.
        setproctitle(" ".join([sys.executable, "-m", "webapp.consumer", *request["argv"]]))
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in inherited:
            os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(output)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        sys.argv = ["python -m webapp.consumer", *request["argv"]]
        code = consumer.main(request["argv"])
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 - whatever ends the consumer is written to its log
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


class Server:
    def __init__(self, requests: int, answers: int, lines_out: int):
        self.requests, self.answers, self.lines_out = requests, answers, lines_out
        self.selector = selectors.DefaultSelector()
        self.wake_read, self.wake_write = os.pipe()
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        self.pending = b""
        self.outputs: dict[int, tuple[bytes, bytearray]] = {}  # a child's output pipe -> (prefix, partial line)

    def answer(self, message: dict) -> None:
        data = (json.dumps(message) + "\n").encode()
        while data:
            data = data[os.write(self.answers, data):]

    def serve(self) -> int:
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the selector (wakeup fd)
        self.selector.register(self.requests, selectors.EVENT_READ, "requests")
        self.selector.register(self.wake_read, selectors.EVENT_READ, "children")
        while True:
            for key, _ in self.selector.select():
                if key.data == "requests":
                    chunk = os.read(self.requests, 65536)
                    if not chunk:
                        return 0  # the agent closed its end, or died
                    self.pending += chunk
                    while b"\n" in self.pending:
                        line, self.pending = self.pending.split(b"\n", 1)
                        self.spawn(json.loads(line))
                elif key.data == "children":
                    try:
                        os.read(self.wake_read, 4096)
                    except BlockingIOError:
                        pass
                    self.reap()
                else:
                    self.copy_output(key.fd)

    def spawn(self, request: dict) -> None:
        try:
            if request.get("log"):
                output, read_end = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), None
            else:
                read_end, output = os.pipe()
        except OSError as error:
            self.answer({"error": f"{error.strerror}: {error.filename or 'its output pipe'}"})
            return
        inherited = [self.requests, self.answers, self.lines_out, self.wake_read, self.wake_write,
                     self.selector.fileno(), *self.outputs]
        if read_end is not None:
            inherited.append(read_end)
        try:
            pid = os.fork()
        except OSError as error:  # out of processes or memory: this consumer fails, the server stays
            os.close(output)
            if read_end is not None:
                os.close(read_end)
            self.answer({"error": f"fork: {error.strerror}"})
            return
        if pid == 0:
            _child(request, inherited, output)
        os.close(output)
        if read_end is not None:
            self.outputs[read_end] = ((request.get("prefix") or "").encode(), bytearray())
            self.selector.register(read_end, selectors.EVENT_READ, "output")
        self.answer({"pid": pid})

    def reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.answer({"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def copy_output(self, fd: int) -> None:
        """A child's output, line by line, each line with its prefix, to the server's own output."""
        prefix, partial = self.outputs[fd]
        chunk = os.read(fd, 65536)
        if chunk:
            partial += chunk
        lines = partial.split(b"\n")
        if not chunk:  # the child is gone: what it wrote last, even without a newline
            lines = [line for line in lines if line] + [b""]
        partial[:] = lines.pop()
        for line in lines:
            data = prefix + line + b"\n"
            while data:
                data = data[os.write(self.lines_out, data):]
        if not chunk:
            self.selector.unregister(fd)
            os.close(fd)
            del self.outputs[fd]


def main() -> int:
    # The answers go on the real stdout; anything else printed here goes to stderr instead.
    answers = os.dup(1)
    os.dup2(2, 1)
    if threading.active_count() != 1:
        print(f"the consumer fork server refuses to serve: its imports started threads "
              f"({[t.name for t in threading.enumerate()]}); a fork would copy them broken", file=sys.stderr)
        return 2
    return Server(requests=0, answers=answers, lines_out=2).serve()


if __name__ == "__main__":
    sys.exit(main())
