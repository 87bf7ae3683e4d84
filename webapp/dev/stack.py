"""One bring-up of the lab's services, shared by the launcher, the tests and every bench.

    with Stack(base_dir, fault_proxy=True) as stack:
        stack.database_url, stack.bootstrap_servers, stack.producer_bootstrap_servers, stack.agent

In order: the embedded PostgreSQL (``base_dir/postgres``, log ``base_dir/postgres.log``), the
control schema upgraded to head, the embedded Tansu broker (log ``base_dir/tansu.log``; it
advertises the fault proxy when one is asked for, so every client talks through it after its
first metadata request), the fault proxy process (``python -m webapp.faultproxy``, log
``faultproxy.log``) and a lab agent process (``python -m webapp.agent``, log ``agent.log``).
Each is waited for with a deadline until it answers, and a failure says which and shows its
log. Every process is ours by its Popen: stopped in reverse order on the way out (PostgreSQL,
the broker and any process started with :meth:`Stack.spawn` included), each started with
``die_with_parent`` in a session of its own, so a killed parent leaves nothing behind and a
Ctrl-C in the terminal reaches the parent only, which stops them in order.

``database_url`` / ``bootstrap_servers`` use running services instead of the embedded ones (the
launcher, when the environment names them); ``postgres=False`` / ``broker=False`` start none.
"""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from ..agent.processes import die_with_parent, stop_process
from ..domain.waits import LOOPBACK, free_port, port_open, wait_until
from ..store.connection import CONTROL_SCHEMA, sqlalchemy_url
from .embedded import EmbeddedBroker, EmbeddedPostgres

ROOT = Path(__file__).resolve().parents[2]
# Settings a child must get from the stack, never from the environment it was started in.
SERVICE_SETTINGS = ("DATABASE_URL", "KAFKA_", "LAB_")
AGENT_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0  # SIGTERM, then SIGKILL after this long (PostgreSQL and the broker: their own)
FAULT_PROXY_TIMEOUT = 20.0
# gunicorn's master listens at once; its workers answer once each has imported the app, which on a
# loaded machine (six test workers each starting their own services) has taken over 30 s.
WEB_TIMEOUT = 120.0
WEB_APP = ["-m", "gunicorn", "-c", str(Path(__file__).resolve().parents[2] / "gunicorn.conf.py"), "app:app"]


def service_env(services, **extra: str) -> dict[str, str]:
    """This process's environment without DATABASE_URL, KAFKA_* or LAB_* settings, plus the
    addresses of ``services`` (anything with ``database_url``, ``bootstrap_servers`` and
    ``data_dir``; a missing one is left out) and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(SERVICE_SETTINGS)}
    addresses = {"DATABASE_URL": services.database_url, "KAFKA_BOOTSTRAP_SERVERS": services.bootstrap_servers,
                 "LAB_DATA_DIR": str(services.data_dir)}
    env.update({k: v for k, v in addresses.items() if v is not None})
    env.update(extra)
    return env


def start_logged(args: list[str], env: Mapping[str, str], log_path: Path | None) -> subprocess.Popen:
    """``python <args>`` from the project root, its output appended to ``log_path`` (None: this
    process's own output); it dies with us and has a session of its own."""
    log = open(log_path, "ab") if log_path is not None else None
    try:
        return subprocess.Popen([sys.executable, *args], env=dict(env), cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT if log is not None else None,
                                start_new_session=True, preexec_fn=die_with_parent)
    finally:
        if log is not None:
            log.close()


def _tail(log_path: Path | None) -> str:
    if log_path is None or not log_path.exists():
        return ""
    return f"; log {log_path}:\n{log_path.read_text(errors='replace')[-3000:]}"


def healthz_answers(url: str) -> bool:
    """True when ``url``/healthz answers 200: a web worker has booted and serves."""
    try:
        with urllib.request.urlopen(url + "/healthz", timeout=10) as answer:
            return answer.status == 200
    except OSError:  # refused, reset, timed out, or an HTTP error status
        return False


def wait_for_agent(database_url: str, process: subprocess.Popen, log: Path | None,
                   timeout: float = AGENT_TIMEOUT) -> None:
    """Wait until the agent process has reported itself (its pid) in lab_control.agents."""
    engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)

    def reported() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"the lab agent exited with {process.returncode}{_tail(log)}")
        with engine.connect() as conn:
            return bool(conn.execute(text(f"SELECT count(*) FROM {CONTROL_SCHEMA}.agents WHERE pid = :pid"),
                                     {"pid": process.pid}).scalar())
    try:
        wait_until(reported, timeout=timeout, message=lambda: f"the lab agent (pid {process.pid}) did not report "
                                                              f"itself{_tail(log)}")
    finally:
        engine.dispose()


def _reachable(address: str) -> tuple[str, int]:
    """A listen address as this machine reaches it (a wildcard host on loopback)."""
    host, _, port = address.rpartition(":")
    return (LOOPBACK if host.strip("[]") in ("", "0.0.0.0", "::") else host.strip("[]")), int(port)


class Stack:
    """PostgreSQL, the broker, the fault proxy and a lab agent, as asked; a context manager (or
    :meth:`start` / :meth:`stop`). What it started is stopped, in reverse order, by :meth:`stop`."""

    def __init__(self, base_dir: Path, *, postgres: bool = True, broker: bool = True, fault_proxy: bool = False,
                 agent: bool = True, database_url: str | None = None, bootstrap_servers: str | None = None,
                 env: Mapping[str, str] | None = None, clean_env: bool = True,
                 agent_timeout: float = AGENT_TIMEOUT, stop_timeout: float = STOP_TIMEOUT,
                 learner_listen: str | None = None, learner_bootstrap_servers: str | None = None):
        """``env``: settings every child gets (after the addresses); ``clean_env=False`` keeps this
        process's DATABASE_URL, KAFKA_* and LAB_* settings under them (the launcher: the lab's
        settings come from its environment). ``learner_listen``: where the fault proxy's learners'
        gateway listens (with a database; default a free loopback port), ``learner_bootstrap_servers``
        the address it is advertised at (default: ``learner_listen``)."""
        self.base_dir = self.data_dir = Path(base_dir)
        self.postgres = EmbeddedPostgres(self.base_dir / "postgres") if postgres and not database_url else None
        self.broker = EmbeddedBroker(self.base_dir / "tansu.log") if broker and not bootstrap_servers else None
        if fault_proxy and self.broker is None:
            raise ValueError("a fault proxy needs the embedded broker: it is the address the broker advertises")
        if agent and not (self.postgres or database_url) or agent and not (self.broker or bootstrap_servers):
            raise ValueError("a lab agent needs a database and a broker")
        self._database_url, self._bootstrap_servers = database_url, bootstrap_servers
        self.fault_proxy_port = free_port() if fault_proxy else None
        # The learners' gateway needs the lanes' credentials, kept in the database.
        gateway = fault_proxy and (self.postgres is not None or database_url is not None)
        self.learner_listen = (learner_listen or f"{LOOPBACK}:{free_port()}") if gateway else None
        self._learner_bootstrap_servers = learner_bootstrap_servers if gateway else None
        if self.learner_listen is not None and not learner_bootstrap_servers \
                and _reachable(self.learner_listen)[0] != self.learner_listen.rpartition(":")[0].strip("[]"):
            raise ValueError(f"the learners' gateway listens on {self.learner_listen}, every address: "
                             "say which one learners reach (learner_bootstrap_servers)")
        self.start_agent_on_start = agent
        self.extra_env = dict(env or {})
        self.clean_env = clean_env
        self.agent_timeout, self.stop_timeout = agent_timeout, stop_timeout
        self.children: list[tuple[str, subprocess.Popen]] = []  # every process spawned, in start order
        self.agent: subprocess.Popen | None = None
        self.fault_proxy: subprocess.Popen | None = None
        self._stops: list[Callable[[], None]] = []

    # --- addresses -------------------------------------------------------------------------------
    @property
    def database_url(self) -> str | None:
        return self.postgres.url if self.postgres is not None else self._database_url

    @property
    def bootstrap_servers(self) -> str | None:
        return self.broker.bootstrap_servers if self.broker is not None else self._bootstrap_servers

    @property
    def producer_bootstrap_servers(self) -> str | None:
        """The fault proxy's address when there is one: where the agent's producer bootstraps."""
        return f"{LOOPBACK}:{self.fault_proxy_port}" if self.fault_proxy_port is not None else None

    @property
    def learner_bootstrap_servers(self) -> str | None:
        """Where learners' own code reaches the broker: the fault proxy's learners' gateway."""
        return self._learner_bootstrap_servers or self.learner_listen

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a process of the stack: its addresses, ``env`` and ``extra``."""
        addresses = {"KAFKA_PRODUCER_BOOTSTRAP_SERVERS": self.producer_bootstrap_servers} \
            if self.fault_proxy_port is not None else {}
        if self.learner_listen is not None:
            addresses["KAFKA_LEARNER_BOOTSTRAP_SERVERS"] = self.learner_bootstrap_servers
        if self.clean_env:
            return service_env(self, **{**addresses, **self.extra_env, **extra})
        services = {"DATABASE_URL": self.database_url, "KAFKA_BOOTSTRAP_SERVERS": self.bootstrap_servers,
                    "LAB_DATA_DIR": str(self.data_dir), **addresses}
        return {**os.environ, **{k: v for k, v in services.items() if v is not None}, **self.extra_env, **extra}

    def engine(self) -> Engine:
        """An engine on the stack's database without a pool (the caller disposes of it)."""
        return create_engine(sqlalchemy_url(self.database_url), poolclass=NullPool)

    # --- bring-up ----------------------------------------------------------------------------------
    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "Stack":
        """Start what was asked, each waited for; on a failure stop what did start, then raise."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        try:
            if self.postgres is not None:
                self.postgres.start()
                self._stops.append(self.postgres.stop)
            if self.database_url is not None:
                from ..store.migrations import upgrade
                upgrade(self.database_url)  # the control schema at head, as `make run` leaves it
            if self.broker is not None:
                self.broker.start(advertised_port=self.fault_proxy_port)
                self._stops.append(self.broker.stop)
            if self.fault_proxy_port is not None:
                self.start_fault_proxy()
            if self.start_agent_on_start:
                self.start_agent()
        except BaseException:
            self.stop()
            raise
        return self

    def spawn(self, name: str, args: list[str], log: str | None = None, **env: str) -> subprocess.Popen:
        """``python <args>`` with the stack's environment (plus ``env``), its output in
        ``base_dir/<log>`` (None: our output); stopped with the stack, in reverse order."""
        log_path = self.base_dir / log if log else None
        process = start_logged(args, self.env(**env), log_path)
        self.children.append((name, process))
        self._stops.append(lambda: stop_process(process, timeout=self.stop_timeout))
        return process

    def start_web(self, host: str, port: int, log: str | None = None, **env: str) -> subprocess.Popen:
        """The web app under gunicorn on host:port, returned once /healthz answers 200; RuntimeError
        when gunicorn exits first (a setting it refused, the port taken: its output says)."""
        web = self.spawn("web", WEB_APP, log, **{**env, "LAB_HOST": host, "LAB_PORT": str(port)})
        log_path = self.base_dir / log if log else None
        url = f"http://{host}:{port}"

        def serving() -> bool:
            if web.poll() is not None:
                raise RuntimeError(f"the web app exited with {web.returncode}{_tail(log_path)}")
            return healthz_answers(url)
        wait_until(serving, timeout=WEB_TIMEOUT, interval=0.3,
                   message=lambda: f"the web app did not answer {url}/healthz{_tail(log_path)}")
        return web

    def start_fault_proxy(self) -> subprocess.Popen:
        """The fault proxy in front of the broker, listening on the address the broker advertises;
        with a database, waited for until it also reports itself there."""
        listen = self.producer_bootstrap_servers
        args = ["-m", "webapp.faultproxy", "--listen", listen, "--upstream", self.broker.bootstrap_servers]
        if self.database_url is None:
            args += ["--database-url", ""]  # no control row: disarmed, the data path only
        if self.learner_listen is not None:
            args += ["--learner-listen", self.learner_listen, "--learner-advertise", self.learner_bootstrap_servers]
        self.fault_proxy = process = self.spawn("fault proxy", args, "faultproxy.log")
        log_path = self.base_dir / "faultproxy.log"

        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"the fault proxy exited with {process.returncode}{_tail(log_path)}")
            learners = self.learner_listen is None or port_open(*_reachable(self.learner_listen))
            return port_open(LOOPBACK, self.fault_proxy_port) and learners and (
                self.database_url is None or self._proxy_reported())
        wait_until(listening, timeout=FAULT_PROXY_TIMEOUT,
                   message=lambda: f"the fault proxy did not listen on {listen}{_tail(log_path)}")
        return process

    def _proxy_reported(self) -> bool:
        from .. import ops
        from ..domain.lab import Lab

        engine = self.engine()
        try:
            return ops.call("get_fault_proxy", ops.Context(engine, Lab("x")))["running"]
        finally:
            engine.dispose()

    def start_agent(self, log: str | None = "agent.log", **env: str) -> subprocess.Popen:
        """A lab agent process (its producer through the fault proxy when there is one), waited for
        until it has reported itself in the database; its output in ``base_dir/<log>``."""
        self.agent = process = self.spawn("agent", ["-m", "webapp.agent"], log, **env)
        wait_for_agent(self.database_url, process, self.base_dir / log if log else None, timeout=self.agent_timeout)
        return process

    def stop(self) -> None:
        """Stop everything it started, the last first; each stop is tried even if one before failed."""
        errors = []
        while self._stops:
            try:
                self._stops.pop()()
            except Exception as error:  # noqa: BLE001 - stop the rest, then report it
                errors.append(error)
        if errors:
            raise errors[0]
