"""The agent's command workers (webapp/agent/workers.py) on the real agent, PostgreSQL and broker:
commands of two labs carried out side by side, one lab's one at a time and in their order, and
the guided page saying what its step waits for."""
from __future__ import annotations

import re
from contextlib import contextmanager
from typing import Callable, Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

import support
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.store import command_channel
from webapp.store.connection import sqlalchemy_url


@pytest.fixture
def engine(services):
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    yield engine
    engine.dispose()


@pytest.fixture
def other_lab(app, client, agent, lab_name):
    """A second fresh lab beside the test's ``lab``."""
    name = f"{lab_name}_b"
    driver = support.open_lab(app, name, client)
    try:
        yield driver
    finally:
        support.drop_lab(app, name)


@contextmanager
def journal_held(engine, schema: str) -> Iterator[Callable[[], int]]:
    """Hold the lab's publish journal (``published_events``) in SHARE mode in a transaction of the
    test's own: the agent's publish for that lab produces its record, then waits to journal it, and
    finishes only once the test lets go. Yields a count of the sessions waiting for the lock."""
    with engine.connect() as conn:
        conn.execute(text(f'LOCK TABLE "{schema}".published_events IN SHARE MODE'))
        mine = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()

        try:
            yield lambda: support.sessions_blocked_by(engine, mine)
        finally:
            conn.rollback()


def credit(amount_cents: int) -> dict:
    return {"mode": "normal", "idempotent": True, "type": "credit", "account_id": "acc-1", "amount_cents": amount_cents}


def command(engine, command_id: int) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(text("SELECT status, error, finished_at FROM lab_control.commands WHERE id = :id"),
                                 {"id": command_id}).mappings().one())


def journal(engine, schema: str) -> list[int]:
    """The amounts of the lab's published credits, in the order they were journaled."""
    with engine.connect() as conn:
        return list(conn.execute(text(f'SELECT amount_cents FROM "{schema}".published_events ORDER BY id')).scalars())


def test_a_slow_command_of_one_lab_holds_neither_another_labs_nor_its_own_order(engine, lab, other_lab):
    schema = lab.lab.schema
    with journal_held(engine, schema) as waiting:
        slow = command_channel.enqueue(engine, lab.lab.name, "publish", credit(101))
        after_it = command_channel.enqueue(engine, lab.lab.name, "publish", credit(102))
        wait_until(lambda: waiting() >= 1 and command(engine, slow)["status"] == "running", timeout=30,
                   message=lambda: f"the agent never started the held publish: {command(engine, slow)}")
        # Another lab's publish is carried out beside the held one, in the time a publish takes.
        result = command_channel.run(engine, other_lab.lab.name, "publish", credit(201), timeout=20)
        assert result["records"][0]["offset"] is not None, result
        # The held lab's next command waits for its first: a lab's commands run one at a time.
        assert command(engine, after_it)["status"] == "pending", command(engine, after_it)
        assert command(engine, slow)["status"] == "running"
    assert command_channel.wait_for(engine, slow, timeout=30)["records"]
    assert command_channel.wait_for(engine, after_it, timeout=30)["records"]
    assert command(engine, slow)["finished_at"] <= command(engine, after_it)["finished_at"]
    assert journal(engine, schema) == [101, 102], "the lab's commands were carried out out of their order"
    assert journal(engine, other_lab.lab.schema) == [201]


def test_the_guided_page_says_what_its_step_waits_for(engine, app_factory, agent, lab_name):
    """A guided step whose command waits behind its lab's running one: the page says so, and the step
    completes once the command before it has ended."""
    app = app_factory(LAB_NAME=lab_name)
    client = app.test_client()
    response = client.post("/scenarios/01_naive_double_credit/runs")
    assert response.status_code == 303
    run_page = response.headers["Location"]
    run_id = int(re.search(r"/runs/(\d+)", run_page).group(1))

    def guide() -> str:
        return client.get(run_page + "/guide").get_data(as_text=True)

    assert client.post(run_page + "/next", headers={"HX-Request": "true"}).status_code == 200  # the setup
    wait_until(lambda: 'data-busy="false"' in guide(), timeout=120, message="the guided setup did not finish")
    with engine.connect() as conn:
        run_lab = conn.execute(text("SELECT lab FROM lab_control.scenario_runs WHERE id = :id"), {"id": run_id}).scalar_one()
    try:
        with journal_held(engine, Lab(run_lab).schema) as waiting:
            held = command_channel.enqueue(engine, run_lab, "publish", credit(100))
            wait_until(lambda: waiting() >= 1, timeout=30, message="the agent never started the held publish")
            # Step 1 starts a consumer: its command queues behind the lab's held publish.
            assert client.post(run_page + "/next", headers={"HX-Request": "true"}).status_code == 200
            wait_until(lambda: "1 command of this lab before it" in guide(), timeout=30,
                       message=lambda: f"the page never said why the step waits: {guide()}")
            page = guide()
            assert 'data-busy="true"' in page and "waiting for the lab agent: " in page, page
        assert command_channel.wait_for(engine, held, timeout=30)["records"]
        wait_until(lambda: 'data-busy="false"' in guide(), timeout=60, message="the guided step did not finish")
        page = guide()
        assert "data-waiting" not in page, "the finished step still says it waits"
        assert 'data-step="1" data-status="ok"' in page, page
    finally:
        support.drop_lab(app, run_lab)


@pytest.mark.parametrize("verb, args, field", [
    ("consumer.kill", {}, "consumer_id"),
    ("consumer.freeze", {"consumer_id": "1"}, "consumer_id"),
    ("load.start", {"events": 10, "accounts": "five"}, "accounts"),
    ("group.reset", {"group": "payments", "mode": "sideways"}, "mode"),
])
def test_a_malformed_command_is_rejected_naming_its_field(engine, lab, verb, args, field):
    command_id = command_channel.enqueue(engine, lab.lab.name, verb, args)
    with pytest.raises(command_channel.CommandError) as refused:
        command_channel.wait_for(engine, command_id, timeout=20)
    assert str(refused.value).startswith(f"{field}: "), refused.value
    with engine.connect() as conn:
        kind = conn.execute(text("SELECT result->>'kind' FROM lab_control.commands WHERE id = :id"),
                            {"id": command_id}).scalar_one()
    assert kind == "rejected"
