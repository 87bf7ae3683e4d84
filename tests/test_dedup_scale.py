"""Dedup tables at scale: the partitioned layout of processed_events (webapp/strategies/dedup_layout.py) with
a real consumer under eventid-atomic, the TTL as dropped day partitions, the agent's sampler and
the Dedup-at-scale panel; the dedup warm-up on the agent (webapp/agent/warmup.py), its progress and
its cancel. Real PostgreSQL, broker, agent and consumer processes."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from sqlalchemy import text

from webapp.domain.waits import wait_until
from webapp.web.db import db, lab_session


def query(app, lab, sql: str, **params):
    with app.app_context(), lab_session(lab.lab.schema) as session:
        return session.execute(text(sql), params).all()


def start(lab, name="c1") -> int:
    consumer_id = lab.start_consumer(name=name)["consumer_id"]
    lab.wait_assigned(consumer_id)
    return consumer_id


def in_log(lab, record) -> None:
    lab.wait(lambda s: any(p["partition"] == record["partition"] and (p["log_end"] or 0) > record["offset"]
                           for p in s["partitions"]), "the log mirror never read the record")


def warm_up(lab, keys: int, days: int) -> dict:
    """Start a warm-up (it answers at once: the agent inserts the keys) and wait until it is done."""
    started = lab.post("/dedup/warmup", {"keys": keys, "days": days}, expect=201)
    assert started["state"] == "running" and started["keys"] == keys, started

    def finished():
        run = next(r for r in lab.client.get("/api/v1/dedup/warmup").get_json()["runs"] if r["id"] == started["run_id"])
        return run if run["state"] not in ("starting", "running") else None
    run = wait_until(finished, timeout=60, interval=0.1, message=f"warm-up run {started['run_id']} never finished")
    assert (run["state"], run["inserted"]) == ("done", keys), run
    return run


def test_the_warm_up_answers_at_once_and_its_progress_shows_where_the_loads_do(app, lab):
    run = warm_up(lab, 20_000, 2)
    assert query(app, lab, "SELECT count(*) FROM processed_events")[0][0] == 20_000
    page = lab.client.get("/panels/load").get_data(as_text=True)
    assert f'data-warmup="{run["id"]}" data-state="done"' in page and 'data-inserted="20000"' in page


def test_a_warm_up_goes_in_slices_and_stops_after_the_slice_when_cancelled(services, lab, monkeypatch):
    """The agent's thread, here in the test's process on the lab's real schema: a cancel asked before
    it starts stops it after its first slice, with that slice's keys in."""
    from webapp.agent import warmup
    from webapp.store.connection import connect

    monkeypatch.setattr(warmup, "SLICE", 1000)
    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as conn:
        run_id = conn.execute("INSERT INTO warmup_runs (keys, days, state, cancel_requested) "
                              "VALUES (5000, 1, 'running', true) RETURNING id").fetchone()[0]
    run = warmup.WarmupRun(services.database_url, lab.lab, run_id, 5000, 1)
    run.start()
    run.join(30)
    assert not run.is_alive()
    runs = {r["id"]: r for r in lab.client.get("/api/v1/dedup/warmup").get_json()["runs"]}
    assert (runs[run_id]["state"], runs[run_id]["inserted"]) == ("cancelled", 1000), runs[run_id]


def test_the_partitioned_layout_keeps_keys_and_still_absorbs_every_redelivery(app, lab):
    lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    c1 = start(lab)
    first = lab.credit("acc-1", 1000)
    in_log(lab, first)
    lab.wait_caught_up()
    # Refused while a consumer could write to the table.
    refused = lab.client.post("/api/v1/dedup/layout", json={"layout": "partitioned-by-day"})
    assert refused.status_code == 400 and refused.get_json()["field"] == "layout"
    lab.post(f"/consumers/{c1}/stop")
    lab.wait_state(c1, "stopped")
    converted = lab.post("/dedup/layout", {"layout": "partitioned-by-day"})
    assert converted["converted"][lab.lab.schema] == {"keys": 1, "without_event_time": 0}
    # The kept key carries the event's own time, in that day's partition.
    (relkind,), = query(app, lab, "SELECT relkind FROM pg_class WHERE oid = to_regclass('processed_events')")
    assert relkind == "p"
    (partition, same_time), = query(app, lab, (
        "SELECT k.tableoid::regclass::text, k.occurred_at = l.occurred_at::timestamptz FROM processed_events k "
        "JOIN log_records l ON l.event_id = k.event_id"))
    day = datetime.now(timezone.utc).strftime("%Y%m%d")
    assert partition == f"processed_events_p{day}" and same_time
    sql_view = lab.client.get("/panels/sql?strategy=eventid-atomic").get_data(as_text=True)
    assert "ON CONFLICT (event_id, occurred_at) DO NOTHING" in sql_view and "PARTITION BY RANGE (occurred_at)" in sql_view

    # The record before the conversion, redelivered: absorbed by the kept key.
    lab.post(f"/consumers/{c1}/restart")
    lab.wait_assigned(c1)
    lab.post("/groups/payments/reset-offsets", {"mode": "earliest"})
    lab.wait(lambda s: s["verdict"]["redeliveries_absorbed"] == 1, "the redelivery was not absorbed")
    # A crash after the effect, before the offset commit, in the partitioned layout: absorbed too.
    lab.crash_and_restart(c1, "after-effect-before-commit", "acc-1", 500)
    state = lab.wait(lambda s: s["verdict"]["redeliveries_absorbed"] == 2 and s, "the crash's redelivery was not absorbed")
    assert state["verdict"]["duplicates_applied"] == 0
    assert lab.account("acc-1")["actual"] == 1500
    assert query(app, lab, "SELECT count(*) FROM processed_events")[0][0] == 2


def test_a_lab_with_a_lane_is_converted_whole_both_ways(app, lab):
    """Every schema of the lab (its own and each lane's) is rebuilt in one transaction; each
    conversion's scratch table is its own (an OpenAPI run found the second one refused: 503)."""
    lab.post("/groups", {"group": "atomic", "strategy": "eventid-atomic", "lane": "atomic"}, expect=201)
    for layout, relkind in (("partitioned-by-day", "p"), ("plain", "r")):
        converted = lab.post("/dedup/layout", {"layout": layout})["converted"]
        assert set(converted) == {lab.lab.schema, lab.lab.lane_schema("atomic")}, converted
        for schema in converted:
            with app.app_context(), db.engine.connect() as conn:
                kind = conn.execute(text("SELECT relkind FROM pg_class WHERE oid = to_regclass(:t)"),
                                    {"t": f'"{schema}".processed_events'}).scalar_one()
            assert kind == relkind, (schema, layout, kind)


def test_the_ttl_drops_whole_day_partitions_and_reports_its_duration(app, lab):
    lab.post("/dedup/layout", {"layout": "partitioned-by-day"})
    warm_up(lab, 6000, 6)
    before = {name for (name,) in query(app, lab, (
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('processed_events')"))}
    cleaned = lab.post("/ttl/cleanup", {"ttl_seconds": 3 * 86400})
    after = {name for (name,) in query(app, lab, (
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass('processed_events')"))}
    today = datetime.now(timezone.utc).date()
    expired = {f"processed_events_p{today - timedelta(days=n):%Y%m%d}" for n in range(4, 7)}
    assert expired <= before and not expired & after            # whole days past the TTL: dropped
    kept = {f"processed_events_p{today - timedelta(days=n):%Y%m%d}" for n in range(0, 4)}
    assert kept <= after                                         # a day partly inside the TTL stays whole
    remaining = query(app, lab, "SELECT count(*), min(occurred_at) FROM processed_events")[0]
    assert cleaned["deleted"][lab.lab.schema]["processed_events"] == 6000 - remaining[0]
    assert remaining[1] >= datetime.combine(today - timedelta(days=3), datetime.min.time(), timezone.utc)
    (method, ms, removed), = query(app, lab, "SELECT cleanup_method, cleanup_ms, cleanup_removed FROM dedup_scale "
                                             "WHERE table_name = 'processed_events'")
    assert method == "drop-partitions" and ms > 0 and removed == 6000 - remaining[0]
    page = lab.client.get("/panels/dedup_scale").get_data(as_text=True)
    assert "drop-partitions" in page and "partitioned-by-day" in page and "Day partitions" in page


def test_a_plain_cleanup_deletes_and_says_how_long_it_took(app, lab):
    warm_up(lab, 2000, 4)
    cleaned = lab.post("/ttl/cleanup", {"ttl_seconds": 2 * 86400})
    assert 900 <= cleaned["deleted"][lab.lab.schema]["processed_events"] <= 1100   # by processing time, row by row
    (method, ms), = query(app, lab, "SELECT cleanup_method, cleanup_ms FROM dedup_scale WHERE table_name = 'processed_events'")
    assert method == "delete" and ms > 0


def test_the_sampler_measures_rows_sizes_and_insert_latency_while_the_lab_is_active(app, lab):
    warm_up(lab, 3000, 1)
    lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    start(lab)   # an active lab: its consumer reports to the lab
    rows = wait_until(lambda: query(app, lab, (
        "SELECT rows, rows_estimated, table_bytes, index_bytes, insert_p50_ms, insert_p99_ms, insert_samples "
        "FROM dedup_scale WHERE table_name = 'processed_events' AND insert_samples > 0")), timeout=20,
        message="the agent's sampler never measured processed_events")
    count, estimated, table_bytes, index_bytes, p50, p99, samples = rows[0]
    assert count == 3000 and not estimated
    assert table_bytes > 0 and index_bytes > 0 and 0 < p50 <= p99 and samples >= 10
    # The probes were rolled back: no key of theirs is left.
    assert query(app, lab, "SELECT count(*) FROM processed_events")[0][0] == 3000
    page = lab.client.get("/panels/dedup_scale").get_data(as_text=True)
    assert 'data-rows="3000"' in page and f'data-p50="{p50}"' in page


# Exercise 18 as written needs a million synthetic keys (a lab runs it so: `flask --app app scenario
# run 18`); here the same steps at 20,000 keys, the test stack's ceiling, with the waits' figures
# scaled alike.
SCALED_DOWN = {"keys: 1000000": "keys: 20000", "keys: 500000": "keys: 10000", "rows: 1000000": "rows: 20000",
               '"<= 500001"': '"<= 10001"', '">= 999000"': '">= 19900"', '"<= 850000"': '"<= 17000"'}


def test_exercise_18_runs_headless_scaled_down(app_factory, agent, lab_name, tmp_path):
    import json

    from test_scenarios import run_cli

    from support import ROOT

    source = (ROOT / "scenarios" / "18_dedup_at_a_million_keys.yaml").read_text()
    for old, new in SCALED_DOWN.items():
        assert old in source, old
        source = source.replace(old, new)
    scaled = tmp_path / "18_dedup_scaled_down.yaml"
    scaled.write_text(source)
    code, output = run_cli(app_factory(LAB_NAME=lab_name), "run", str(scaled), "--json")
    result = json.loads(output)
    assert result["status"] == "passed" and code == 0, (result["reason"], result["steps"], result["checks"])
    cleanups = [s["observed"] for s in result["steps"] if s["action"] == "ttl_cleanup"]
    assert len(cleanups) == 2 and all("processed_events" in c for c in cleanups)


@pytest.mark.parametrize("name,second", [
    ("eventid-atomic", "absorbed"),
    ("eventid-split", "absorbed"),
    ("insert-first", psycopg.errors.UniqueViolation),  # the consumer records it as absorbed (test_consumer)
])
def test_each_partitioned_variant_claims_event_id_and_event_time_and_repeats_nothing(services, lab, name, second):
    """Each variant on a real partitioned table: the first delivery applies, the same event again is
    absorbed (or violates the key), every statement run is one its plan shows, in order, and its
    crash points are the plain strategy's."""
    from test_strategies import RecordingContext, in_plan_order

    from webapp import strategies
    from webapp.domain import events
    from webapp.store.connection import connect

    lab.post("/dedup/layout", {"layout": "partitioned-by-day"})
    variant, plain = strategies.get(name, partitioned=True), strategies.get(name)
    assert variant is not plain and variant.points == plain.points and variant.name == plain.name
    event = events.credit("acc-1", 1000)
    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as conn:
        first = RecordingContext(conn)
        assert variant.apply(first, event) == "applied"
        assert in_plan_order(variant, first.statements) and "occurred_at" in first.statements[0]
        again = RecordingContext(conn)
        if isinstance(second, str):
            assert variant.apply(again, event) == second
        else:
            with pytest.raises(second):
                variant.apply(again, event)
        (balance,), = conn.execute("SELECT balance FROM accounts WHERE id = 'acc-1'").fetchall()
        keys = conn.execute("SELECT count(*), min(occurred_at) FROM processed_events").fetchone()
    assert balance == 1000 and keys[0] == 1
    assert keys[1] == datetime.fromisoformat(event.occurred_at)


def test_the_scenarios_one_read_of_the_dedup_tables_agrees_with_the_panels(app, lab):
    """observe() reads every dedup table's count and oldest age in one statement (dedup_counts): the
    same figures as the dedup panel's exact count, table by table."""
    from webapp.readmodel.dedup import dedup_counts, dedup_tables
    warm_up(lab, 300, 2)
    with app.app_context(), lab_session(lab.lab.schema) as session:
        panel = {t["table"]: (t["count"], t["oldest_age"]) for t in dedup_tables(session, None, exact=True)}
        counted = {table: (c["rows"], c["oldest_age"]) for table, c in dedup_counts(session).items()}
    assert counted.keys() == panel.keys()
    assert counted["processed_events"][0] >= 300, counted
    for table, (rows, oldest) in counted.items():
        assert rows == panel[table][0], f"{table}: {rows} keys, the panel counts {panel[table][0]}"
        assert (oldest is None) == (panel[table][1] is None), table
        if oldest is not None:
            assert abs(oldest - panel[table][1]) < 5, f"{table}: oldest {oldest} s, the panel {panel[table][1]} s"


def test_the_partitioned_layout_cannot_detach_a_day_concurrently_so_the_ttl_drops_it(services, lab):
    """What exercise 18 says of the drop's lock, held on the lab's own layout: PostgreSQL refuses
    `DETACH PARTITION ... CONCURRENTLY` when the table has a DEFAULT partition (this layout has one)
    and inside a transaction block (the TTL's cleanup runs in one), so the lab's TTL drops a day
    with `DROP TABLE`, which takes an ACCESS EXCLUSIVE lock on the parent."""
    from webapp.store.connection import connect
    from webapp.strategies import dedup_layout

    lab.post("/dedup/layout", {"layout": "partitioned-by-day"})
    with connect(services.database_url, schema=lab.lab.schema, autocommit=True) as conn:
        [day] = [name for (name,) in conn.execute(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "WHERE i.inhparent = to_regclass('processed_events') AND c.relname <> 'processed_events_default' "
            "ORDER BY c.relname LIMIT 1")]
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="default partition"):
            conn.execute(f"ALTER TABLE processed_events DETACH PARTITION {day} CONCURRENTLY")
        with pytest.raises(psycopg.errors.ActiveSqlTransaction, match="transaction block"):
            with conn.transaction():
                conn.execute(f"ALTER TABLE processed_events DETACH PARTITION {day} CONCURRENTLY")
        assert dedup_layout.DROP_PARTITION_SQL.startswith("DROP TABLE ")
