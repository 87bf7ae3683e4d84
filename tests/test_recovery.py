"""Recovery: PostgreSQL restarted under a running lab, and the lab agent SIGKILLed.

A stack of this module's own (its PostgreSQL is stopped and started again on the same data
directory and port; its agent is killed), so the session's services never go away under other
tests. Real processes, real signals; every wait has a deadline.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import support
from support import ROOT, LabDriver, service_env, wait_for_agent
from webapp import create_app
from webapp.agent.processes import stop_process
from webapp.dev.embedded import EmbeddedBroker, EmbeddedPostgres
from webapp.domain.lab import Lab
from webapp.domain.vocabulary import AGENT_FRESH_SECONDS
from webapp.domain.waits import wait_until
from webapp.store import command_channel
from webapp.store.connection import psycopg_conninfo, sqlalchemy_url
from webapp.store.migrations import upgrade
from webapp.web.db import db


class Stack:
    def __init__(self, base):
        self.base = base
        self.postgres = EmbeddedPostgres(base / "postgres")
        self.broker = EmbeddedBroker(base / "tansu.log")
        self.agent: subprocess.Popen | None = None
        self.agents: list[subprocess.Popen] = []

    @property
    def env(self) -> dict[str, str]:
        return {k: v for k, v in service_env(self, LAB_DATA_DIR=str(self.base)).items()}

    # what service_env reads
    @property
    def database_url(self) -> str:
        return self.postgres.url

    @property
    def bootstrap_servers(self) -> str:
        return self.broker.bootstrap_servers

    @property
    def data_dir(self):
        return self.base

    def start_agent(self) -> subprocess.Popen:
        log_path = self.base / f"agent-{len(self.agents) + 1}.log"
        with open(log_path, "ab") as log:
            self.agent = subprocess.Popen([sys.executable, "-m", "webapp.agent"], env=self.env, cwd=ROOT, stdout=log,
                                          stderr=subprocess.STDOUT)
        self.agents.append(self.agent)
        wait_for_agent(self.database_url, self.agent, log_path)
        return self.agent

    def agent_log(self) -> str:
        return (self.base / f"agent-{len(self.agents)}.log").read_text()[-4000:]


@pytest.fixture(scope="module")
def stack():
    with support.service_dir("recovery") as base:
        stack = Stack(base)
        try:
            stack.postgres.start()
            stack.broker.start()
            upgrade(stack.postgres.url)
            stack.start_agent()
            yield stack
        finally:
            for agent in stack.agents:
                stop_process(agent)
            stack.broker.stop()
            stack.postgres.stop()


@pytest.fixture
def recovery_lab(stack, tmp_path):
    name = f"r{len(stack.agents)}_{int(time.monotonic() * 1000) % 100000}"
    app = create_app({"TESTING": True, "DATABASE_URL": stack.database_url,
                      "KAFKA_BOOTSTRAP_SERVERS": stack.bootstrap_servers, "LAB_DATA_DIR": str(tmp_path / "data"),
                      "SECRET_KEY": "test", "WTF_CSRF_ENABLED": False, "LAB_NAME": name})
    engine = create_engine(sqlalchemy_url(stack.database_url), poolclass=NullPool)
    command_channel.run(engine, name, "lab.ensure", {"partitions": 3}, timeout=60)
    driver = LabDriver(app.test_client(), Lab(name))
    driver.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    yield driver
    for consumer in driver.state()["consumers"]:
        if consumer["state"] in ("starting", "running", "frozen", "stepping"):
            driver.client.post(f"/api/v1/consumers/{consumer['id']}/stop", json={})
    engine.dispose()
    with app.app_context():
        db.engine.dispose()


def applied_twice_and_missing(stack, lab) -> tuple[int, int]:
    """From the effect table and the log alone (not the lab's verdict): transactions with more
    than one payment row, and valid credit transactions in the log with none."""
    engine = create_engine(sqlalchemy_url(stack.database_url), poolclass=NullPool)
    try:
        with engine.connect() as conn:
            s = f'"{lab.lab.schema}"'
            twice = conn.execute(text(f"SELECT count(*) FROM (SELECT transaction_id FROM {s}.payments "
                                      "GROUP BY transaction_id HAVING count(*) > 1) x")).scalar_one()
            missing = conn.execute(text(
                f"SELECT count(DISTINCT r.transaction_id) FROM {s}.log_records r WHERE r.type = 'credit' "
                f"AND r.invalid_reason IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.payments p "
                "WHERE p.transaction_id = r.transaction_id)")).scalar_one()
        return twice, missing
    finally:
        engine.dispose()


def test_a_postgresql_restart_under_a_running_lab(stack, recovery_lab):
    lab = recovery_lab
    consumers = [lab.start_consumer(name=name)["consumer_id"] for name in ("c1", "c2")]
    for consumer_id in consumers:
        lab.wait_consumer(consumer_id, lambda c: c["state"] == "running", "never ran")
    agent = stack.agent
    # Mid-flight, for certain: a transaction of the test's holds acc-1's row, so the consumers'
    # transactions of the burst (every credit is to acc-1) wait on it, open, when PostgreSQL stops.
    holder = psycopg.connect(psycopg_conninfo(stack.database_url))
    try:
        holder.execute(f'SELECT 1 FROM "{lab.lab.schema}".accounts WHERE id = %s FOR UPDATE', ["acc-1"])
        lab.publish(account_id="acc-1", amount_cents=100, mode="burst", count=300)
        waiting = wait_until(lambda: effects_waiting_on_a_lock(holder, lab), timeout=30,
                             message="no consumer's transaction ever waited on acc-1's row")
        assert waiting >= 1
        assert holder.execute(f'SELECT count(*) FROM "{lab.lab.schema}".payments').fetchone()[0] == 0
        stack.postgres.stop()  # SIGINT to the postmaster, mid-flight: the consumers' transactions are open
    finally:
        holder.close()
    # Down for real: PostgreSQL refuses a new connection.
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(psycopg_conninfo(stack.database_url), connect_timeout=5).close()
    for path in ("/api/v1/state", "/", "/live", "/panels/verdict"):
        response = lab.client.get(path)
        assert response.status_code == 503, f"{path}: {response.status_code} {response.get_data(as_text=True)[:300]}"
        assert "database does not answer" in response.get_data(as_text=True) or path == "/", path
    body = lab.client.get("/api/v1/state").get_json()
    assert "recovers by itself" in body["error"]
    # The status bar still answers, saying so; /live names it so an open page asks for it.
    assert body["services"][0]["part"] == "postgres" and body["services"][0]["up"] is False, body
    assert lab.client.get("/live").get_json()["fingerprints"] == {"status": "database-unreachable"}
    bar = lab.client.get("/panels/status")
    assert bar.status_code == 200 and 'data-part="postgres"' in bar.get_data(as_text=True), bar.get_data(as_text=True)
    assert "PostgreSQL is unreachable" in bar.get_data(as_text=True)
    assert lab.client.get("/healthz").status_code == 503

    stack.postgres.start()  # the same data directory and port
    wait_until(lambda: lab.client.get("/api/v1/state").status_code == 200, timeout=30,
               message="the web app did not answer again after PostgreSQL came back")
    assert lab.state()["services"][0] == {"part": "postgres", "up": True, "sentence": "", "todo": ""}
    assert 'data-part="postgres"' not in lab.client.get("/panels/status").get_data(as_text=True)
    wait_until(lambda: lab.client.get("/healthz").status_code == 200, timeout=30,
               message=lambda: f"the agent did not report again: {lab.client.get('/healthz').get_json()} "
                               f"{stack.agent_log()}")
    assert agent.poll() is None, f"the agent died with PostgreSQL: {stack.agent_log()}"
    # The agent carries out commands again, and the consumers go on where they were.
    lab.publish(account_id="acc-2", amount_cents=700)
    lab.wait(lambda s: s["verdict"]["status"] == "exactly-once" and s["verdict"]["transactions"] == 301,
             "the lab never settled to exactly-once after the restart", timeout=90)
    states = {c["name"]: c["state"] for c in lab.state()["consumers"]}
    assert states == {"c1": "running", "c2": "running"}, states
    assert applied_twice_and_missing(stack, lab) == (0, 0)
    assert lab.account("acc-1")["actual"] == 30000 and lab.account("acc-2")["actual"] == 700


def effects_waiting_on_a_lock(conn, lab) -> int:
    """How many of ``lab``'s consumers' effects sessions wait on a lock now."""
    return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s "
                        "AND wait_event_type = 'Lock'", [f"lab {lab.lab.name} % effects"]).fetchone()[0]


def test_a_sigkilled_agent_its_consumers_go_and_the_dashboard_says_so(stack, recovery_lab):
    lab = recovery_lab
    consumer_id = lab.start_consumer(name="k1")["consumer_id"]
    lab.wait_assigned(consumer_id)
    dead = stack.agent
    dead_pid = lab.consumer(consumer_id)["pid"]
    dead.send_signal(signal.SIGKILL)
    dead.wait(timeout=10)
    # Within 5 s of its death, the state API and the status bar say the agent is down.
    wait_until(lambda: next(p for p in lab.state()["services"] if p["part"] == "agent")["up"] is False
               and 'data-agent="down"' in lab.client.get("/panels/status").get_data(as_text=True),
               timeout=5, interval=0.25, message="the agent SIGKILLed, not shown down within 5 s")
    # The consumer notices its agent is gone and leaves; nothing runs it now.
    row = lab.wait_consumer(consumer_id, lambda c: c["state"] == "gone", "did not show as gone",
                            timeout=AGENT_FRESH_SECONDS + 5)
    assert "agent" in (row["last_error"] or ""), row
    wait_until(lambda: not _alive(dead_pid), timeout=10, message=f"the orphaned consumer {dead_pid} still runs")
    # The top bar says no agent runs (once its heartbeat is stale), the consumer's card says gone.
    html = wait_until(lambda: 'data-agent="down"' in (page := lab.client.get("/").get_data(as_text=True)) and page,
                      timeout=AGENT_FRESH_SECONDS + 5, message="the dashboard never said the agent is down")
    assert "∅ gone" in html
    # A consumer too stuck to notice is the reaper's to mark gone, within 5 s of the next agent's
    # start: test_agent.py::test_the_reaper_fails_a_sigkilled_agents_commands_and_marks_its_consumers_gone.
    stack.start_agent()
    assert next(p for p in lab.state()["services"] if p["part"] == "agent")["up"] is True
    timeline = lab.client.get("/panels/timeline").get_data(as_text=True)
    assert "k1" in timeline and "agent" in timeline and "died" in timeline, timeline
    # The lab works again through the new agent: a consumer it starts runs and applies a credit.
    k2 = lab.start_consumer(name="k2")["consumer_id"]
    lab.wait_assigned(k2)
    lab.publish(account_id="acc-3", amount_cents=300)
    lab.wait_consumer(k2, lambda c: c["applied"] >= 1, "the new agent's consumer never applied the credit")
    assert lab.account("acc-3")["actual"] == 300


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_a_consumer_started_while_postgresql_is_down_waits_for_it(stack, recovery_lab, tmp_path):
    """Chaos restarts consumers while PostgreSQL restarts: one that starts then waits, it does not die."""
    lab = recovery_lab
    consumer_id = lab.start_consumer(name="w1")["consumer_id"]
    lab.wait_consumer(consumer_id, lambda c: c["state"] == "running", "never ran")
    lab.post(f"/consumers/{consumer_id}/stop")
    lab.wait_consumer(consumer_id, lambda c: c["state"] == "stopped", "never stopped")
    log_path = tmp_path / "w1.log"
    process = None
    stack.postgres.stop()
    try:
        with open(log_path, "ab") as log:  # the process the agent would start for a restart
            process = subprocess.Popen([sys.executable, "-m", "webapp.consumer", "--lab", lab.lab.name,
                                        "--consumer-id", str(consumer_id)], env=stack.env, cwd=ROOT,
                                       stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: "PostgreSQL does not answer" in log_path.read_text() or process.poll() is not None,
                   timeout=30, message=lambda: f"the consumer never said it waits: {log_path.read_text()}")
        assert process.poll() is None, f"the consumer died while PostgreSQL was down: {log_path.read_text()}"
        stack.postgres.start()
        lab.wait_consumer(consumer_id, lambda c: c["state"] == "running", "never ran once PostgreSQL was back",
                          timeout=60)
    finally:
        if stack.postgres.process is None or stack.postgres.process.poll() is not None:
            stack.postgres.start()
        if process is not None:
            stop_process(process)
