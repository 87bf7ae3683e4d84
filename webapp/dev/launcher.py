"""``make run``: the whole lab with one command.

Starts what is not configured (embedded PostgreSQL when DATABASE_URL is unset, the embedded
Tansu broker when KAFKA_BOOTSTRAP_SERVERS is unset, with the lost-ack fault proxy in front of
it), prepares the lab, then runs the lab agent and the web app (gunicorn) as child processes:
the services, the proxy and the agent through the bring-up the tests and benches share
(stack.py), gunicorn as one more process of that stack. Ctrl-C or SIGTERM stops them all, in
order: web, agent (which stops its consumers), fault proxy, broker, database.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from sqlalchemy.engine import make_url

from ..domain.lab import Lab
from ..domain.waits import free_port, port_open
from ..settings import RUNNING_FILE, ConfigError, database_url, load_config, running_services
from .embedded import LOOPBACK
from .stack import Stack


def say(what: str, where: str) -> None:
    print(f"  {what:<28} {where}", flush=True)


class Occupied(RuntimeError):
    """Another lab (or program) holds what this one needs; the message says which and what to do."""


def check_free(config, data_dir: Path) -> None:
    """Refuse to start half a lab: the web port and the data directory must be free."""
    host, port = config["LAB_HOST"], config["LAB_PORT"]
    if port_open(host, port):
        raise Occupied(f"port {port} on {host} is taken (another lab, or a program such as an AirPlay receiver): "
                       f"stop it, or run on another port: LAB_PORT={port + 1} make run")
    database = running_services(data_dir).get("DATABASE_URL")
    if database:
        address = make_url(database)
        if port_open(address.host or LOOPBACK, address.port or 5432):
            raise Occupied(f"another lab is running from {data_dir} (its PostgreSQL answers on "
                           f"{address.host}:{address.port}): stop it (Ctrl-C in its terminal), "
                           "or give this one its own directory: LAB_DATA_DIR=/some/other/dir make run")
    postmaster = data_dir / "postgres" / "postmaster.pid"
    if postmaster.exists():
        pid = int((postmaster.read_text().split() or ["0"])[0])
        if pid and Path(f"/proc/{pid}").exists():
            raise Occupied(f"a PostgreSQL (pid {pid}) is still running on {data_dir / 'postgres'}: stop it, "
                           "or give this lab its own directory: LAB_DATA_DIR=/some/other/dir make run")


class Launcher:
    def __init__(self):
        self.config = load_config()
        self.data_dir = Path(self.config["LAB_DATA_DIR"])
        self.stack: Stack | None = None
        self.stopping = False
        self.parent_pid = os.getppid()

    def start_services(self) -> Stack:
        """PostgreSQL and the broker unless the environment names them; with the embedded broker,
        the fault proxy in front of it, which the broker advertises: after the first metadata
        request every client, the producer's retries included, talks to it through the proxy
        (docs/concepts/lost-ack.md). The database upgraded to head (a data directory of an earlier release
        upgrades in place, Alembic). The lab's settings reach every child from our environment."""
        database = database_url() or None  # with DATABASE_PASSWORD_FILE's password, when set
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS") or None
        self.stack = Stack(self.data_dir, database_url=database, bootstrap_servers=bootstrap,
                           fault_proxy=not bootstrap, agent=False, clean_env=False,
                           learner_listen=self.config.get("KAFKA_LEARNER_LISTEN"),
                           learner_bootstrap_servers=self.configured_learner_address(),
                           env={"LAB_HOST": str(self.config["LAB_HOST"]), "LAB_PORT": str(self.config["LAB_PORT"])})
        self.stack.start()
        if self.stack.postgres is not None:
            postgres = self.stack.postgres
            say("PostgreSQL (embedded)", f"{postgres.public_url}  data {postgres.data_dir}; passwords in "
                f"{postgres.owner_password_file.name} (the lab's role) and {postgres.password_file.name} (the "
                f"superuser's) beside it")
        else:
            say("PostgreSQL", "from DATABASE_URL")
        if self.stack.broker is not None:
            say("Kafka (embedded Tansu)", f"{self.stack.bootstrap_servers}  memory only: a restart empties it")
        else:
            say("Kafka", f"{bootstrap} from KAFKA_BOOTSTRAP_SERVERS")
        if self.stack.fault_proxy is not None:
            say("Fault proxy (lost ack)", f"{self.stack.producer_bootstrap_servers} -> {self.stack.bootstrap_servers}, "
                "disarmed; the broker advertises it")
        if self.stack.learner_listen is not None:
            say("Learners' Kafka gateway", f"{self.stack.learner_bootstrap_servers}  SASL_PLAINTEXT/PLAIN with a lane's "
                f"credentials (listening on {self.stack.learner_listen})")
        return self.stack

    def configured_learner_address(self) -> str | None:
        """KAFKA_LEARNER_BOOTSTRAP_SERVERS as the environment or .env set it; not the one load_config
        took from a running.json a stopped run left behind (its port is no longer ours)."""
        address = self.config.get("KAFKA_LEARNER_BOOTSTRAP_SERVERS")
        left = running_services(self.data_dir).get("KAFKA_LEARNER_BOOTSTRAP_SERVERS")
        return address if address and (address != left or os.environ.get("KAFKA_LEARNER_BOOTSTRAP_SERVERS")) else None

    def prepare_lab(self, database_url: str, bootstrap: str, broker_is_fresh: bool) -> None:
        from ..agent.setup import ensure_lab, reset_lab

        lab = Lab(self.config["LAB_NAME"])
        partitions = self.config["LAB_PARTITIONS"]
        if broker_is_fresh:
            # The embedded broker starts empty: a journal kept from a previous run would lie.
            reset_lab(database_url, bootstrap, lab, partitions)
            say("Lab", f"{lab.name}: fresh (the embedded broker keeps nothing across restarts)")
        else:
            ensure_lab(database_url, bootstrap, lab, partitions)
            say("Lab", f"{lab.name}: ready")

    def run(self) -> int:
        print("Idempotency Lab starting", flush=True)
        started = time.monotonic()
        stack = self.start_services()
        running = {"DATABASE_URL": stack.database_url, "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers}
        if stack.postgres is not None:
            # A second terminal's CLI finds the database here, and its password in its own file.
            running.update(DATABASE_URL=stack.postgres.public_url,
                           DATABASE_PASSWORD_FILE=str(stack.postgres.owner_password_file))
        if stack.fault_proxy is not None:
            running["KAFKA_PRODUCER_BOOTSTRAP_SERVERS"] = stack.producer_bootstrap_servers
        if stack.learner_listen is not None:
            running["KAFKA_LEARNER_BOOTSTRAP_SERVERS"] = stack.learner_bootstrap_servers
        (self.data_dir / RUNNING_FILE).write_text(json.dumps(running))
        self.prepare_lab(stack.database_url, stack.bootstrap_servers, broker_is_fresh=stack.broker is not None)
        env = {}
        if stack.broker is not None and not self.config.get("LAB_BROKER_KIND"):
            # The broker it started is the embedded Tansu: the web, which never probes the broker,
            # lists the exercises that need Apache Kafka with the reason it cannot run them.
            env["LAB_BROKER_KIND"] = "tansu"
        notify = self.config.get("LAB_NOTIFY_URL")
        if not notify:
            # The agent keeps the notification service running; the launcher picks its address to print it.
            env["LAB_NOTIFY_LISTEN"] = f"{LOOPBACK}:{free_port()}"
        # The agent and the web write to our output (the terminal of `make run`).
        agent = stack.start_agent(log=None, **env)
        say("Lab agent", f"pid {agent.pid}")
        say("Notification service", f"{notify} from LAB_NOTIFY_URL" if notify
            else f"http://{env['LAB_NOTIFY_LISTEN']}  run by the lab agent")
        host, port = self.config["LAB_HOST"], self.config["LAB_PORT"]
        try:
            stack.start_web(host, port, **env)
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        if self.stopping:
            return 0
        print(f"\n  Dashboard: http://{host}:{port}/   (ready in {time.monotonic() - started:.1f}s; Ctrl-C stops)\n",
              flush=True)
        return self.watch()

    def watch(self) -> int:
        """Block until a stop signal or a child's unexpected exit."""
        while not self.stopping:
            if os.getppid() != self.parent_pid:
                # `make run` was stopped: make does not pass SIGTERM on, so its death is our signal.
                return 0
            for name, process in self.stack.children:
                if process.poll() is not None:
                    print(f"{name} exited with {process.returncode}; stopping the lab", file=sys.stderr)
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        if self.stack is not None:
            self.stack.stop()  # web, agent, fault proxy, broker, database: the last started first
        (self.data_dir / RUNNING_FILE).unlink(missing_ok=True)
        print("Idempotency Lab stopped", flush=True)


def main() -> int:
    try:
        launcher = Launcher()
        check_free(launcher.config, launcher.data_dir)
    except (ConfigError, Occupied) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    def on_stop(signum, frame):
        launcher.stopping = True
    signal.signal(signal.SIGTERM, on_stop)
    signal.signal(signal.SIGINT, on_stop)
    try:
        return launcher.run()
    finally:
        launcher.stop()


if __name__ == "__main__":
    sys.exit(main())
