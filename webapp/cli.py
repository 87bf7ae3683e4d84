"""``flask --app app lab ...``: the lab's controls from a terminal.

Commands go through the same operations as the API and the dashboard; they need a running
lab agent (``make run`` starts one), except ``reset`` and ``agent`` which work without.
"""
from __future__ import annotations

import json
import sys

import click
from flask import Flask, current_app
from flask.cli import AppGroup

from . import commands, operations
from .db import db
from .labs import Lab

lab_cli = AppGroup("lab", help="Drive the Idempotency Lab.")


def _lab() -> Lab:
    return Lab(current_app.config["LAB_NAME"])


def _show(result) -> None:
    click.echo(json.dumps(result, indent=2, default=str))


def _run(operation, *args) -> None:
    """Run an operation; print its result, or a clear error and exit non-zero."""
    try:
        _show(operation(db.engine, _lab(), *args))
    except operations.InvalidRequest as error:
        raise click.UsageError(str(error)) from None
    except (operations.NotFound, commands.CommandError) as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


@lab_cli.command("reset")
@click.option("--partitions", type=click.IntRange(1, 12), default=None, help="partitions of the payments topic")
def reset(partitions):
    """Wipe the lab (tables and topics) and seed 5 accounts."""
    from .supervisor import Supervisor

    config = current_app.config
    partitions = partitions or config["LAB_PARTITIONS"]
    if commands.live_agents(db.engine):
        _run(operations.reset_lab, {"partitions": partitions})
        return
    if not config["KAFKA_BOOTSTRAP_SERVERS"]:
        raise click.UsageError("KAFKA_BOOTSTRAP_SERVERS is not set and no lab is running (start one with `make run`)")
    # No agent runs: do the same work in this process.
    agent = Supervisor(config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"], data_dir=config["LAB_DATA_DIR"])
    try:
        _show(agent.reset_lab(_lab(), {"partitions": partitions}))
    finally:
        agent.shutdown()


@lab_cli.command("init")
@click.option("--partitions", type=click.IntRange(1, 12), default=None, help="partitions of a new payments topic")
def init(partitions):
    """Create the lab if it is missing (tables, topics, seed accounts); keep it if it exists.

    For deployments that start each service on its own (docker compose runs it once, before the
    web app and the agents). When the broker lost the lab's topics but PostgreSQL kept the lab,
    the journal would describe records the log no longer holds: the lab is reset, and says so.
    """
    from .labs import ensure_control_schema
    from .supervisor import Supervisor

    config = current_app.config
    if not config["KAFKA_BOOTSTRAP_SERVERS"]:
        raise click.UsageError("KAFKA_BOOTSTRAP_SERVERS is not set and no lab is running (start one with `make run`)")
    with db.engine.begin() as conn:
        ensure_control_schema(conn)
    lab = _lab()
    args = {"partitions": partitions or config["LAB_PARTITIONS"]}
    agent = Supervisor(config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"], data_dir=config["LAB_DATA_DIR"])
    try:
        result = agent.ensure_lab(lab, args)
        if lab.topic in result["created_topics"] and not result["created_schema"]:
            click.echo(f"the broker holds no {lab.topic} but PostgreSQL kept lab {lab.name}: resetting it", err=True)
            result = {**agent.reset_lab(lab, args), "reset": True}
    finally:
        agent.shutdown()
    _show({"lab": lab.name, **result})


@lab_cli.command("agent")
def agent():
    """Run a lab agent (supervisor) in the foreground."""
    from . import supervisor
    sys.exit(supervisor.main())


@lab_cli.command("state")
def show_state():
    """Print accounts, verdict, consumers and partitions as JSON."""
    client = current_app.test_client()
    _show(client.get("/api/v1/state").get_json())


@lab_cli.command("publish")
@click.option("--type", "type_", type=click.Choice(["credit", "set_status"]), default="credit")
@click.option("--account", "account_id", default="acc-1")
@click.option("--amount", default="100.00", help="currency units, like 12.50")
@click.option("--status", default=None)
@click.option("--mode", type=click.Choice(["normal", "burst", "resend", "source-duplicate", "poison"]), default="normal")
@click.option("--count", type=int, default=10, help="events in a burst")
@click.option("--event-id", default=None, help="the event to resend or duplicate (default: the newest)")
@click.option("--idempotent/--no-idempotent", default=True, help="enable.idempotence on the producer")
def publish(type_, account_id, amount, status, mode, count, event_id, idempotent):
    """Publish payment events."""
    _run(operations.publish, {"type": type_, "account_id": account_id, "amount": amount, "status": status,
                              "mode": mode, "count": count, "event_id": event_id, "idempotent": idempotent})


@lab_cli.command("consumer")
@click.argument("action", type=click.Choice(["start", "kill", "freeze", "thaw", "stop", "restart", "step"]))
@click.argument("consumer_id", type=int, required=False)
@click.option("--group", default="payments")
@click.option("--strategy", default=None)
@click.option("--name", default=None)
def consumer(action, consumer_id, group, strategy, name):
    """Start a consumer, or act on one by id."""
    if action == "start":
        _run(operations.start_consumer, {"group": group, "strategy": strategy, "name": name})
    elif consumer_id is None:
        raise click.UsageError(f"{action} needs a CONSUMER_ID")
    elif action == "step":
        _run(operations.step, consumer_id)
    else:
        _run(operations.consumer_action, consumer_id, action)


@lab_cli.command("arm")
@click.argument("consumer_id", type=int)
@click.argument("point", required=False)
@click.option("--action", type=click.Choice(["crash", "freeze"]), default="crash")
@click.option("--always", is_flag=True, help="every time, not once")
def arm(consumer_id, point, action, always):
    """Arm a crash point on a consumer (no POINT: disarm)."""
    _run(operations.arm, consumer_id, {"point": point, "action": action, "always": always})


@lab_cli.command("strategy")
@click.argument("group")
@click.argument("strategy")
def strategy(group, strategy):
    """Switch a group's deduplication strategy."""
    _run(operations.set_strategy, group, {"strategy": strategy})


@lab_cli.command("reset-offsets")
@click.argument("group")
@click.option("--mode", type=click.Choice(["earliest", "offset", "back", "timestamp"]), default="earliest")
@click.option("--back", type=int, default=None)
@click.option("--offsets", default=None, help='JSON, like {"0": 3}')
@click.option("--timestamp", default=None)
def reset_offsets(group, mode, back, offsets, timestamp):
    """Move a group's committed offsets (stops and restarts its consumers)."""
    _run(operations.reset_offsets, group, {"mode": mode, "back": back, "offsets": offsets, "timestamp": timestamp})


@lab_cli.command("ttl-cleanup")
@click.option("--ttl-seconds", type=float, default=None)
def ttl_cleanup(ttl_seconds):
    """Delete dedup keys older than the TTL now."""
    _run(operations.ttl_cleanup, {} if ttl_seconds is None else {"ttl_seconds": ttl_seconds})


@lab_cli.command("lost-ack")
@click.argument("count", type=click.IntRange(0, operations.MAX_DROPPED_RESPONSES))
@click.option("--delay-ms", type=click.IntRange(0, operations.MAX_RESPONSE_DELAY_MS), default=0,
              help="also hold every Produce response this long")
def lost_ack(count, delay_ms):
    """Arm the fault proxy: drop the next COUNT Produce responses (0 disarms)."""
    _run(operations.arm_fault_proxy, {"drop_produce_responses": count, "delay_ms": delay_ms})

def init_app(app: Flask) -> None:
    from .scenarios.cli import scenario_cli

    app.cli.add_command(lab_cli)
    app.cli.add_command(scenario_cli)
