"""``make run``: the whole lab with one command.

Starts what is not configured (embedded PostgreSQL when DATABASE_URL is unset, the embedded
Tansu broker when KAFKA_BOOTSTRAP_SERVERS is unset), prepares the lab, then runs the lab agent
and the web app (gunicorn) as child processes. Ctrl-C or SIGTERM stops them all, in order:
web, agent (which stops its consumers), broker, database.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from .config import RUNNING_FILE, ConfigError, load_config
from .db import sqlalchemy_url
from .embedded import EmbeddedBroker, EmbeddedPostgres
from .labs import Lab, ensure_control_schema
from .waits import port_open, wait_until

ROOT = Path(__file__).resolve().parent.parent


def say(what: str, where: str) -> None:
    print(f"  {what:<28} {where}", flush=True)


class Launcher:
    def __init__(self):
        self.config = load_config()
        self.data_dir = Path(self.config["LAB_DATA_DIR"])
        self.services: list = []
        self.children: list[tuple[str, subprocess.Popen]] = []
        self.stopping = False
        self.parent_pid = os.getppid()

    def start_services(self) -> tuple[str, str, bool]:
        database_url = os.environ.get("DATABASE_URL")
        bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
        if not database_url:
            postgres = EmbeddedPostgres(self.data_dir / "postgres").start()
            self.services.append(postgres)
            database_url = postgres.url
            say("PostgreSQL (embedded)", f"{postgres.url}  data {postgres.data_dir}")
        else:
            say("PostgreSQL", "from DATABASE_URL")
        broker_is_fresh = False
        if not bootstrap:
            broker = EmbeddedBroker(self.data_dir / "tansu.log").start()
            self.services.append(broker)
            bootstrap = broker.bootstrap_servers
            broker_is_fresh = True
            say("Kafka (embedded Tansu)", f"{bootstrap}  memory only: a restart empties it")
        else:
            say("Kafka", f"{bootstrap} from KAFKA_BOOTSTRAP_SERVERS")
        return database_url, bootstrap, broker_is_fresh

    def prepare_lab(self, database_url: str, bootstrap: str, broker_is_fresh: bool) -> None:
        from .supervisor import Supervisor

        engine = create_engine(sqlalchemy_url(database_url), poolclass=NullPool)
        with engine.begin() as conn:
            ensure_control_schema(conn)
        engine.dispose()
        lab = Lab(self.config["LAB_NAME"])
        agent = Supervisor(database_url, bootstrap, data_dir=str(self.data_dir))
        try:
            args = {"partitions": self.config["LAB_PARTITIONS"]}
            if broker_is_fresh:
                # The embedded broker starts empty: a journal kept from a previous run would lie.
                agent.reset_lab(lab, args)
                say("Lab", f"{lab.name}: fresh (the embedded broker keeps nothing across restarts)")
            else:
                agent.ensure_lab(lab, args)
                say("Lab", f"{lab.name}: ready")
        finally:
            agent.shutdown()

    def spawn(self, name: str, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        process = subprocess.Popen(argv, env=env, cwd=ROOT, start_new_session=True)
        self.children.append((name, process))
        return process

    def run(self) -> int:
        print("Idempotency Lab starting", flush=True)
        started = time.monotonic()
        database_url, bootstrap, fresh = self.start_services()
        running = {"DATABASE_URL": database_url, "KAFKA_BOOTSTRAP_SERVERS": bootstrap}
        (self.data_dir / RUNNING_FILE).write_text(json.dumps(running))
        env = {**os.environ, **running, "LAB_DATA_DIR": str(self.data_dir),
               "LAB_HOST": str(self.config["LAB_HOST"]), "LAB_PORT": str(self.config["LAB_PORT"])}
        self.prepare_lab(database_url, bootstrap, fresh)
        agent = self.spawn("agent", [sys.executable, "-m", "webapp.supervisor"], env)
        say("Lab agent", f"pid {agent.pid}")
        host, port = self.config["LAB_HOST"], self.config["LAB_PORT"]
        web = self.spawn("web", [sys.executable, "-m", "gunicorn", "-c", str(ROOT / "gunicorn.conf.py"), "app:app"], env)
        wait_until(lambda: port_open(host, port) or web.poll() is not None, timeout=30,
                   message=f"the web app did not listen on {host}:{port}")
        if web.poll() is not None:
            print(f"the web app exited with {web.returncode}", file=sys.stderr)
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
            for name, process in self.children:
                if process.poll() is not None:
                    print(f"{name} exited with {process.returncode}; stopping the lab", file=sys.stderr)
                    return 1
            time.sleep(0.2)
        return 0

    def stop(self) -> None:
        for name, process in reversed(self.children):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        for service in reversed(self.services):
            service.stop()
        (self.data_dir / RUNNING_FILE).unlink(missing_ok=True)
        print("Idempotency Lab stopped", flush=True)


def main() -> int:
    try:
        launcher = Launcher()
    except ConfigError as error:
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
