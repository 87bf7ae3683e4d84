"""`flask --app app lab ...`."""
import json

from sqlalchemy import text

from webapp.web.db import lab_session


def test_reset_wipes_tables_and_topics_and_seeds_five_accounts(app, runner, lab):
    lab.credit("acc-1", 700)
    lab.publish(mode="poison")
    assert lab.state()["partitions"] and any(p["log_end"] for p in lab.state()["partitions"])

    result = runner.invoke(args=["lab", "reset", "--partitions", "2"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["partitions"] == 2

    state = lab.state()
    assert [a["id"] for a in state["accounts"]] == ["acc-1", "acc-2", "acc-3", "acc-4", "acc-5"]
    assert all(a["actual"] == 0 and a["expected"] == 0 for a in state["accounts"])
    assert [p["log_end"] for p in state["partitions"]] == [0, 0]
    with app.app_context(), lab_session(lab.lab.schema) as session:
        assert session.execute(text("SELECT count(*) FROM published_events")).scalar() == 0
    # The recreated topic takes new records from offset 0.
    assert lab.credit("acc-1", 100)["offset"] == 0


def test_publish_command_reports_bad_input_clearly(runner, lab):
    result = runner.invoke(args=["lab", "publish", "--account", "acc-9", "--amount", "1"])
    assert result.exit_code != 0
    assert "no account 'acc-9'" in result.output


def test_state_command_prints_json(runner, lab):
    result = runner.invoke(args=["lab", "state"])
    assert result.exit_code == 0
    assert json.loads(result.output)["lab"] == lab.lab.name
