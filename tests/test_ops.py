"""The operation registry: one declaration per operation, validation worded for a person, hooks.
Pure logic: no database is touched (validation happens before an operation acts)."""
import pytest

from webapp import ops
from webapp.domain.vocabulary import Limits


@pytest.mark.parametrize("name,body,field,words", [
    ("publish", {"account_id": "acc-1", "amount": "1e309"}, "amount", "from 0.01 to"),
    ("publish", {"account_id": "acc-1", "amount": "NaN"}, "amount", "from 0.01 to"),
    ("publish", {"account_id": "acc-1", "amount": "1.234"}, "amount", "two decimals"),
    ("publish", {"account_id": "acc-1", "amount_cents": True}, "amount_cents", "not true/false"),
    ("publish", {"account_id": "acc-1", "amount": "1", "mode": "burst", "count": 0}, "count", "from 1 to 10000"),
    ("publish", {"amount": "1"}, "account_id", "choose an account"),
    ("publish", {"account_id": "acc-1", "type": "set_balance"}, "balance_cents", "required"),
    ("publish", {"mode": "resend", "event_id": "not-a-uuid"}, "event_id", "UUID"),
    ("start_consumer", {"name": "Bad Name"}, "name", "must start with a letter"),
    ("reset_offsets", {"group": "payments", "mode": "offset"}, "offsets", "partition: offset pairs"),
    ("reset_offsets", {"group": "payments", "mode": "timestamp", "timestamp": "noon"}, "timestamp", "ISO-8601"),
    ("set_ttl", {}, "ttl_seconds", "give ttl_seconds"),
    ("set_ttl", {"ttl_seconds": "soon"}, "ttl_seconds", "a number from 0 to"),
    ("reset_lab", {"partitions": Limits.PARTITIONS[1] + 1}, "partitions", "from 1 to 12"),
    ("arm_fault_proxy", {}, "drop_produce_responses", "both 0 disarms"),
    ("arm", {"consumer_id": 2**40}, "consumer_id", "whole number"),
    # A raw record is bounded: its value, how many headers, each header's name and value.
    ("produce_raw", {"value": "x" * (Limits.RAW_VALUE_CHARACTERS + 1)}, "value", "at most 131072 characters"),
    ("produce_raw", {"headers": {f"h{i}": "v" for i in range(Limits.RAW_HEADERS + 1)}}, "headers",
     "at most 32 headers"),
    ("produce_raw", {"headers": {"n" * (Limits.RAW_HEADER_NAME_CHARACTERS + 1): "v"}}, "headers",
     "longer than 256 characters"),
    ("produce_raw", {"headers": "source: " + "v" * (Limits.RAW_HEADER_VALUE_CHARACTERS + 1)}, "headers",
     "'source': its value is longer than 4096 characters"),
    ("produce_raw", {"headers": {"": "no name"}}, "headers", "a header needs a name"),
])
def test_bad_input_names_the_field_and_says_how_to_fix_it(name, body, field, words):
    with pytest.raises(ops.InvalidRequest) as raised:
        ops.validate(ops.get(name), body)
    assert raised.value.field == field
    assert words in raised.value.message


def test_aliases_keep_the_scenario_files_words():
    args = ops.validate(ops.get("publish"), {"account": "acc-2", "amount": 12.5})
    assert args.command().account_id == "acc-2" and args.command().amount_cents == 1250
    assert ops.validate(ops.get("set_ttl"), {"seconds": 5}).ttl_seconds == 5
    assert ops.validate(ops.get("create_group"), {"name": "g2"}).group == "g2"


def test_an_empty_form_field_counts_as_not_given():
    args = ops.validate(ops.get("publish"), {"account_id": "acc-1", "amount": "3", "transaction_id": "", "count": ""})
    assert args.transaction_id is None and args.count == 10


def test_every_state_changing_operation_is_recorded_and_reads_are_not():
    for op in ops.OPERATIONS.values():
        assert op.recorded == op.changes_state, op.name
        assert op.method in ("GET", "POST")


def test_every_scenario_step_names_one_operation():
    steps = [op.step for op in ops.OPERATIONS.values() if op.step]
    assert len(steps) == len(set(steps))
    assert ops.by_step("kill").name == "kill_consumer"


def test_hooks_run_around_a_recorded_operation(monkeypatch):
    seen = []
    op = ops.Operation(name="probe", model=ops.Args, function=lambda ctx, args: {"done": True},
                       summary="probe", method="POST", path="/probe")
    monkeypatch.setattr(ops.registry, "_before_hooks", [lambda ctx, op: seen.append("before") or "token"])
    monkeypatch.setattr(ops.registry, "_after_hooks",
                        [lambda ctx, op, args, token, result: seen.append(("after", token, result))])
    assert ops.run(op, ops.Context(engine=None, lab=None), ops.Args()) == {"done": True}
    assert seen == ["before", ("after", "token", {"done": True})]


@pytest.mark.parametrize("setting, body, field", [
    ("LAB_MAX_RECORD_VALUE_BYTES", {"value": "é" * 6}, "value"),             # 12 bytes, 6 characters
    ("LAB_MAX_RECORD_HEADERS", {"value": "x", "headers": {f"h{i}": "v" for i in range(11)}}, "headers"),
    ("LAB_MAX_RECORD_HEADER_BYTES", {"value": "x", "headers": {"source": "b" * 5}}, "headers"),
])
def test_a_raw_record_ceiling_set_in_the_environment_reaches_the_operation(app_factory, monkeypatch, setting, body,
                                                                           field):
    monkeypatch.setenv(setting, "10")
    response = app_factory().test_client().post("/api/v1/produce-raw", json=body)
    assert response.status_code == 400, response.get_data(as_text=True)
    error = response.get_json()
    assert error["field"] == field and setting in error["error"] and "10" in error["error"], error
