"""The command channel's waiter (webapp/store/command_channel.py) on the real PostgreSQL: it wakes
when an agent's NOTIFY says a command ended, reports a failure as the agent wrote it, and withdraws a
command nobody claimed by the deadline."""
from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from webapp.domain.waits import wait_until
from webapp.store import agents, command_channel
from webapp.store import commands as command_rows
from webapp.store.connection import sqlalchemy_url
from webapp.store.migrations import upgrade


@pytest.fixture(scope="module")
def engine(services):
    """A database of its own, the control schema at head, that no agent serves: nothing but the
    test claims, finishes or reaps its commands."""
    server = services.engine()
    with server.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("DROP DATABASE IF EXISTS command_channel_test"))
        conn.execute(text("CREATE DATABASE command_channel_test"))
    url = make_url(sqlalchemy_url(services.database_url)).set(database="command_channel_test")
    upgrade(url.render_as_string(hide_password=False))
    engine = create_engine(url, poolclass=NullPool)
    yield engine
    engine.dispose()
    with server.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("DROP DATABASE command_channel_test WITH (FORCE)"))
    server.dispose()


def finish_later(engine, command_id: int, end) -> threading.Event:
    """End ``command_id`` as an agent does (its row and the NOTIFY, one transaction) once the waiter
    listens: the returned event is set when it has."""
    ended = threading.Event()

    def agent() -> None:
        # Once the process's listener listens and the waiter has read the row once, only the
        # NOTIFY (or the waiter's own clock) can tell it the command ended.
        listener = command_channel.done_listener(engine)
        wait_until(lambda: listener.looked(command_id), timeout=10, interval=0.05,
                   message="the waiter never listened")
        with engine.begin() as conn:
            end(conn, command_id)
        ended.set()
    threading.Thread(target=agent, daemon=True).start()
    return ended


def test_the_waiter_wakes_on_the_agents_notify_not_on_its_own_clock(engine, monkeypatch):
    # The waiter reads the row again only every 60 s on its own: back well before that, it was woken.
    monkeypatch.setattr(command_channel, "WAKE_EVERY", 60.0)
    command_id = command_channel.enqueue(engine, "t_channel", "lab.ensure", {})
    ended = finish_later(engine, command_id, lambda conn, i: command_rows.finish(conn, i, {"ok": True}))
    started = time.monotonic()
    assert command_channel.wait_for(engine, command_id, timeout=120) == {"ok": True}
    assert ended.is_set()
    assert time.monotonic() - started < 30, "the waiter slept through the NOTIFY until its own next read"


def test_a_failure_comes_back_with_the_agents_reason_and_kind(engine, monkeypatch):
    monkeypatch.setattr(command_channel, "WAKE_EVERY", 60.0)
    command_id = command_channel.enqueue(engine, "t_channel", "consumer.kill", {"consumer_id": 999})
    finish_later(engine, command_id, lambda conn, i: command_rows.fail(conn, i, "no consumer 999", "not found"))
    with pytest.raises(command_channel.CommandNotFound, match="no consumer 999"):
        command_channel.wait_for(engine, command_id, timeout=20)


def test_a_command_nobody_claimed_is_withdrawn_at_the_deadline(engine):
    command_id = command_channel.enqueue(engine, "t_channel", "lab.ensure", {})
    with pytest.raises(command_channel.CommandTimedOut, match="no lab agent finished") as raised:
        command_channel.wait_for(engine, command_id, timeout=0.5)
    assert not isinstance(raised.value, command_channel.CommandStillRunning)
    with engine.connect() as conn:
        status, _, error = command_rows.outcome(conn, command_id)
    assert status == command_rows.FAILED and error.startswith("withdrawn:"), (status, error)


def test_many_waiters_share_the_process_s_one_listening_connection(engine):
    """Thirty attendees' clicks wait at once in the agent: each waiter borrows a connection for one
    read at a time, so a pool of one connection serves twenty of them (a waiter that held its own
    listening connection for the whole wait emptied the agent's pool, and the others timed out)."""
    small = create_engine(engine.url, pool_size=1, max_overflow=0, pool_timeout=5)
    try:
        ids = [command_channel.enqueue(small, "t_channel", "lab.ensure", {}) for _ in range(20)]
        outcomes: dict[int, object] = {}

        def wait(command_id: int) -> None:
            try:
                outcomes[command_id] = command_channel.wait_for(small, command_id, timeout=60)
            except Exception as error:  # noqa: BLE001 - the test reports what each waiter got
                outcomes[command_id] = error
        waiters = [threading.Thread(target=wait, args=(command_id,)) for command_id in ids]
        for waiter in waiters:
            waiter.start()
        listener = command_channel.done_listener(small)
        wait_until(lambda: all(listener.looked(command_id) for command_id in ids), timeout=30,
                   message="not every waiter got to read its command")
        for command_id in ids:
            with small.begin() as conn:
                command_rows.finish(conn, command_id, {"n": command_id})
        for waiter in waiters:
            waiter.join(timeout=60)
        assert outcomes == {command_id: {"n": command_id} for command_id in ids}
    finally:
        small.dispose()


def test_the_listening_connection_closes_once_no_waiter_is_left(engine, monkeypatch):
    """A process that stopped asking holds no connection (nor retries one against a database that
    went away); the next waiter listens again and is woken as before."""
    monkeypatch.setattr(command_channel, "IDLE_EXIT_AFTER", 0.2)
    listener = command_channel.done_listener(engine)

    def listening_connections() -> int:
        with engine.connect() as conn:
            return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND application_name = 'lab command waiter'")).scalar_one()
    for round_ in range(2):
        command_id = command_channel.enqueue(engine, "t_channel", "lab.ensure", {})
        finish_later(engine, command_id, lambda conn, i: command_rows.finish(conn, i, {"round": round_}))
        assert command_channel.wait_for(engine, command_id, timeout=30) == {"round": round_}
        wait_until(lambda: not listener.running and listening_connections() == 0, timeout=10, interval=0.05,
                   message="the listening thread kept its connection with no waiter left")


def test_a_command_whose_lab_is_reset_as_it_ends_still_reaches_its_waiter(engine, monkeypatch):
    # A guided step's click is answered at once and its thread then resets the very lab the command
    # named: the reset must leave a command that just ended for the waiter still to read.
    from webapp.domain.lab import Lab
    from webapp.store.labs import drop_database_state

    monkeypatch.setattr(command_channel, "WAKE_EVERY", 60.0)
    command_id = command_channel.enqueue(engine, "t_channel", "scenario.step", {"run_id": 1})

    def finish_then_reset(conn, i):
        command_rows.finish(conn, i, {"handed_over": True})
        drop_database_state(conn, Lab("t_channel"))
    finish_later(engine, command_id, finish_then_reset)
    assert command_channel.wait_for(engine, command_id, timeout=30) == {"handed_over": True}


def test_a_command_an_agent_claimed_but_did_not_finish_by_the_deadline_is_left_running(engine):
    """Withdrawn only while pending: a claimed command runs on, and the waiter is told so
    (CommandStillRunning), so that it keeps what the command holds (a guided run stays claimed)."""
    command_id = command_channel.enqueue(engine, "t_channel", "lab.ensure", {})
    with engine.begin() as conn:  # claimed as command_rows.claim does, this one by its id
        conn.execute(text("UPDATE lab_control.commands SET status = :running, claimed_by = 'test-agent', "
                          "lease_expires_at = now() + interval '1 minute' WHERE id = :id"),
                     {"running": command_rows.RUNNING, "id": command_id})
    with pytest.raises(command_channel.CommandStillRunning, match="still running"):
        command_channel.wait_for(engine, command_id, timeout=0.5)
    with engine.begin() as conn:
        assert command_rows.outcome(conn, command_id)[0] == command_rows.RUNNING
        command_rows.finish(conn, command_id, {"ok": True})


# --- the claim: a lab's commands one at a time and in order, other labs' beside them -------------

def _no_command_waiting(engine) -> None:
    """Earlier tests of this module leave commands behind; the claim tests start from none waiting."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE lab_control.commands SET status = 'failed', error = 'cleared by a test' "
                          "WHERE status IN ('pending', 'running')"))


def _claim(engine, agent_id: str = "test-agent"):
    with engine.begin() as conn:
        return command_rows.claim(conn, agent_id, 60)


def test_the_claim_gives_a_labs_commands_one_at_a_time_in_order_and_other_labs_beside_them(engine):
    _no_command_waiting(engine)
    a1 = command_channel.enqueue(engine, "t_lab_a", "publish", {"n": 1})
    a2 = command_channel.enqueue(engine, "t_lab_a", "publish", {"n": 2})
    b1 = command_channel.enqueue(engine, "t_lab_b", "publish", {"n": 1})
    first, second = _claim(engine), _claim(engine)
    assert (first.id, second.id) == (a1, b1), "lab b's command waits behind lab a's running one"
    assert _claim(engine) is None, "lab a's second command was claimed while its first ran"
    # A guided click's hand-over only starts the step's thread: it does not wait for the lab's turn.
    hand_over = command_channel.enqueue(engine, "t_lab_a", "scenario.step", {"run_id": 1})
    assert _claim(engine).id == hand_over
    with engine.begin() as conn:
        command_rows.finish(conn, a1, {})
    assert _claim(engine).id == a2


def test_a_command_addressed_to_an_agent_is_not_held_by_another_agents_command_of_the_lab(engine):
    """A reset running on one agent waits for the consumers another agent runs to stop: that stop,
    addressed to the other agent, must not wait for the reset."""
    _no_command_waiting(engine)
    reset = command_channel.enqueue(engine, "t_lab_c", "group.reset", {})
    assert _claim(engine, "agent-one").id == reset
    stop = command_channel.enqueue(engine, "t_lab_c", "consumer.stop", {"consumer_id": 1}, "agent-two")
    assert _claim(engine, "agent-two").id == stop
    # Within one agent the lab's order holds for addressed commands too.
    kill = command_channel.enqueue(engine, "t_lab_c", "consumer.kill", {"consumer_id": 1}, "agent-two")
    assert _claim(engine, "agent-two") is None
    with engine.begin() as conn:
        command_rows.finish(conn, stop, {})
    assert _claim(engine, "agent-two").id == kill


# --- the patient waiter (a guided step) ----------------------------------------------------------

def _live_agent(engine, agent_id: str = "test-agent") -> None:
    with engine.begin() as conn:
        agents.beat(conn, agent_id, "test-host", 1, None)


def test_a_patient_waiter_says_why_it_waits_and_waits_past_its_deadline_while_an_agent_lives(engine):
    _no_command_waiting(engine)
    _live_agent(engine)
    ahead = command_channel.enqueue(engine, "t_other_lab", "lab.reset", {})
    mine = command_channel.enqueue(engine, "t_patient", "publish", {})
    notes: list[tuple[float, str]] = []  # (when, what the waiter said)
    outcome: dict[str, object] = {}
    started = time.monotonic()

    def said(text_: str) -> bool:
        return any(note == text_ for _, note in notes)

    def wait() -> None:
        try:
            outcome["result"] = command_channel.wait_for(engine, mine, timeout=0.5,
                                                         waiting=lambda note: notes.append((time.monotonic(), note)))
        except command_channel.CommandError as error:
            outcome["result"] = error
    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        wait_until(lambda: said("waiting for the lab agent: 1 command of other labs ahead"), timeout=10,
                   message=lambda: f"the waiter never said it was queued: {notes[-3:]}")
        # Still reading (and saying why) at twice its deadline: it waits on, the command left queued.
        wait_until(lambda: any(when > started + 1.0 for when, _ in notes), timeout=10,
                   message="the waiter stopped reading its command")
        assert waiter.is_alive() and not outcome, outcome
        assert _claim(engine).id == ahead and _claim(engine).id == mine
        wait_until(lambda: any(note.startswith("the agent is carrying out publish (started ") for _, note in notes),
                   timeout=10, message=lambda: f"the waiter never said the command runs: {notes[-3:]}")
        with engine.begin() as conn:
            command_rows.finish(conn, mine, {"published": 1})
        waiter.join(timeout=10)
        assert outcome == {"result": {"published": 1}}
    finally:
        with engine.begin() as conn:
            agents.remove(conn, "test-agent")
        waiter.join(timeout=10)


def test_a_patient_waiter_still_ends_on_a_failure_and_without_a_live_agent(engine):
    _no_command_waiting(engine)
    _live_agent(engine)
    try:
        failing = command_channel.enqueue(engine, "t_patient", "publish", {})
        finish_later(engine, failing, lambda conn, i: command_rows.fail(conn, i, "amount: not a number", "rejected"))
        with pytest.raises(command_channel.CommandError, match="amount: not a number"):
            command_channel.wait_for(engine, failing, timeout=30, waiting=lambda note: None)
    finally:
        with engine.begin() as conn:
            agents.remove(conn, "test-agent")
    # No agent alive: past its deadline the patient waiter withdraws the command, as any waiter does.
    orphan = command_channel.enqueue(engine, "t_patient", "publish", {})
    with pytest.raises(command_channel.CommandTimedOut, match="no lab agent finished"):
        command_channel.wait_for(engine, orphan, timeout=0.5, waiting=lambda note: None)
