"""The running summaries agree with VERDICT_SQL after any change, folded or not.

On the real PostgreSQL: a lab schema and a lane schema, changed the way their writers change them
(records mirrored, deliveries, payments and ledger rows written, committed offsets moved forward
and back) and the way a person in psql does (rows deleted and updated, a table truncated); after
every change the summary's verdict and accounts are compared with the exact ones, before and
after the folder runs.
"""
from __future__ import annotations

import json
import random
import threading
import uuid

import psycopg
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from webapp.agent.periodic import SummaryFolder
from webapp.domain.lab import Lab
from webapp.domain.waits import wait_until
from webapp.readmodel import verdict, why
from webapp.readmodel.chart import chart_series
from webapp.readmodel.lanes import lanes
from webapp.readmodel.producer_duplicates import producer_duplicates
from webapp.store.connection import connect, sqlalchemy_url
from webapp.store.labs import ensure_schema, seed_accounts
from webapp.store.schema import enter
from webapp.summary import fold, reads, triggers

ACCOUNTS = ["acc-1", "acc-2", "acc-3"]
PARTITIONS = 2


@pytest.fixture
def engine(services):
    engine = create_engine(sqlalchemy_url(services.database_url), pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def schemas(engine, lab_name):
    """A lab schema and one lane schema, each with a group applying to it; dropped afterwards."""
    lab, lane = f"lab_{lab_name}", f"lab_{lab_name}__lane"
    with engine.begin() as conn:
        for schema in (lab, lane):
            ensure_schema(conn, schema)
            seed_accounts(conn, schema)
        enter(conn, lab)
        for group, effects in (("g-lab", lab), ("g-lane", lane)):
            conn.execute(text("INSERT INTO consumer_groups (group_id, strategy, effects_schema) "
                              "VALUES (:g, 'none', :e)"), {"g": group, "e": effects})
            # A committed offset row from the start, in the same transaction: the session's agent
            # snapshots Kafka's offsets of a group it never snapshotted (periodic.snapshot_offsets),
            # and those writes would land in the queue between a test's fold and its look.
            conn.execute(text("INSERT INTO group_offsets (group_id, partition, committed) VALUES (:g, 0, NULL)"),
                         {"g": group})
    yield lab, lane
    with engine.begin() as conn:
        for schema in (lab, lane):
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


@pytest.fixture
def folder(services):
    conn = connect(services.database_url, autocommit=True)
    yield conn
    conn.close()


@pytest.fixture
def only_this_folder(schemas, folder):
    """The test's folder alone folds its lab: the session's agent folds every lab schema with
    something queued, and would fold (or build) between a test's change and its look. The folder
    holds the lab's fold lock for the whole test (a session lock: its own folds take it again)."""
    lab, _ = schemas
    folder.execute("SELECT pg_advisory_lock(hashtextextended('verdict summary ' || %s, 0))", [lab])
    # The agent may have built the new schemas before the lock was taken: unbuilt again, as the
    # tests start from (a fold builds a schema without totals).
    for schema in schemas:
        folder.execute(f'DELETE FROM "{schema}".verdict_totals')
    yield folder
    folder.execute("SELECT pg_advisory_unlock_all()")


@pytest.fixture
def summary_folder(services, only_this_folder):
    """The agent's SummaryFolder on the test's connection (which holds the lab's fold lock, so the
    session's own agent stays out), not started: the test calls ``fold_all`` itself."""
    folder = SummaryFolder(services.database_url)
    folder.conn = only_this_folder
    yield folder
    folder.conn = None  # the test's own, closed by its fixture
    folder.stop()  # joins the thread of its thorough vacuum


class World:
    """The writers of one lab, driven at random: the log reader, consumers, the agent, a person."""

    def __init__(self, conn: psycopg.Connection, lab: str, lane: str, rng: random.Random):
        self.conn, self.lab, self.lane, self.rng = conn, lab, lane, rng
        self.next_offset = [0] * PARTITIONS
        self.transactions: list[str] = []
        self.records: list[dict] = []  # what was mirrored

    def sql(self, schema: str, statement: str, params=()) -> psycopg.Cursor:
        return self.conn.execute(statement.replace("{s}", f'"{schema}"'), params)

    # the log reader
    def mirror(self) -> None:
        partition = self.rng.randrange(PARTITIONS)
        offset = self.next_offset[partition]
        self.next_offset[partition] += 1
        if self.rng.random() < 0.1:
            self.sql(self.lab, 'INSERT INTO {s}.log_records (partition, "offset", value, invalid_reason) '
                     "VALUES (%s, %s, 'not json', 'not JSON')", [partition, offset])
            self.records.append({"partition": partition, "offset": offset, "valid": False})
            return
        if self.transactions and self.rng.random() < 0.3:
            transaction_id = self.rng.choice(self.transactions)  # a resend or a source duplicate
        else:
            transaction_id = f"tx-{uuid.UUID(int=self.rng.getrandbits(128)).hex[:12]}"
            self.transactions.append(transaction_id)
        event_id = (next((r["event_id"] for r in self.records if r.get("transaction_id") == transaction_id), None)
                    if self.rng.random() < 0.5 else None) or str(uuid.UUID(int=self.rng.getrandbits(128)))
        kind = self.rng.choices(["credit", "set_status", "set_balance"], [8, 1, 1])[0]
        account = self.rng.choice(ACCOUNTS)
        first = not any(r.get("transaction_id") == transaction_id for r in self.records)
        self.sql(self.lab, 'INSERT INTO {s}.log_records (partition, "offset", value, event_id, transaction_id, type, '
                 "account_id, amount_cents, status, balance_cents, first_of_transaction, read_at) "
                 "VALUES (%s, %s, '{}', %s, %s, %s, %s, %s, %s, %s, %s, now() - %s * interval '1 second')",
                 [partition, offset, event_id, transaction_id, kind, account,
                  self.rng.randrange(1, 500) if kind == "credit" else None,
                  "BLOCKED" if kind == "set_status" else None,
                  self.rng.randrange(0, 1000) if kind == "set_balance" else None, first, self.when()])
        self.records.append({"partition": partition, "offset": offset, "valid": True, "event_id": event_id,
                             "transaction_id": transaction_id, "type": kind, "account": account})

    # a consumer: a delivery, with its effect when applied
    def deliver(self) -> None:
        schema = self.rng.choice([self.lab, self.lane])
        if not self.records:
            return
        record = self.rng.choice(self.records)
        if not record["valid"]:
            outcome = self.rng.choice(["dead-lettered", "dead-lettered", "applied"])
            self.sql(schema, 'INSERT INTO {s}.deliveries (group_id, consumer, partition, "offset", generation, '
                     "attempt, strategy, outcome) VALUES ('g', 'c1', %s, %s, 1, 1, 'none', %s)",
                     [record["partition"], record["offset"], outcome])
            return
        outcome = self.rng.choice(["applied", "applied", "absorbed"])
        self.sql(schema, 'INSERT INTO {s}.deliveries (group_id, consumer, partition, "offset", generation, attempt, '
                 "event_id, transaction_id, strategy, outcome) VALUES ('g', 'c1', %s, %s, 1, 1, %s, %s, 'none', %s)",
                 [record["partition"], record["offset"], record["event_id"], record["transaction_id"], outcome])
        if outcome == "applied" and record["type"] == "credit":
            if self.rng.random() < 0.3:
                self.sql(schema, "INSERT INTO {s}.ledger (event_id, account_id, amount_cents, recorded_at) "
                         "VALUES (%s, %s, 7, now() - %s * interval '1 second') ON CONFLICT DO NOTHING",
                         [record["event_id"], record["account"], self.when()])
            else:
                self.pay(schema, record["event_id"], record["transaction_id"], record["account"])

    def when(self) -> float:
        """Seconds ago, over the last hour: the chart buckets whole seconds then (and reads its sums)."""
        return self.rng.uniform(0, 3600)

    def pay(self, schema: str, event_id: str, transaction_id: str, account: str) -> None:
        self.sql(schema, "INSERT INTO {s}.payments (event_id, transaction_id, account_id, amount_cents, applied_at) "
                 "VALUES (%s, %s, %s, 100, now() - %s * interval '1 second')",
                 [event_id, transaction_id, account, self.when()])

    # a delivery whose record the reader has not mirrored yet, and an effect by hand
    def ahead_of_the_mirror(self) -> None:
        schema = self.rng.choice([self.lab, self.lane])
        event_id, transaction_id = str(uuid.UUID(int=self.rng.getrandbits(128))), f"tx-ahead-{len(self.records)}"
        partition = self.rng.randrange(PARTITIONS)
        self.sql(schema, 'INSERT INTO {s}.deliveries (group_id, consumer, partition, "offset", generation, attempt, '
                 "event_id, transaction_id, strategy, outcome) VALUES ('g', 'c1', %s, %s, 1, 1, %s, %s, 'none', "
                 "'applied')", [partition, self.next_offset[partition] + 5, event_id, transaction_id])
        if self.rng.random() < 0.5:
            self.pay(schema, event_id, transaction_id, self.rng.choice(ACCOUNTS))
        else:
            self.sql(schema, "INSERT INTO {s}.ledger (event_id, account_id, amount_cents) VALUES (%s, %s, 9)",
                     [event_id, self.rng.choice(ACCOUNTS)])

    def by_hand(self) -> None:
        schema = self.rng.choice([self.lab, self.lane])
        what = self.rng.randrange(7)
        if what == 0:
            # a payment no record explains, for an event a consumer may deliver later (or did)
            events = [r["event_id"] for r in self.records if r["valid"]] or [str(uuid.UUID(int=self.rng.getrandbits(128)))]
            self.pay(schema, self.rng.choice(events), "tx-by-hand", "acc-1")
        elif what == 1:
            self.sql(schema, "DELETE FROM {s}.payments WHERE id = (SELECT min(id) FROM {s}.payments)")
        elif what == 2:
            self.sql(schema, "DELETE FROM {s}.deliveries WHERE id = (SELECT max(id) FROM {s}.deliveries)")
        elif what == 3:
            self.sql(schema, "UPDATE {s}.payments SET transaction_id = 'tx-moved' "
                     "WHERE id = (SELECT max(id) FROM {s}.payments)")
        elif what == 4:
            self.sql(schema, "DELETE FROM {s}.ledger WHERE event_id = (SELECT event_id FROM {s}.ledger ORDER BY event_id LIMIT 1)")
        elif what == 5 and self.rng.random() < 0.3:
            self.sql(schema, "TRUNCATE {s}.payments")
        elif what == 6:
            # A record picked by the seed, not by the server's random(): the same seed, the same world.
            self.sql(self.lab, 'DELETE FROM {s}.log_records WHERE (partition, "offset") = '
                     '(SELECT partition, "offset" FROM {s}.log_records ORDER BY partition, "offset" '
                     'OFFSET floor(%s * (SELECT count(*) FROM {s}.log_records))::bigint LIMIT 1)', [self.rng.random()])

    # the agent's offset snapshot: forward, and back (a reset)
    def commit(self) -> None:
        group = self.rng.choice(["g-lab", "g-lane"])
        partition = self.rng.randrange(PARTITIONS)
        committed = self.rng.randrange(-1, self.next_offset[partition] + 2)
        self.sql(self.lab, "INSERT INTO {s}.group_offsets (group_id, partition, committed) VALUES (%s, %s, %s) "
                 "ON CONFLICT (group_id, partition) DO UPDATE SET committed = EXCLUDED.committed",
                 [group, partition, None if committed < 0 else committed])

    def step(self) -> str:
        action = self.rng.choices([self.mirror, self.deliver, self.commit, self.ahead_of_the_mirror, self.by_hand],
                                  [5, 5, 2, 1, 1])[0]
        action()
        return action.__name__


def judged(engine, lab: str, schema: str, exact: bool) -> tuple[dict, list, bool]:
    with Session(engine) as session:
        session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        enter(session.connection(), schema)
        summarized = reads.verdict_values(session, lab) is not None
        result = verdict.verdict(session, lab, explain=False, exact=exact).as_dict()
        lines = [line.__dict__ for line in verdict.accounts(session, lab, exact=exact)]
    result.pop("anomalies")
    return result, lines, summarized


def assert_agree(engine, lab: str, lane: str, when: str) -> bool:
    summarized_all = True
    for schema in (lab, lane):
        exact, exact_lines, _ = judged(engine, lab, schema, exact=True)
        summary, summary_lines, summarized = judged(engine, lab, schema, exact=False)
        assert summary == exact, f"{schema} {when}: the summary says {summary}, VERDICT_SQL {exact}"
        assert summary_lines == exact_lines, f"{schema} {when}: accounts {summary_lines} vs {exact_lines}"
        summarized_all &= summarized
        if summarized:
            assert_the_applied_twice_listed_agree(engine, lab, schema, exact["transactions_applied_twice"], when)
    with Session(engine) as session:
        enter(session.connection(), lab)
        summary, exact = (producer_duplicates(session, Lab.of_schema(lab), exact=flag) for flag in (False, True))
        assert summary == exact, f"{when}: producer duplicates {summary} vs {exact}"
        summary, exact = (chart_series(session, Lab.of_schema(lab), exact=flag) for flag in (False, True))
        assert summary == exact, f"{when}: the chart {summary} vs {exact}"
        summary, exact = ([(lane.name, lane.balances, lane.first_divergence)
                           for lane in lanes(session, Lab.of_schema(lab), exact=flag)] for flag in (False, True))
        assert summary == exact, f"{when}: the lanes {summary} vs {exact}"
        assert len(summary) == 2, "the lab and its lane"
        DIVERGENCES_SEEN.update(first["what"] for _, _, first in summary if first)
    return summarized_all


def assert_the_applied_twice_listed_agree(engine, lab: str, schema: str, applied_twice: int, when: str) -> None:
    """The "why" list's transactions applied twice, found from the summary: as many as the exact
    verdict counts (up to the limit), each with the effects a scan of every effect counts."""
    journal = f'"{lab}"'
    with Session(engine) as session:
        session.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        enter(session.connection(), schema)
        listed = session.execute(text(reads.APPLIED_TWICE_SQL.format(journal=journal)),
                                 {"limit": why.LIMIT}).all()
        scanned = dict(session.execute(text(why.DOUBLED_SQL.format(journal=journal)), {"limit": 10**6}).all())
    assert len(listed) == min(applied_twice, why.LIMIT), f"{schema} {when}: listed {listed}, {applied_twice} counted"
    assert all(scanned.get(transaction) == effects for transaction, effects in listed), \
        f"{schema} {when}: listed {listed}, scanned {scanned}"


DIVERGENCES_SEEN: set[str] = set()


@pytest.mark.long
@pytest.mark.parametrize("seed", [1, 2, 3, 5])
def test_the_summaries_agree_with_the_verdict_after_every_change(engine, schemas, only_this_folder, seed):
    folder = only_this_folder
    lab, lane = schemas
    rng = random.Random(seed)
    world = World(folder, lab, lane, rng)
    DIVERGENCES_SEEN.clear()
    assert fold.fold_lab(folder, lab) == {lab: "built", lane: "built"}
    summarized_reads = 0
    for number in range(80):
        action = world.step()
        summarized_reads += assert_agree(engine, lab, lane, f"after step {number} ({action}), unfolded")
        if rng.random() < 0.4:
            fold.fold_lab(folder, lab)
            assert_agree(engine, lab, lane, f"after step {number} ({action}), folded")
    fold.fold_lab(folder, lab)
    assert assert_agree(engine, lab, lane, "at the end, folded"), "the last reads did not use the summaries"
    assert summarized_reads > 30, "most reads should have come from the summaries, not the full verdict"
    assert DIVERGENCES_SEEN == {"applied twice", "effect lost"}, "both kinds of first divergence were compared"
    queued = folder.execute(f'SELECT count(*) FROM "{lab}".verdict_changes').fetchone()[0]
    assert queued == 0, "a fold leaves nothing queued"


def test_a_new_schema_is_judged_whole_until_it_is_built_and_a_truncate_asks_for_a_rebuild(engine, schemas,
                                                                                          only_this_folder):
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(7))
    for _ in range(10):
        world.mirror()
    with Session(engine) as session:
        enter(session.connection(), lab)
        assert reads.verdict_values(session, lab) is None, "no totals yet: VERDICT_SQL judges"
    assert fold.fold_lab(folder, lab) == {lab: "built", lane: "built"}
    assert fold.fold_lab(folder, lab) == {lab: "current", lane: "current"}
    world.sql(lane, "TRUNCATE {s}.deliveries")
    with Session(engine) as session:
        enter(session.connection(), lane)
        assert reads.verdict_values(session, lab) is None, "a TRUNCATE: judged whole until rebuilt"
    assert fold.fold_lab(folder, lab) == {lab: "current", lane: "built"}
    assert_agree(engine, lab, lane, "after the rebuild")


def test_only_one_folder_folds_a_lab_at_a_time(services, schemas, folder):
    lab, _ = schemas
    other = connect(services.database_url, autocommit=True)
    try:
        other.execute("SELECT pg_advisory_lock(hashtextextended('verdict summary ' || %s, 0))", [lab])
        assert fold.fold_lab(folder, lab) is None, "a second folder must skip the lab"
        other.execute("SELECT pg_advisory_unlock(hashtextextended('verdict summary ' || %s, 0))", [lab])
        # (The session's agent may be folding it now, for a moment.)
        wait_until(lambda: fold.fold_lab(folder, lab) is not None, timeout=30,
                   message="the lab's fold lock was never free again")
    finally:
        other.close()


def test_the_folder_looks_only_at_labs_with_something_to_fold(schemas, only_this_folder):
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(11))
    assert lab in fold.labs_to_fold(folder), "a lab not built yet waits for its first build"
    fold.fold_lab(folder, lab)
    assert lab not in fold.labs_to_fold(folder), "an idle lab costs nothing"
    world.sql(lane, "INSERT INTO {s}.payments (event_id, transaction_id, account_id, amount_cents) "
              "VALUES (gen_random_uuid(), 'tx-lane', 'acc-1', 5)")
    assert lab in fold.labs_to_fold(folder), "a change in a lane wakes its lab"
    fold.fold_lab(folder, lab)
    world.commit()
    assert lab in fold.labs_to_fold(folder), "a committed offset written wakes the lab"
    fold.fold_lab(folder, lab)
    world.sql(lab, "UPDATE {s}.group_offsets SET committed = committed")
    assert lab not in fold.labs_to_fold(folder), "an offset written again unchanged does not"


def vacuums_of_queue(conn: psycopg.Connection, schema: str) -> int:
    return conn.execute("SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = %s::regclass",
                        [f'"{schema}".verdict_changes']).fetchone()[0]


def test_the_agents_folder_folds_each_lab_and_vacuums_the_queues_it_emptied(schemas, only_this_folder,
                                                                           summary_folder):
    """The agent's folder folds the lab and its lane, says it folded, and vacuums the queues it
    emptied (every read scans a queue's dead rows until then)."""
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(5))
    summary_folder.VACUUM_EVERY = summary_folder.THOROUGH_VACUUM_EVERY = 3600.0
    assert summary_folder.fold_all() >= 1, "the lab's first build is a fold"
    for _ in range(5):
        world.mirror()
    world.sql(lane, "INSERT INTO {s}.payments (event_id, transaction_id, account_id, amount_cents) "
              "VALUES (gen_random_uuid(), 'tx-lane', 'acc-1', 5)")
    before = {schema: vacuums_of_queue(folder, schema) for schema in (lab, lane)}
    assert summary_folder.fold_all() >= 1, "a lab with changes queued is folded (and the next look comes sooner)"
    assert lab not in fold.labs_to_fold(folder)
    assert {schema: vacuums_of_queue(folder, schema) for schema in (lab, lane)} == before, \
        "vacuumed at most once per VACUUM_EVERY"
    summary_folder.VACUUM_EVERY = 0.0
    summary_folder.fold_all()
    wait_until(lambda: all(vacuums_of_queue(folder, schema) > before[schema] for schema in (lab, lane)), timeout=10,
               message=lambda: f"the emptied queues were not vacuumed: {before} then "
                               f"{ {schema: vacuums_of_queue(folder, schema) for schema in (lab, lane)} }")
    queued = folder.execute(f'SELECT count(*) FROM "{lab}".verdict_changes').fetchone()[0]
    assert queued == 0


def queue_pages(conn: psycopg.Connection, schema: str) -> int:
    return conn.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                        [f'"{schema}".verdict_changes']).fetchone()[0]


def queue_then_fold(world: World, folder: psycopg.Connection, lab: str, changes: int) -> None:
    """``changes`` queued rows (a statement's credits, one queue row each), then folded: the
    queue's table is left with that many dead rows, its pages emptied."""
    world.sql(lab, "INSERT INTO {s}.payments (event_id, transaction_id, account_id, amount_cents) "
              "SELECT gen_random_uuid(), 'tx-bulk-' || n, 'acc-1', 1 FROM generate_series(1, %s) n", [changes])
    fold.fold_lab(folder, lab)
    assert folder.execute(f'SELECT count(*) FROM "{lab}".verdict_changes').fetchone()[0] == 0


WAITING_VACUUM = ("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                  "AND wait_event = 'VacuumTruncate'")


@pytest.mark.parametrize("thorough", [False, True], ids=["quick", "thorough"])
def test_only_the_thorough_vacuum_waits_for_a_reader_of_the_queue(services, schemas, only_this_folder, thorough):
    """Giving a table's emptied end back needs its exclusive lock, which VACUUM waits for (up to
    five seconds) while any reader holds the queue, as every panel's read does. The quick vacuum,
    the folder's own, never tries (``TRUNCATE false``); the thorough one does, and without a
    reader gives the pages back."""
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(17))
    fold.fold_lab(folder, lab)  # the first build
    queue_then_fold(world, folder, lab, 2000)
    filled = queue_pages(folder, lab)
    name = f"test vacuum {lab}"
    vacuuming = connect(services.database_url, autocommit=True, application_name=name)
    reader = connect(services.database_url)  # a panel's read, its transaction left open
    errors: list[BaseException] = []

    def vacuum() -> None:
        try:
            fold.vacuum_queues(vacuuming, [lab], thorough=thorough)
        except BaseException as error:  # reported by the test's thread
            errors.append(error)

    try:
        reader.execute(f'SELECT count(*) FROM "{lab}".verdict_changes').fetchone()
        thread = threading.Thread(target=vacuum)
        thread.start()
        if thorough:
            wait_until(lambda: folder.execute(WAITING_VACUUM, [name]).fetchone()[0] == 1, timeout=10,
                       message="the thorough vacuum did not wait for the queue's lock")
            reader.rollback()  # the read ends: the vacuum gets its lock
            thread.join(timeout=30)
            assert queue_pages(folder, lab) < filled, "the thorough vacuum gave the emptied pages back"
        else:
            seen_waiting = False
            while thread.is_alive():
                seen_waiting |= folder.execute(WAITING_VACUUM, [name]).fetchone()[0] > 0
            assert not seen_waiting, "the quick vacuum waited for the queue's lock"
            assert queue_pages(folder, lab) == filled
        thread.join(timeout=30)
        assert not errors, errors
    finally:
        reader.close()
        vacuuming.close()


def test_the_folder_folds_on_while_its_thorough_vacuum_waits_for_a_reader(services, schemas, only_this_folder,
                                                                           summary_folder):
    """A panel's read holds the queue (a lock VACUUM must wait out to shorten the table): the
    thorough vacuum waits on its own thread and connection, and the folder goes on folding."""
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(23))
    summary_folder.VACUUM_EVERY = summary_folder.THOROUGH_VACUUM_EVERY = 0.0
    assert summary_folder.fold_all() >= 1, "the lab's first build is a fold"
    queue_then_fold(world, folder, lab, 2000)
    reader = connect(services.database_url)  # a panel's read, its transaction left open
    try:
        reader.execute(f'SELECT count(*) FROM "{lab}".verdict_changes').fetchone()
        world.mirror()
        assert summary_folder.fold_all() >= 1
        wait_until(lambda: folder.execute(WAITING_VACUUM, ["lab agent queue vacuum"]).fetchone()[0] == 1, timeout=10,
                   message="the thorough vacuum never waited for the queue's lock")
        for _ in range(3):
            world.mirror()
        assert summary_folder.fold_all() >= 1, "folded while the thorough vacuum waits"
        assert lab not in fold.labs_to_fold(folder)
        assert folder.execute(WAITING_VACUUM, ["lab agent queue vacuum"]).fetchone()[0] == 1, \
            "the fold ran while the vacuum still waited"
    finally:
        reader.close()


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def test_a_fold_looks_records_up_by_event_id_alone_before_the_log_has_statistics(schemas, only_this_folder):
    """A new lab's log mirror has no statistics yet (autovacuum has not analyzed it) while a load
    queues thousands of records. With a record's validity tested inside the lookup by event id,
    the planner's default guesses made it AND the event-id index with the whole partial index of
    valid records, once per queued event: a fold of 28,000 queued changes ran for minutes and the
    queue grew without end. The lookup now uses one index."""
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(29))
    fold.fold_lab(folder, lab)
    world.sql(lab, 'INSERT INTO {s}.log_records (partition, "offset", value, event_id, transaction_id, type, '
              "account_id, amount_cents, first_of_transaction, read_at) "
              "SELECT 0, 1000 + n, '{}', gen_random_uuid(), 'tx-load-' || n, 'credit', 'acc-1', 1, true, now() "
              "FROM generate_series(1, 5000) n")
    dirty = ("WITH " + ",".join([triggers.CHANGES, triggers.COMMITTED, triggers.DIRTY])
             .format(journal=f'"{lab}"') + " SELECT key FROM dirty")
    with folder.transaction():
        folder.execute("SELECT set_config('search_path', %s, true)", [lab])
        plan = folder.execute("EXPLAIN (FORMAT JSON) " + dirty).fetchone()[0][0]["Plan"]
    anded = [node for node in plan_nodes(plan) if node["Node Type"] == "BitmapAnd"]
    assert not anded, json.dumps(anded, indent=1)


def test_the_upkeep_analyzes_the_tables_that_outgrew_their_statistics(schemas, only_this_folder):
    """A new lab's tables have no statistics until autovacuum looks (within a minute): the
    folder's upkeep analyzes a table as soon as it changed by more than its statistics hold, and
    leaves the queue alone (it churns by design)."""
    folder = only_this_folder
    lab, lane = schemas
    world = World(folder, lab, lane, random.Random(31))
    world.sql(lab, 'INSERT INTO {s}.log_records (partition, "offset", value, event_id, transaction_id, type, '
              "account_id, amount_cents, first_of_transaction, read_at) "
              "SELECT 0, n, '{}', gen_random_uuid(), 'tx-load-' || n, 'credit', 'acc-1', 1, true, now() "
              "FROM generate_series(1, 1500) n")
    log_records, analyzed = f"{lab}.log_records", []

    def upkeep_analyzed_the_log() -> bool:
        analyzed.extend(fold.analyze_grown_tables(folder, [lab]))
        return log_records in analyzed

    # (the server shows a backend's counts of changed rows within a second)
    wait_until(upkeep_analyzed_the_log, timeout=10,
               message=lambda: f"the log mirror was not analyzed; analyzed: {analyzed}")
    assert f"{lab}.verdict_changes" not in analyzed, "the queue is not analyzed"
    known = folder.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [log_records]).fetchone()[0]
    assert known == 1500
    assert log_records not in fold.analyze_grown_tables(folder, [lab]), "analyzed once"
