"""The lab agent (webapp/agent): its process and Kafka controls (freeze/thaw, step mode, stop,
offset resets, scheduled TTL, strategy lanes), its command queue's lease and reaper, its
heartbeat thread, ids unique per start, and consumer output. Real processes, real broker, real
database: agents of their own where a test kills one, addressed by id so the session's agent never
takes their commands.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

import psutil
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from support import ROOT, service_env, sessions_blocked_by
from webapp.agent.processes import stop_process
from webapp.dev.stack import AGENT_TIMEOUT
from webapp.domain.vocabulary import AGENT_FRESH_SECONDS
from webapp.domain.waits import wait_until
from webapp.store import command_channel
from webapp.store import commands as command_rows
from webapp.store.connection import sqlalchemy_url
from webapp.web.db import lab_session


def start(lab, name="c1", **body) -> int:
    consumer_id = lab.start_consumer(name=name, **body)["consumer_id"]
    lab.wait_assigned(consumer_id)
    return consumer_id


def wait_caught_up_with(lab, *records: dict) -> dict:
    """The log mirror holds ``records`` (log_end comes from it, and lags the delivery reports a
    little), then the group has applied and committed everything up to the log end."""
    def in_log(state):
        ends = {p["partition"]: p["log_end"] for p in state["partitions"]}
        return all((ends.get(r["partition"]) or 0) > r["offset"] for r in records)
    lab.wait(in_log, "the log mirror never read the published records")
    return lab.wait_caught_up()


def count(app, schema: str, sql: str) -> int:
    with app.app_context(), lab_session(schema) as session:
        return session.execute(text(sql)).scalar()


def test_freeze_stops_progress_and_thaw_resumes(lab):
    """A witness consumer in a group of its own (on a lane, so the lab's accounts stay the frozen
    group's) applies the record: delivery was possible, yet the frozen consumer applied nothing."""
    lab.post("/groups", {"group": "witness", "strategy": "none", "lane": "witness"})
    c1 = start(lab)
    witness = start(lab, name="w1", group="witness")
    lab.post(f"/consumers/{c1}/freeze")
    lab.wait_state(c1, "frozen")
    record = lab.credit("acc-2", 300)
    lab.wait(lambda s: next(p for p in s["partitions"] if p["partition"] == record["partition"])["log_end"]
             > record["offset"], "the record never reached the log")
    lab.wait_consumer(witness, lambda c: c["applied"] == 1, "the witness never applied the record")
    assert lab.consumer(c1)["applied"] == 0
    assert lab.account("acc-2")["actual"] == 0
    lab.post(f"/consumers/{c1}/thaw")
    lab.wait_consumer(c1, lambda c: c["applied"] == 1, "the thawed consumer never applied the record", timeout=45)
    assert lab.account("acc-2")["actual"] == 300


def test_step_mode_stops_at_each_point_of_one_message(lab):
    c1 = start(lab)
    lab.post(f"/consumers/{c1}/step-mode", {"on": True})
    record = lab.credit("acc-1", 1000)
    seen = []
    for expected_point, balance in [("before-effect", 0), ("after-effect-before-commit", 1000), ("after-commit", 1000)]:
        row = lab.wait_consumer(c1, lambda c: c["state"] == "stepping" and c["step_at"] == expected_point,
                                f"did not stop at {expected_point}")
        seen.append(row["step_at"])
        assert lab.account("acc-1")["actual"] == balance
        if expected_point == "after-effect-before-commit":
            # The effect is committed in PostgreSQL; the offset is not committed in Kafka yet.
            record_partition = next(p for p in lab.state()["partitions"] if p["partition"] == record["partition"])
            assert not record_partition["committed"].get(lab.lab.group_id("payments"))
        lab.post(f"/consumers/{c1}/step")
    assert seen == ["before-effect", "after-effect-before-commit", "after-commit"]
    wait_caught_up_with(lab, record)


def test_stepping_without_step_mode_is_refused(lab):
    c1 = start(lab)
    response = lab.client.post(f"/api/v1/consumers/{c1}/step", json={})
    assert response.status_code == 400 and "not in step mode" in response.get_json()["error"]


def test_graceful_stop_leaves_the_group_and_reports_stopped(lab):
    c1 = start(lab)
    lab.post(f"/consumers/{c1}/stop")
    row = lab.wait_state(c1, "stopped")
    assert row["exit_code"] == 0 and row["assigned"] == []


def publish_three(lab) -> list[dict]:
    return [lab.credit("acc-1", amount) for amount in (100, 200, 400)]


@pytest.mark.parametrize("body,replayed_cents", [
    ({"mode": "earliest"}, 700),
    ({"mode": "back", "back": 1}, 400),
    ({"mode": "back", "back": 2}, 600),
])
def test_reset_offsets_replays_what_it_says(lab, body, replayed_cents):
    start(lab)
    wait_caught_up_with(lab, *publish_three(lab))
    result = lab.post("/groups/payments/reset-offsets", body)
    assert result["restarted"]
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == "acc-1")["actual"] == 700 + replayed_cents,
             f"the reset {body} did not replay {replayed_cents}")
    lab.wait_caught_up()
    assert lab.account("acc-1")["actual"] == 700 + replayed_cents


def test_reset_to_an_offset_per_partition(lab):
    start(lab)
    records = publish_three(lab)
    wait_caught_up_with(lab, *records)
    partition = records[0]["partition"]
    lab.post("/groups/payments/reset-offsets", {"mode": "offset", "offsets": {str(partition): records[1]["offset"]}})
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == "acc-1")["actual"] == 1300,
             "the offset reset did not replay the last two records")


def test_reset_to_a_timestamp(lab):
    start(lab)
    first = lab.credit("acc-1", 100)
    boundary = time.time() + 0.002
    wait_until(lambda: time.time() > boundary, timeout=1, message="the clock did not advance")
    wait_caught_up_with(lab, first, lab.credit("acc-1", 200))
    iso = datetime.fromtimestamp(boundary, timezone.utc).isoformat()
    lab.post("/groups/payments/reset-offsets", {"mode": "timestamp", "timestamp": iso})
    lab.wait(lambda s: next(a for a in s["accounts"] if a["id"] == "acc-1")["actual"] == 500,
             "the timestamp reset did not replay only the later record")


def test_scheduled_ttl_cleanup_deletes_old_keys(app, lab):
    lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    start(lab)
    wait_caught_up_with(lab, lab.credit("acc-1", 100))
    assert count(app, lab.lab.schema, "SELECT count(*) FROM processed_events") == 1
    lab.post("/ttl", {"ttl_seconds": 0, "ttl_schedule_seconds": 1})
    wait_until(lambda: count(app, lab.lab.schema, "SELECT count(*) FROM processed_events") == 0, timeout=15,
               message="the scheduled TTL cleanup never ran")
    assert count(app, lab.lab.schema, "SELECT count(*) FROM timeline WHERE kind = 'ttl'") >= 1


def test_scheduled_ttl_cleanup_cleans_every_lane(app, lab):
    lane = lab.post("/groups", {"group": "atomic", "strategy": "eventid-atomic", "lane": "atomic"})
    start(lab, name="a1", group="atomic")
    lab.credit("acc-1", 100)
    wait_until(lambda: count(app, lane["effects_schema"], "SELECT count(*) FROM processed_events") == 1, timeout=30,
               message="the lane's consumer never recorded the event's key")
    lab.post("/ttl", {"ttl_seconds": 0, "ttl_schedule_seconds": 1})
    wait_until(lambda: count(app, lane["effects_schema"], "SELECT count(*) FROM processed_events") == 0, timeout=15,
               message="the scheduled TTL cleanup never cleaned the lane's dedup table")


def test_a_strategy_lane_applies_to_its_own_copy_of_the_accounts(app, lab):
    lane = lab.post("/groups", {"group": "atomic", "strategy": "eventid-atomic", "lane": "atomic"})
    assert lane["effects_schema"] == f"{lab.lab.schema}__atomic"
    consumer = start(lab, name="a1", group="atomic")
    lab.credit("acc-1", 900)
    wait_until(lambda: count(app, lane["effects_schema"], "SELECT balance FROM accounts WHERE id = 'acc-1'") == 900,
               timeout=30, message="the lane's copy of acc-1 was never credited")
    assert lab.account("acc-1")["actual"] == 0  # the lab's own accounts: no consumer applies to them
    # The consumer reports its counts with its heartbeat (every 0.5 s), not after each message.
    lab.wait_consumer(consumer, lambda c: c["applied"] == 1, "the lane consumer never reported its one applied credit",
                      timeout=10)


def test_default_consumer_output_goes_to_a_log_file(services, lab):
    c1 = start(lab)
    pid = lab.consumer(c1)["pid"]
    lab.post(f"/consumers/{c1}/stop")
    lab.wait_state(c1, "stopped")
    path = services.data_dir / "logs" / f"{lab.lab.name}-consumer-{c1}.log"
    group = lab.lab.group_id("payments")
    # The process's own lines, from its start to its stop, under its pid.
    logged = wait_until(lambda: f"left group {group}" in (text := path.read_text()) and text, timeout=10,
                        message=lambda: f"the consumer's stop never reached its log: {path.read_text()[-2000:]}")
    assert f"consumer[{pid}] c1 of lab {lab.lab.name} joined group {group} (" in logged, logged[-2000:]
    assert f"consumer[{pid}] c1 of lab {lab.lab.name} left group {group}: stopped" in logged, logged[-2000:]


# --- agents of a test's own ------------------------------------------------------------------

HOST = socket.gethostname()


@pytest.fixture
def engine(services):
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    yield engine
    engine.dispose()


def agent_ids(engine, pid: int) -> set[str]:
    with engine.connect() as conn:
        return set(conn.execute(text("SELECT id FROM lab_control.agents WHERE host = :host AND pid = :pid"),
                                {"host": HOST, "pid": pid}).scalars())


@contextmanager
def own_agent(services, log: Path, *, pid_namespace: bool = False, **env: str) -> Iterator[subprocess.Popen]:
    """A lab agent process of this test's own; ``pid_namespace``: in a fresh PID namespace, as in a
    container (its pid there is 1), the same hostname. Stopped with SIGTERM at the end."""
    argv = [sys.executable, "-m", "webapp.agent"]
    if pid_namespace:
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *argv]
    with open(log, "ab") as out:
        process = subprocess.Popen(argv, env=service_env(services, **env), cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        if pid_namespace and process.poll() is None:
            for inner in psutil.Process(process.pid).children():
                inner.send_signal(signal.SIGTERM)  # the agent, pid 1 of its namespace: a graceful stop
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        stop_process(process)


def wait_reported(engine, process: subprocess.Popen, log: Path, pid: int | None = None,
                  besides: set[str] = frozenset()) -> str:
    """The id of the agent ``process`` runs, once it has reported itself."""
    def reported():
        assert process.poll() is None, f"the agent exited with {process.returncode}: {log.read_text()[-3000:]}"
        return next(iter(agent_ids(engine, pid or process.pid) - besides), None)
    # As long as `make run` gives an agent to start (its imports alone take seconds on a loaded machine).
    return wait_until(reported, timeout=AGENT_TIMEOUT,
                      message=lambda: f"the agent never reported: {log.read_text()[-3000:]}")


def command_row(engine, command_id: int) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT c.status, c.error, c.claimed_by, c.lease_expires_at > now() AS leased, "
            "extract(epoch FROM now() - a.heartbeat_at) AS heartbeat_age "
            "FROM lab_control.commands c LEFT JOIN lab_control.agents a ON a.id = c.claimed_by "
            "WHERE c.id = :id"), {"id": command_id}).mappings().one())


def consumer_row(engine, consumer_id: int) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT * FROM lab_control.consumers WHERE id = :id"),
                                 {"id": consumer_id}).mappings().one())


def timeline_summaries(app, lab) -> list[str]:
    with app.app_context(), lab_session(lab.lab.schema) as session:
        return list(session.execute(text("SELECT summary FROM timeline ORDER BY id")).scalars())


@contextmanager
def account_locked(engine, lab, account_id: str = "acc-1") -> Iterator[Callable[[], int]]:
    """Hold a row lock on an account in a transaction of this test's own; yield a function that
    counts the sessions waiting for it. A consumer applying a credit to that account waits, and
    finishes its message (even after SIGTERM) only when the lock is released."""
    with engine.connect() as conn:
        conn.execute(text(f'SELECT 1 FROM "{lab.lab.schema}".accounts WHERE id = :a FOR UPDATE'), {"a": account_id})
        mine = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()

        try:
            yield lambda: sessions_blocked_by(engine, mine)
        finally:
            conn.rollback()


def start_on(engine, lab, agent_id: str, name: str, group: str = "payments") -> int:
    result = command_channel.run(engine, lab.lab.name, "consumer.start", {"group": group, "name": name},
                          agent_id=agent_id, timeout=30)
    lab.wait_assigned(result["consumer_id"])
    return result["consumer_id"]


def kill_if_that_consumer(pid: int | None, consumer_id: int) -> None:
    """Clean-up: SIGKILL a consumer process left behind, if ``pid`` is still that very process."""
    try:
        process = psutil.Process(pid) if pid else None
        if process is not None and str(consumer_id) in process.cmdline() and "webapp.consumer" in process.cmdline():
            process.kill()
    except psutil.Error:
        pass


@pytest.mark.long
def test_the_heartbeat_stays_fresh_while_a_long_group_reset_waits(services, lab, engine, tmp_path):
    """The reset stops the group's consumer first; that consumer waits for a row lock, so its
    graceful stop takes the whole stop timeout (then SIGKILL): a command of 15 s and more. (A
    consumer gives a lock up after a quarter of its max.poll.interval.ms: the lab's is raised to
    120 s, so the lock wait, 30 s, outlasts the stop timeout.)"""
    log = tmp_path / "agent.log"
    with engine.begin() as conn:
        conn.execute(text(f'INSERT INTO "{lab.lab.schema}".settings (key, value) VALUES (\'max_poll_interval_ms\', '
                          "'120000') ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value"))
    with own_agent(services, log) as process, account_locked(engine, lab) as waiting:
        agent_id = wait_reported(engine, process, log)
        consumer_id = start_on(engine, lab, agent_id, "p1")
        lab.credit("acc-1", 100)
        wait_until(waiting, timeout=30, message="the consumer never waited for the locked account")
        command_id = command_channel.enqueue(engine, lab.lab.name, "group.reset", {"group": "payments", "mode": "earliest"},
                                      agent_id)
        wait_until(lambda: command_row(engine, command_id)["status"] == "running", timeout=10,
                   message="the agent never claimed the reset")
        started, ages = time.monotonic(), []
        while (row := command_row(engine, command_id))["status"] == "running":
            assert row["claimed_by"] == agent_id and row["leased"], row
            ages.append(float(row["heartbeat_age"]))
            assert time.monotonic() - started < 60, "the reset never ended"
            time.sleep(0.2)
        assert row["status"] == "done", row
        assert time.monotonic() - started > 10, "the reset was not a long command"
        assert max(ages) < 2.0, f"the heartbeat went stale during the reset: {max(ages):.1f}s"
        assert consumer_row(engine, consumer_id)["agent_id"] == agent_id


def test_the_reaper_fails_a_sigkilled_agents_commands_and_marks_its_consumers_gone(app, services, lab, engine,
                                                                                    tmp_path):
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    consumer_pid = consumer_id = None
    try:
        with account_locked(engine, lab) as waiting:
            with own_agent(services, first_log) as first:
                first_id = wait_reported(engine, first, first_log)
                consumer_id = start_on(engine, lab, first_id, "p1")
                consumer_pid = consumer_row(engine, consumer_id)["pid"]
                lab.credit("acc-1", 100)
                wait_until(waiting, timeout=30, message="the consumer never waited for the locked account")
                reset = command_channel.enqueue(engine, lab.lab.name, "group.reset", {"group": "payments"}, first_id)
                wait_until(lambda: command_row(engine, reset)["status"] == "running", timeout=10,
                           message="the first agent never claimed the reset")
                first.kill()  # mid-command: it waits for its consumer to stop
                first.wait(timeout=10)
                # Addressed to the dead agent after its death: nobody will ever take it.
                freeze = command_channel.enqueue(engine, lab.lab.name, "consumer.freeze", {"consumer_id": consumer_id},
                                          first_id)
            with own_agent(services, second_log) as second:
                second_id = wait_reported(engine, second, second_log)
                reported = time.monotonic()
                assert second_id != first_id

                def reaped():
                    return (command_row(engine, reset)["status"] == "failed"
                            and command_row(engine, freeze)["status"] == "failed"
                            and consumer_row(engine, consumer_id)["state"] == "gone")
                wait_until(reaped, timeout=AGENT_FRESH_SECONDS, interval=0.1,
                           message=lambda: f"not reaped within {AGENT_FRESH_SECONDS:.0f}s of the next agent's start: "
                           f"{command_row(engine, reset)}, {command_row(engine, freeze)}, "
                           f"{consumer_row(engine, consumer_id)['state']}")
                assert time.monotonic() - reported <= AGENT_FRESH_SECONDS
                for command_id in (reset, freeze):
                    error = command_row(engine, command_id)["error"]
                    assert error.startswith(f"agent {first_id} died (no heartbeat for ") and "before finishing" in error
                # The orphan on this host (stuck on the lock, it cannot see its agent die) is killed.
                wait_until(lambda: not psutil.pid_exists(consumer_pid)
                           or psutil.Process(consumer_pid).status() == psutil.STATUS_ZOMBIE, timeout=5,
                           message=f"the orphaned consumer {consumer_pid} still runs")
                assert any(s.startswith(f"p1 is gone: agent {first_id} died") for s in timeline_summaries(app, lab))
                assert lab.consumer(consumer_id)["state"] == "gone"
    finally:
        kill_if_that_consumer(consumer_pid, consumer_id)


def test_an_agent_restarted_with_the_same_host_and_pid_reconciles_the_old_rows(services, lab, engine, tmp_path):
    """As a container restart does: a fresh PID namespace, the agent its pid 1, the same hostname."""
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with own_agent(services, first_log, pid_namespace=True) as first:
        first_id = wait_reported(engine, first, first_log, pid=1, besides=agent_ids(engine, 1))
        assert first_id.startswith(f"{HOST}:1:")
        consumer_id = start_on(engine, lab, first_id, "y1")
        for inner in psutil.Process(first.pid).children():
            inner.kill()  # SIGKILL to the agent: its namespace and consumer die with it
        first.wait(timeout=10)
    assert consumer_row(engine, consumer_id)["state"] == "running"  # nobody recorded the death
    with own_agent(services, second_log, pid_namespace=True) as second:
        second_id = wait_reported(engine, second, second_log, pid=1, besides={first_id})
        assert second_id != first_id and second_id.startswith(f"{HOST}:1:")
        # Reconciled before it reported itself: the old row is deleted (the reaper never deletes a
        # fresh one), its consumer is gone.
        assert first_id not in agent_ids(engine, 1)
        assert consumer_row(engine, consumer_id)["state"] == "gone"
        assert lab.consumer(consumer_id)["state"] == "gone"


def agent_age(engine, agent_id: str) -> float:
    with engine.connect() as conn:
        return float(conn.execute(text("SELECT extract(epoch FROM now() - heartbeat_at) FROM lab_control.agents "
                                       "WHERE id = :id"), {"id": agent_id}).scalar_one())


def test_a_paused_agent_on_this_host_is_slow_not_dead(services, lab, engine, tmp_path):
    """SIGSTOP the whole agent past the freshness window: its process still runs, so the reaper
    neither fails what waits for it nor marks its consumers gone; on SIGCONT it carries on."""
    log = tmp_path / "agent.log"
    with own_agent(services, log) as process:
        agent_id = wait_reported(engine, process, log)
        consumer_id = start_on(engine, lab, agent_id, "s1", group="slow")
        process.send_signal(signal.SIGSTOP)
        try:
            # Whoever waits for a command gives up at its deadline and withdraws it: it never runs late.
            freeze = command_channel.enqueue(engine, lab.lab.name, "consumer.freeze", {"consumer_id": consumer_id}, agent_id)
            with pytest.raises(command_channel.CommandError, match="no lab agent finished command"):
                command_channel.wait_for(engine, freeze, timeout=1)
            assert command_row(engine, freeze)["status"] == "failed"
            assert command_row(engine, freeze)["error"].startswith("withdrawn: ")
            stop = command_channel.enqueue(engine, lab.lab.name, "consumer.stop", {"consumer_id": consumer_id}, agent_id)
            wait_until(lambda: agent_age(engine, agent_id) > AGENT_FRESH_SECONDS + 1.5, timeout=30,
                       message="the paused agent kept beating")
            assert command_row(engine, stop)["status"] == "pending"
            assert consumer_row(engine, consumer_id)["state"] == "running"
        finally:
            process.send_signal(signal.SIGCONT)
        wait_until(lambda: command_row(engine, stop)["status"] == "done", timeout=30,
                   message=lambda: f"the resumed agent never stopped its consumer: {command_row(engine, stop)}")
        assert consumer_row(engine, consumer_id)["state"] == "stopped"


def test_consumer_output_goes_to_the_agents_stdout_with_its_name(app, services, lab, engine, tmp_path):
    log = tmp_path / "agent.log"
    with own_agent(services, log, LAB_LOG_TO_STDOUT="1") as process:
        agent_id = wait_reported(engine, process, log)
        consumer_id = start_on(engine, lab, agent_id, "z1", group="solo")
        command_channel.run(engine, lab.lab.name, "consumer.stop", {"consumer_id": consumer_id}, agent_id=agent_id)
        # A real failure with output: its group is gone when it starts again.
        with app.app_context(), lab_session(lab.lab.schema) as session:
            session.execute(text("DELETE FROM consumer_groups WHERE group_id = :g"), {"g": lab.lab.group_id("solo")})
            session.commit()
        command_channel.run(engine, lab.lab.name, "consumer.restart", {"consumer_id": consumer_id}, agent_id=agent_id)
        lab.wait_state(consumer_id, "failed")
        prefix = f"[{lab.lab.name}/z1] "
        wait_until(lambda: any(line.startswith(prefix) and "is not defined" in line
                               for line in log.read_text().splitlines()), timeout=10,
                   message=lambda: f"no line {prefix!r} in the agent's output: {log.read_text()[-3000:]}")
        assert not (services.data_dir / "logs" / f"{lab.lab.name}-consumer-{consumer_id}.log").exists()
        assert any("z1 exited with code 1; see `docker compose logs consumers`" in s for s in timeline_summaries(app, lab))


WEB_IMPORTS = textwrap.dedent("""
    import importlib, json, pkgutil, sys, traceback
    chains = []

    class Witness:
        def find_spec(self, name, path=None, target=None):
            if name == "confluent_kafka":
                chains.append([f"{f.filename}:{f.lineno}" for f in traceback.extract_stack()
                               if "/webapp/" in f.filename])
            return None
    sys.meta_path.insert(0, Witness())
    import webapp.web
    for module in pkgutil.iter_modules(webapp.web.__path__):
        importlib.import_module(f"webapp.web.{module.name}")
    from webapp import create_app
    create_app({"TESTING": True, "DATABASE_URL": "postgresql://lab@127.0.0.1:9/none", "SECRET_KEY": "x"})
    print(json.dumps({"loaded": "confluent_kafka" in sys.modules, "chains": chains}))
""")


def test_the_web_never_imports_a_kafka_client(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "KAFKA_", "LAB_"))}
    done = subprocess.run([sys.executable, "-c", WEB_IMPORTS], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**env, "LAB_DATA_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["loaded"], f"the web imports confluent_kafka through: {report['chains']}"


def test_an_exit_is_reported_again_until_the_agent_has_recorded_it(tmp_path):
    """A kill carried out while PostgreSQL restarts cannot record its end at once: the pool keeps
    reporting the exited process until the agent forgets it (after writing the consumer's row), so
    the lab never shows a dead consumer running and holding its partitions."""
    from webapp.agent.processes import Child, Pool

    pool = Pool("postgresql://unused", "unused:9092", tmp_path)
    process = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL)
    try:
        pool.children[7] = Child(process, "lab/c7")
        assert pool.reap() == [], "a running process has not ended"
        process.kill()
        process.wait(timeout=10)
        assert pool.reap() == [(7, -signal.SIGKILL)]
        assert pool.reap() == [(7, -signal.SIGKILL)], "not recorded yet: reported again"
        pool.forget(7)
        assert pool.reap() == []
    finally:
        stop_process(process)


def log_reader_processes(agent_pid: int) -> list[psutil.Process]:
    return [child for child in psutil.Process(agent_pid).children()
            if "webapp.logreader" in " ".join(child.cmdline())]


def test_a_lab_reset_holds_the_log_reader_without_restarting_it(agent, lab):
    """The reader's consumer is closed around the topic's re-creation (librdkafka would crash on
    it), by a signal the process acknowledges: the same process mirrors the new topic after."""
    before = wait_until(lambda: log_reader_processes(agent.pid), timeout=15, message="no log reader process")
    lab.credit("acc-1", 100)
    lab.wait(lambda s: s["partitions"] and sum(p["log_end"] for p in s["partitions"]) == 1,
             "the first record is mirrored")
    for partitions in (1, 2, 3):  # back to back (tests/test_logreader.py: a hold asked again at once)
        lab.post("/lab/reset", {"partitions": partitions})
    lab.credit("acc-2", 200)
    lab.wait(lambda s: s["partitions"] and sum(p["log_end"] for p in s["partitions"]) == 1,
             "the record published after the reset is mirrored from the new topic")
    after = log_reader_processes(agent.pid)
    assert [p.pid for p in after] == [p.pid for p in before], "the log reader was restarted, not held"


def test_a_log_reader_that_cannot_acknowledge_a_hold_is_stopped_then_started_again(services, tmp_path):
    from webapp.agent.processes import Sidecar
    sidecar = Sidecar("log reader", "webapp.logreader",
                      service_env(services, PYTHONPATH=str(ROOT)), tmp_path, False, holdable=True)
    sidecar.ensure(now=True)
    try:
        frozen = sidecar.process
        frozen.send_signal(signal.SIGSTOP)  # alive, but it cannot answer
        with sidecar.held(timeout=1.0):
            assert frozen.poll() is not None, "a reader that did not acknowledge still runs during the hold"
        assert sidecar.process is not frozen and sidecar.process.poll() is None, "it was not started again"
        with sidecar.held(timeout=15.0):  # a running reader acknowledges: held, not restarted
            held = sidecar.process
        assert sidecar.process is held and held.poll() is None
    finally:
        sidecar.stop()


def test_two_resets_at_once_share_the_log_readers_hold_and_the_last_lets_it_go(services, tmp_path):
    """Two labs' resets on two command workers hold the reader at once: it is not started again
    (by the first hold's end, nor by the tick's ensure) until the last hold has ended."""
    from webapp.agent.processes import Sidecar
    sidecar = Sidecar("log reader", "webapp.logreader",
                      service_env(services, PYTHONPATH=str(ROOT)), tmp_path, False, holdable=True)
    sidecar.ensure(now=True)
    try:
        frozen = sidecar.process
        frozen.send_signal(signal.SIGSTOP)  # it cannot acknowledge: a hold stops it for the block
        first_holds, first_may_end = threading.Event(), threading.Event()

        def first_reset() -> None:
            with sidecar.held(timeout=1.0):
                first_holds.set()
                first_may_end.wait(30)
        first = threading.Thread(target=first_reset)
        first.start()
        assert first_holds.wait(30), "the first hold never began"
        with sidecar.held(timeout=1.0):
            first_may_end.set()
            first.join(30)
            sidecar.ensure(now=True)  # the agent's tick, meanwhile
            assert sidecar.process is None or sidecar.process.poll() is not None, \
                "the reader was started again while a reset still held it"
        assert sidecar.process is not frozen and sidecar.process.poll() is None, "the last hold did not let it go"
    finally:
        sidecar.stop()


def test_a_stream_of_commands_does_not_hold_off_the_agents_tick(services, lab, engine):
    """A class keeps the agent busy: between two commands it still reaps an exited consumer (and
    snapshots offsets, watches groups), instead of only once the queue is empty."""
    c1 = start(lab)
    lab.wait_assigned(c1)
    pid = lab.consumer(c1)["pid"]
    # A backlog of quick commands (each fails at once: no such consumer), several seconds' worth,
    # queued in one transaction so that the agent finds them all at once.
    with engine.begin() as conn:
        backlog = [command_rows.insert(conn, lab.lab.name, "consumer.thaw", {"consumer_id": 10**9 + n}, None)
                   for n in range(3000)]
    try:
        os.kill(pid, signal.SIGKILL)  # behind the agent's back: only its tick notices
        lab.wait_state(c1, "killed", timeout=5)
        with engine.connect() as conn:
            pending = conn.execute(text("SELECT count(*) FROM lab_control.commands WHERE id = ANY(:ids) "
                                        "AND status IN ('pending', 'running')"), {"ids": backlog}).scalar()
        assert pending > 0, "the backlog ran out first: the test proves nothing (make it longer)"
    finally:
        # The rest of the backlog is withdrawn: the session's agent serves the next tests.
        with engine.begin() as conn:
            conn.execute(text("UPDATE lab_control.commands SET status = 'failed', error = 'withdrawn by the test', "
                              "finished_at = now() WHERE id = ANY(:ids) AND status = 'pending'"), {"ids": backlog})
