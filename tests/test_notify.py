"""The external side effect: the notification service as a real process, and real
consumer processes calling it before or after their database commit, crashing around the call.

The service's tests start their own ``python -m webapp.notify``; the consumers call the one the
session's lab agent keeps running as its sidecar. Nothing is mocked: HTTP over loopback, the
service's own tables in PostgreSQL, SIGKILL at the armed crash point.
"""
from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
import uuid

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from support import ROOT, assert_passed, judge_and_drop_run, run_guided, service_env
from webapp import strategies
from webapp.agent.processes import stop_process
from webapp.domain.vocabulary import CRASH_POINTS
from webapp.domain.waits import free_port, port_open, wait_until
from webapp.notify.protocol import KEY_HEADER, REPLAYED_HEADER, message_text
from webapp.store.connection import sqlalchemy_url
from webapp.strategies.notification import NotifySettings, strategy_with
from webapp.web.panels import plan_blocks


@pytest.fixture
def notify_url(services):
    """A notification service process of this test's own, on a free loopback port."""
    port = free_port()
    log = open(services.data_dir / f"notify-{port}.log", "ab")
    process = subprocess.Popen([sys.executable, "-m", "webapp.notify", "--listen", f"127.0.0.1:{port}"],
                               env=service_env(services), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    try:
        wait_until(lambda: port_open("127.0.0.1", port) or process.poll() is not None, timeout=60,
                   message="the notification service never listened")
        assert process.poll() is None, (services.data_dir / f"notify-{port}.log").read_text()[-2000:]
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(process)


@pytest.fixture
def lab_engine(services):
    engine = create_engine(sqlalchemy_url(services.database_url), poolclass=NullPool)
    yield engine
    engine.dispose()


def post(url: str, body: dict | bytes, key: str | None = None) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of one POST /notifications."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **({KEY_HEADER: key} if key is not None else {})}
    request = urllib.request.Request(f"{url}/notifications", data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"{}"), dict(error.headers)


def notice(lab_name: str, account_id: str = "acc-1", amount_cents: int = 1000, event_id: str | None = None) -> dict:
    return {"lab": lab_name, "account_id": account_id, "event_id": event_id or str(uuid.uuid4()),
            "amount_cents": amount_cents, "text": message_text(amount_cents)}


def service_rows(engine, lab) -> dict:
    with engine.connect() as conn:
        schema = lab.lab.schema
        return {
            "delivered": conn.execute(text(f'SELECT count(*) FROM "{schema}".notifications WHERE NOT replayed')).scalar(),
            "replayed": conn.execute(text(f'SELECT count(*) FROM "{schema}".notifications WHERE replayed')).scalar(),
            "keys": [dict(r._mapping) for r in conn.execute(text(
                f'SELECT key, status, replays FROM "{schema}".idempotency_keys ORDER BY key'))],
        }


# --- the service -----------------------------------------------------------------------------

def test_a_repeated_key_gets_the_first_response_and_delivers_nothing_new(notify_url, lab, lab_engine):
    body = notice(lab.lab.name)
    first = post(notify_url, body, key=body["event_id"])
    again = post(notify_url, body, key=body["event_id"])
    assert first[0] == again[0] == 201
    assert again[1] == first[1] and first[1]["notification_id"]
    assert REPLAYED_HEADER not in first[2] and again[2][REPLAYED_HEADER] == "true"
    rows = service_rows(lab_engine, lab)
    assert (rows["delivered"], rows["replayed"]) == (1, 1)
    assert rows["keys"] == [{"key": body["event_id"], "status": 201, "replays": 1}]


def test_without_a_key_every_call_is_a_new_notification(notify_url, lab, lab_engine):
    body = notice(lab.lab.name)
    answers = [post(notify_url, body) for _ in range(2)]
    assert [a[0] for a in answers] == [201, 201]
    assert answers[0][1]["notification_id"] != answers[1][1]["notification_id"]
    assert service_rows(lab_engine, lab) == {"delivered": 2, "replayed": 0, "keys": []}


def test_concurrent_requests_with_one_key_deliver_once(notify_url, lab, lab_engine):
    body = notice(lab.lab.name)
    callers = 8
    start = threading.Barrier(callers)
    answers: list[tuple] = []

    def call():
        start.wait(timeout=10)
        answers.append(post(notify_url, body, key=body["event_id"]))
    threads = [threading.Thread(target=call) for _ in range(callers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(answers) == callers and {a[0] for a in answers} == {201}
    assert len({a[1]["notification_id"] for a in answers}) == 1, answers
    assert sum(a[2].get(REPLAYED_HEADER) == "true" for a in answers) == callers - 1
    rows = service_rows(lab_engine, lab)
    assert (rows["delivered"], rows["replayed"]) == (1, callers - 1)
    assert rows["keys"][0]["replays"] == callers - 1


def without(body: dict, field: str) -> dict:
    return {key: value for key, value in body.items() if key != field}


# Each case: how to spoil a valid notice (a function of it), the key header, the answer and its field.
BAD_INPUT = {
    "not JSON": (lambda valid: b"{not json", None, 400, "body"),
    "not an object": (lambda valid: b"[1, 2]", None, 400, "body"),
    "no lab": (lambda valid: without(valid, "lab"), None, 400, "lab"),
    "no event id": (lambda valid: without(valid, "event_id"), None, 400, "event_id"),
    "true as cents": (lambda valid: {**valid, "amount_cents": True}, None, 400, "amount_cents"),
    "unknown field": (lambda valid: {**valid, "mood": "happy"}, None, 400, "mood"),
    "key too long": (lambda valid: valid, "k" * 256, 400, KEY_HEADER),
    "unknown lab": (lambda valid: {**valid, "lab": "nolab_here"}, None, 404, "lab"),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_answers_4xx_naming_the_field(notify_url, lab, case):
    spoil, key, status, field = BAD_INPUT[case]
    answer = post(notify_url, spoil(notice(lab.lab.name)), key=key)
    assert (answer[0], answer[1].get("field")) == (status, field), answer


def test_a_key_reused_with_another_request_is_refused(notify_url, lab, lab_engine):
    body = notice(lab.lab.name)
    assert post(notify_url, body, key="order-1")[0] == 201
    refused = post(notify_url, {**body, "amount_cents": 2000}, key="order-1")
    assert (refused[0], refused[1]["field"]) == (422, KEY_HEADER)
    assert service_rows(lab_engine, lab)["delivered"] == 1


# --- the plan ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", strategies.NAMES)
def test_the_plan_shows_the_call_where_it_runs(name):
    strategy = strategies.get(name)
    before = strategy_with(strategy, NotifySettings("before-commit", True))
    after = strategy_with(strategy, NotifySettings("after-commit", False))
    assert strategy_with(strategy, NotifySettings()) is strategy
    for shown in (before, after):
        assert set(strategy.points) | {"before-notify", "after-notify-before-commit"} == set(shown.points)
        assert list(shown.points) == [p for p in CRASH_POINTS if p in shown.points]
    # Before the commit: the call is in the effect's transaction (the last one); after it: outside.
    in_transaction = [b for b in plan_blocks(before.plan) if b["transaction"]][-1]["steps"]
    assert [s.kind for s in in_transaction][-3:] == ["point", "http", "point"]
    assert KEY_HEADER in in_transaction[-2].text
    outside = [s for b in plan_blocks(after.plan) if not b["transaction"] for s in b["steps"]]
    call = next(s for s in outside if s.kind == "http")
    assert KEY_HEADER not in call.text.splitlines()[1:3]
    # The SQL a strategy runs is the same with or without the call.
    assert before.statements == after.statements == strategy.statements


# --- consumers calling it ------------------------------------------------------------------------

def notifications(lab) -> dict:
    body = lab.client.get("/api/v1/notifications").get_json()
    return next(a for a in body["accounts"] if a["account_id"] == "acc-1")


def crash_around_the_call(lab, point: str, **setting) -> dict:
    lab.post("/groups/payments/strategy", {"strategy": "eventid-atomic"})
    lab.post("/groups/payments/notification", setting)
    c1 = lab.start_consumer(name="c1")["consumer_id"]
    lab.wait_assigned(c1)
    record = lab.crash_and_restart(c1, point)
    lab.wait(lambda s: all(p["log_end"] for p in s["partitions"] if p["partition"] == record["partition"]),
             "the log reader never saw the credit")
    lab.wait_caught_up(timeout=45)
    return record


@pytest.mark.parametrize("key, delivered, replays", [(False, 2, 0), (True, 1, 1)], ids=["no-key", "key"])
def test_crash_between_the_call_and_the_commit(lab, key, delivered, replays):
    """eventid-atomic keeps the balance right; without the key the customer is told twice."""
    record = crash_around_the_call(lab, "after-notify-before-commit", notify="before-commit", idempotency_key=key)
    account = lab.account("acc-1")
    assert (account["actual"], account["expected"]) == (1000, 1000)
    seen = lab.wait(lambda s: (n := notifications(lab))["sent"] == 2 and n, "the redelivery never called again")
    assert (seen["received"], seen["delivered"], seen["duplicates"], seen["replays"]) == (
        2, delivered, delivered - 1, replays)
    assert seen["sent_with_key"] == (2 if key else 0)
    duplicates = lab.client.get("/api/v1/notifications").get_json()["duplicates"]
    if key:
        assert duplicates == []
    else:
        assert [d["event_id"] for d in duplicates] == [record["event_id"]]
        assert "after-notify-before-commit" in duplicates[0]["why"] and "without an Idempotency-Key" in duplicates[0]["why"]


def test_after_the_commit_a_crash_before_the_call_loses_the_message(lab):
    """At most once: the credit committed, the redelivery absorbed, and nobody told the customer."""
    crash_around_the_call(lab, "before-notify", notify="after-commit", idempotency_key=False)
    account = lab.account("acc-1")
    assert (account["actual"], account["expected"]) == (1000, 1000)
    assert lab.verdict()["redeliveries_absorbed"] == 1
    seen = notifications(lab)
    assert (seen["sent"], seen["received"], seen["delivered"]) == (0, 0, 0)


@pytest.mark.parametrize("mode, undone", [
    ("before-commit", "the transaction rolled back, the message stayed"),
    ("after-commit", "the credit had committed, the offset had not: the record came back")])
def test_the_why_of_a_repeated_message_says_what_the_crash_undid_in_each_mode(mode, undone):
    """After the commit nothing rolled back: only the offset commit was lost (pure logic, no stack)."""
    from webapp.readmodel.notifications import why
    sends = [{"consumer": "c1", "generation": 3, "mode": mode, "keyed": False},
             {"consumer": "c1", "generation": 5, "mode": mode, "keyed": False}]
    sentence = why({"account_id": "acc-1", "event_id": "0123456789abcdef", "delivered": 2}, sends,
                   ["c1 crashed at after-notify-before-commit"])
    assert sentence.endswith(f"in between, c1 crashed at after-notify-before-commit: {undone}"), sentence


def test_set_notification_refuses_bad_input_and_reads_back(lab):
    assert lab.post("/groups/payments/notification", {"notify": "sometimes"}, expect=400)["field"] == "notify"
    assert lab.post("/groups/nosuch/notification", {"notify": "off"}, expect=404)
    done = lab.post("/groups/payments/notification", {"notify": "after-commit", "idempotency_key": True})
    assert done == {"group_id": f"{lab.lab.name}.payments", "notify": "after-commit", "idempotency_key": True}
    groups = lab.client.get("/api/v1/notifications").get_json()["groups"]
    assert [(g["notify"], g["notify_idempotency_key"]) for g in groups] == [("after-commit", True)]



def test_notifications_and_batch_mode_refuse_each_other(lab):
    """Batch mode has no per-credit step for the call: each setting refuses the other instead of not notifying."""
    lab.post("/groups/payments/throughput", {"batch_size": 10})
    refused = lab.post("/groups/payments/notification", {"notify": "before-commit"}, expect=400)
    assert refused["field"] == "notify" and "batch mode" in str(refused)
    lab.post("/groups/payments/throughput", {"batch_size": 1})
    lab.post("/groups/payments/notification", {"notify": "before-commit"})
    refused = lab.post("/groups/payments/throughput", {"batch_size": 10}, expect=400)
    assert refused["field"] == "batch_size" and "notif" in str(refused)


# --- the exercise, click by click ----------------------------------------------------------------

EXERCISE = ROOT / "scenarios" / "13_external_notification_idempotency_key.yaml"


@pytest.mark.long
def test_the_exercise_passes_in_guided_mode(app_factory, agent, lab_name):
    """Each click is a `scenario.step` command the real agent carries out (webapp/scenarios/guided.py)."""
    app = app_factory(LAB_NAME=lab_name)
    run = run_guided(app, EXERCISE)
    assert_passed(run)
    assert {c["label"] for c in run.checks} >= {"acc-1 notifications duplicates", "acc-2 notifications replays"}
    judge_and_drop_run(app_factory, app, run.lab)
