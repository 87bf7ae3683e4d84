"""A lab's database state (webapp/store/labs.py) on the real PostgreSQL: its drop gives way to a
reader it deadlocks with, and runs again."""
from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from webapp.domain.waits import wait_until
from webapp.store.labs import retrying_deadlocks


@pytest.fixture
def two_tables(services):
    engine = services.engine()
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS deadlock_test CASCADE"))
        conn.execute(text("CREATE SCHEMA deadlock_test"))
        conn.execute(text("CREATE TABLE deadlock_test.a (id int)"))
        conn.execute(text("CREATE TABLE deadlock_test.b (id int)"))
    yield engine
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA IF EXISTS deadlock_test CASCADE"))
    engine.dispose()


def test_a_drop_that_deadlocks_with_a_reader_is_rolled_back_and_run_again(two_tables):
    engine = two_tables
    reader_holds_a = threading.Event()
    drop_pids: list[int] = []
    reader_done: list[str] = []
    attempts: list[int] = []

    def drop_waits_for_a_lock() -> bool:
        with engine.connect() as conn:
            return bool(drop_pids) and conn.execute(text("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = :pid "
                                                         "AND NOT granted)"), {"pid": drop_pids[0]}).scalar()

    def reader() -> None:
        # A panel's read: it holds table a, then needs table b, which the drop holds by then. It
        # asks for b once the drop waits for a: the drop, waiting first, is the one whose
        # deadlock_timeout ends first, and PostgreSQL rolls it back.
        with engine.begin() as conn:
            conn.execute(text("SELECT * FROM deadlock_test.a"))
            reader_holds_a.set()
            wait_until(drop_waits_for_a_lock, timeout=10, interval=0.05, message="the drop never waited for table a")
            conn.execute(text("SELECT * FROM deadlock_test.b"))
        reader_done.append("read both")

    def drop(conn) -> str:
        attempts.append(len(attempts) + 1)
        drop_pids.append(conn.execute(text("SELECT pg_backend_pid()")).scalar())
        conn.execute(text("LOCK TABLE deadlock_test.b IN ACCESS EXCLUSIVE MODE"))
        conn.execute(text("DROP SCHEMA deadlock_test CASCADE"))  # waits for a, held by the reader
        return "dropped"

    thread = threading.Thread(target=reader)
    thread.start()
    assert reader_holds_a.wait(10)
    assert retrying_deadlocks(engine, drop) == "dropped"
    thread.join(timeout=20)
    assert reader_done == ["read both"] and attempts == [1, 2], (reader_done, attempts)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT to_regnamespace('deadlock_test')")).scalar() is None
