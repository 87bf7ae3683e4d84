"""Your consumer (a learner's own code in a lane of the lab): the lab grades code it does not run.

Two consumers written for these tests (tests/byoc/consumer.py: kafka-python, psycopg, nothing of
the lab) run as OS processes, started and stopped by PID: the grading exercise (19) fails the naive
one with the right why and passes the idempotent one. And the lane's role cannot touch another lane
or another lab.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import psycopg
import pytest
from sqlalchemy import text

import support
from webapp import ops
from webapp.agent.processes import stop_process
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.store import command_channel
from webapp.web.db import db

CONSUMER = Path(__file__).with_name("consumer.py")
EXERCISE = Path(__file__).resolve().parents[2] / "scenarios" / "19_your_consumer_graded.yaml"


def start_outside_consumer(mode: str, info: dict, log: Path) -> subprocess.Popen:
    """The test's own consumer process, given what the "Your consumer" page shows."""
    args = [sys.executable, str(CONSUMER), mode, "--bootstrap", info["bootstrap_servers"], "--topic", info["topic"],
            "--group", info["group_id"], "--client-id", info["client_id"], "--database-url", info["database_url"]]
    if info.get("kafka_authenticated"):   # through the learners' gateway, signed in as the lane's user
        args += ["--sasl-username", info["sasl_username"], "--sasl-password", info["sasl_password"]]
    with log.open("w") as output:  # the child holds its own copy of the descriptor
        return subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT)


def grade(app, mode: str, tmp_path: Path) -> dict:
    """Run the grading exercise headless (`flask scenario run … --lane mine`) and start the outside
    consumer once the run's setup made its lane, as a learner does when the first step waits."""
    lab = Lab(app.config["LAB_NAME"])
    outcome: dict = {}

    def run() -> None:
        result = app.test_cli_runner().invoke(args=["scenario", "run", str(EXERCISE), "--json", "--lane", "mine"])
        outcome.update(code=result.exit_code, output=result.output)

    runner = threading.Thread(target=run)
    runner.start()
    consumer = None
    try:
        with app.app_context():
            def lane_made() -> bool:
                with db.engine.connect() as conn:
                    return bool(conn.execute(text(
                        "SELECT to_regclass(:t) IS NOT NULL AND EXISTS (SELECT 1 FROM pg_roles WHERE rolname = :r)"),
                        {"t": f'"{lab.lane_schema("mine")}".payments', "r": lab.lane_role("mine")}).scalar())
            wait_until(lambda: lane_made() or not runner.is_alive(), timeout=90,
                       message="the grading exercise's setup did not make lane mine")
            if runner.is_alive():
                info = ops.call("get_yours", ops.Context(db.engine, lab, app.config), {"lane": "mine"})
                consumer = start_outside_consumer(mode, info, tmp_path / f"{mode}.log")
        runner.join(timeout=600)
        assert not runner.is_alive(), "the grading exercise did not finish within 10 minutes"
    finally:
        if consumer is not None:
            stop_process(consumer)
    result = json.loads(outcome["output"][outcome["output"].index("{"):])
    result["code"] = outcome["code"]
    result["consumer_log"] = (tmp_path / f"{mode}.log").read_text() if consumer is not None else ""
    return result


@pytest.fixture
def graded_app(proxied_stack, app_factory, lab_name):
    app = app_factory(LAB_NAME=lab_name, DATABASE_URL=proxied_stack.database_url,
                      KAFKA_BOOTSTRAP_SERVERS=proxied_stack.bootstrap_servers,
                      KAFKA_PRODUCER_BOOTSTRAP_SERVERS=proxied_stack.producer_bootstrap_servers,
                      KAFKA_LEARNER_BOOTSTRAP_SERVERS=proxied_stack.learner_bootstrap_servers)
    yield app
    support.drop_lab(app, lab_name)


@pytest.fixture
def gateway_lab(graded_app, lab_name):
    """A lab of the proxied stack, whose learners reach the broker through its Kafka gateway only."""
    driver = support.open_lab(graded_app, lab_name)
    yield driver
    support.kill_consumers(driver)


def described(result: dict) -> str:
    return (f"{result['status']}: {result['reason']}\nsteps: {json.dumps(result['steps'], indent=1)}\n"
            f"consumer:\n{result['consumer_log'][-3000:]}")


@pytest.mark.long
def test_the_grading_exercise_fails_a_naive_consumer_and_says_why(graded_app, tmp_path):
    result = grade(graded_app, "naive", tmp_path)
    assert result["code"] == 1 and result["status"] == "failed", described(result)
    # Every step ran: the failure is the verdict's, not a step's.
    assert all(step["status"] == "ok" for step in result["steps"]), described(result)
    verdict = result["graded"]
    # The resend, the source duplicate and the producer's retry after the lost ack: three second credits.
    assert verdict["duplicates_applied"] >= 3, verdict
    assert verdict["effects_lost"] == 0, verdict
    # The lab records no deliveries of a consumer it does not run: each why reads the log and names
    # the cause and the key that would have absorbed it.
    whys = {anomaly["why"].split(" has ")[0].split(" (")[1].rstrip(")"): anomaly["why"]
            for anomaly in verdict["anomalies"] if anomaly["kind"] == "applied-twice"}
    pix, retried = whys.get("credit acc-4 +40.00", ""), whys.get("credit acc-5 +50.00", "")
    assert "the same event_id again (the lab resent it, an application's retry)" in pix, whys
    assert "a new event_id for the same transaction_id (a source duplicate)" in pix, whys
    assert "a key on event_id would have absorbed" in pix and "only a key on transaction_id absorbs it" in pix, whys
    assert "the same event_id again (a producer's retry after a lost ack)" in retried, whys
    assert "a key on event_id would have absorbed" in retried, whys
    assert not any("by hand" in why for why in whys.values()), whys
    failed = {check["label"] for check in result["checks"] if not check["ok"]}
    assert any("duplicates_applied" in label for label in failed), failed


@pytest.mark.long
def test_the_grading_exercise_passes_an_idempotent_consumer_in_guided_mode(graded_app, tmp_path):
    """Click by click in guided mode, in the lab the page's connection details name (the app's
    LAB_NAME, never a fresh lab): the learner starts their consumer once the lab is prepared."""
    lab = Lab(graded_app.config["LAB_NAME"])
    consumers: list[subprocess.Popen] = []

    def start_mine() -> None:
        with graded_app.app_context():
            info = ops.call("get_yours", ops.Context(db.engine, lab, graded_app.config), {"lane": "mine"})
        consumers.append(start_outside_consumer("idempotent", info, tmp_path / "idempotent.log"))
    try:
        run = support.run_guided(graded_app, EXERCISE, after_prepare=start_mine)
    finally:
        for consumer in consumers:
            stop_process(consumer)
    log = (tmp_path / "idempotent.log").read_text() if consumers else "(never started)"
    assert run.lab == lab.name, run.lab
    assert run.status == "passed", f"{run.status}: {run.reason}\nchecks: {run.checks}\nconsumer:\n{log[-3000:]}"
    assert all(step["status"] == "ok" for step in run.steps), run.steps
    assert run.graded["duplicates_applied"] == 0 and run.graded["effects_lost"] == 0, run.graded
    assert run.graded["source_duplicates"] == 1, run.graded


def test_the_role_touches_its_own_lane_and_nothing_else(app, lab, lab_name, agent):
    """Connect as the lane's role and try: its own tables yes; the lab's own schema, another lane,
    another lab's lane and the control tables no."""
    other_name = f"{lab_name}_x"
    with app.app_context():
        command_channel.run(db.engine, other_name, "lab.ensure", {"partitions": 1}, timeout=60)
    try:
        mine = lab.client.post("/api/v1/yours", json={"lane": "mine"})
        assert mine.status_code == 201, mine.get_json()
        info = mine.get_json()
        assert lab.client.post("/api/v1/groups", json={"group": "other", "lane": "other"}).status_code == 201
        with app.app_context():
            other = ops.call("create_yours", ops.Context(db.engine, Lab(other_name), app.config), {"lane": "mine"})
        assert other["database_url"] != info["database_url"]
        # The page shows where to connect and a starter to copy, with the addresses filled in.
        page = lab.client.get("/yours").get_data(as_text=True)
        assert info["group_id"] in page and info["client_id"] in page and "TODO your dedup" in page
        this_lab = Lab(lab_name)
        with psycopg.connect(info["database_url"], autocommit=True) as conn:
            assert conn.execute("SHOW search_path").fetchone()[0] == this_lab.lane_schema("mine")
            conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 'acc-1'")
            conn.execute("INSERT INTO payments (event_id, transaction_id, account_id, amount_cents) "
                         "VALUES (gen_random_uuid(), 'tx-1', 'acc-1', 1)")
            assert conn.execute("SELECT count(*) FROM payments").fetchone()[0] == 1
            for forbidden in (f'SELECT * FROM "{this_lab.schema}".accounts',
                              f'UPDATE "{this_lab.lane_schema("other")}".accounts SET balance = 0',
                              f'SELECT * FROM "{Lab(other_name).lane_schema("mine")}".payments',
                              f'INSERT INTO "{Lab(other_name).schema}".timeline (kind, summary) VALUES (\'x\', \'y\')',
                              "SELECT * FROM lab_control.consumers",
                              "CREATE TABLE mine_own (id int)"):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(forbidden)
        # The lab's own consumers may not join your group; the faults say what they did.
        refused = lab.client.post("/api/v1/consumers", json={"group": "mine"})
        assert refused.status_code == 400 and "your consumer" in refused.get_json()["error"], refused.get_json()
        switched = lab.client.post("/api/v1/groups/mine/strategy", json={"strategy": "eventid-atomic"})
        assert switched.status_code in (400, 422) and "your consumer" in switched.get_data(as_text=True), \
            switched.get_json()
        with psycopg.connect(info["database_url"]) as conn:
            conn.execute("SELECT 1")  # a session of the role, idle in transaction
            ended = lab.client.post("/api/v1/yours/terminate-sessions", json={"lane": "mine"}).get_json()
            assert ended["sessions_terminated"] == 1, ended
            with pytest.raises(psycopg.OperationalError):
                conn.execute("SELECT 1")
    finally:
        support.drop_lab(app, other_name)
    with app.app_context(), db.engine.connect() as conn:
        # A dropped lab takes its roles with it.
        assert conn.execute(text("SELECT count(*) FROM pg_roles WHERE rolname = :r"),
                            {"r": Lab(other_name).lane_role("mine")}).scalar() == 0


def test_the_starter_the_page_shows_runs_as_copied_and_applies_the_lab_s_credits(gateway_lab, tmp_path):
    """What a learner copies from the page, run as it is in a terminal (confluent-kafka + psycopg):
    through the learners' Kafka gateway with the lane's Kafka user, it consumes the lab's credits into
    the lane; with no dedup yet, a resend is applied twice and the lane's verdict says so."""
    import html
    import re

    lab = gateway_lab

    assert lab.client.post("/api/v1/yours", json={"lane": "mine"}).status_code == 201
    page = lab.client.get("/yours").get_data(as_text=True)
    starter = html.unescape(re.search(r"<pre><code[^>]*>(.*?)</code></pre>", page, re.S).group(1))
    assert '"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"' in starter, starter
    script = tmp_path / "my_consumer.py"
    script.write_text(starter)
    first = lab.credit("acc-1", 500)
    lab.publish(mode="resend", event_id=first["event_id"])
    with (tmp_path / "my_consumer.log").open("w") as output:
        process = subprocess.Popen([sys.executable, str(script)], stdout=output, stderr=subprocess.STDOUT,
                                   cwd=tmp_path)
    try:
        def lane_verdict() -> dict:
            lanes = lab.state()["lanes"]
            return next((lane["verdict"] for lane in lanes if lane["lane"] == "mine"), {})
        verdict = wait_until(lambda: (v := lane_verdict()).get("duplicates_applied") == 1 and v,
                             timeout=60, message=lambda: f"the starter never applied the credit and its resend: "
                             f"{lane_verdict()}\n{(tmp_path / 'my_consumer.log').read_text()[-2000:]}")
        assert verdict["effects_lost"] == 0, verdict
        [why] = [a["why"] for a in verdict["anomalies"] if a["kind"] == "applied-twice"]
        assert (f"P{first['partition']}@{first['offset']} (credit acc-1 +5.00) has 2 effect rows in your lane" in why
                and "the same event_id again (the lab resent it, an application's retry)" in why
                and "1 repeats an event_id already applied (a key on event_id would have absorbed it)" in why), why
        assert process.poll() is None, (tmp_path / "my_consumer.log").read_text()
        # The lab gets no heartbeat from it: its committed offsets come from the broker (the agent's
        # admin client), on the partitions of GET /api/v1/state and in the partitions panel.
        group_id = Lab(lab.lab.name).group_id("mine")

        def committed_of_mine() -> int:
            return sum((p["committed"].get(group_id) or 0) for p in lab.state()["partitions"])
        wait_until(lambda: committed_of_mine() == 2, timeout=30,
                   message=lambda: f"the learner's group's committed offsets never showed: {lab.state()['partitions']}")
        panel = lab.client.get("/panels/partitions").get_data(as_text=True)
        assert "mine @ 2" in panel, panel[:3000]  # both records are on acc-1's partition
    finally:
        stop_process(process)


def test_the_faults_on_your_consumer_act_cut_its_connections_and_keep_its_commits_from_the_broker(
        graded_app, tmp_path):
    """cut_yours and block_yours_commits, asserted by their effect: the proxy closes the consumer's
    broker connections (it reconnects and carries on); while its commits are blocked it applies
    records and the broker's committed offset stays where it was, and once they flow it moves."""
    lab = support.open_lab(graded_app, graded_app.config["LAB_NAME"])
    info = lab.post("/yours", {"lane": "mine"})
    group_id, log = info["group_id"], tmp_path / "idempotent.log"
    consumer = start_outside_consumer("idempotent", info, log)

    def committed() -> int:
        """The broker's committed offsets of the lane's group (the agent reads them with its admin client)."""
        return sum((p["committed"].get(group_id) or 0) for p in lab.state()["partitions"])

    def proxy(counter: str) -> int:
        return lab.client.get("/api/v1/fault-proxy").get_json()[counter]

    def wait_committed(n: int, why: str) -> None:
        wait_until(lambda: committed() == n, timeout=60,
                   message=lambda: f"{why}: committed {committed()}, not {n}\n{log.read_text()[-2000:]}")
    try:
        lab.credit("acc-1", 100)  # every credit to acc-1: one partition, one committed offset to follow
        wait_committed(1, "the consumer never committed its first record")

        assert lab.post("/yours/commits-blocked", {"lane": "mine", "seconds": 60})["blocked"] is True
        blocked_before = proxy("commits_blocked")
        lab.credit("acc-1", 200)
        wait_until(lambda: lane_balance(graded_app, lab, "acc-1") == 300, timeout=60,
                   message=lambda: f"the consumer never applied the second credit\n{log.read_text()[-2000:]}")
        wait_until(lambda: proxy("commits_blocked") > blocked_before, timeout=30,
                   message="the proxy never kept a commit of the consumer from the broker")
        assert committed() == 1, "a commit reached the broker while commits were blocked"

        assert lab.post("/yours/commits-blocked", {"lane": "mine", "blocked": False})["blocked"] is False
        lab.credit("acc-1", 300)  # its next commit (asynchronous: covers the one kept) gets through
        wait_committed(3, "the commits never reached the broker once unblocked")

        held = wait_until(lambda: connections_to(consumer.pid, info["bootstrap_servers"]), timeout=10,
                          message="the consumer holds no connection to its bootstrap address")
        cut_before = proxy("connections_cut")
        cut = lab.post("/yours/cut", {"lane": "mine"})
        assert cut["connections_cut"] >= 1, cut
        assert proxy("connections_cut") >= cut_before + cut["connections_cut"]
        # The consumer's own connections were closed, and it opened new ones.
        wait_until(lambda: (now := connections_to(consumer.pid, info["bootstrap_servers"])) and not now & held,
                   timeout=30, message=lambda: f"the consumer's connections {held} were not replaced: "
                                               f"{connections_to(consumer.pid, info['bootstrap_servers'])}")
        lab.credit("acc-1", 400)
        wait_committed(4, "the consumer never carried on after its connections were cut")
        assert lane_balance(graded_app, lab, "acc-1") == 1000
        assert consumer.poll() is None, log.read_text()[-2000:]
    finally:
        stop_process(consumer)


def connections_to(pid: int, address: str) -> set[tuple[str, int]]:
    """The local addresses of a process's established TCP connections to ``address``'s port."""
    port = int(address.rsplit(":", 1)[1])
    return {tuple(c.laddr) for c in psutil.Process(pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED}


def lane_balance(app, lab, account_id: str) -> int:
    with app.app_context(), db.engine.connect() as conn:
        return conn.execute(text(f'SELECT balance FROM "{lab.lab.lane_schema("mine")}".accounts WHERE id = :a'),
                            {"a": account_id}).scalar_one()
