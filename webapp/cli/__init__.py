"""``flask --app app lab ...`` and ``flask --app app scenario ...``: the lab from a terminal.
May import every room below it (web's db, scenarios, ops, agent's setup, kafka, store, domain).

One command per operation of the registry (``webapp/ops``), its options made from the
operation's argument model, so the CLI takes the same fields, limits and choices as the API and
the forms. They need a running lab agent (``make run`` starts one), except ``reset``, ``init``
and ``agent``, which work without.
"""
from __future__ import annotations

import json
import sys
import typing
from typing import Any

import click
from flask import Flask, current_app
from flask.cli import AppGroup, with_appcontext

from .. import ops
from ..domain.vocabulary import Limits
from ..store import command_channel
from ..store.labs import Lab
from ..web.db import db

lab_cli = AppGroup("lab", help="Drive the Idempotency Lab.")


def _lab() -> Lab:
    """The configured lab; a clear one-line error when there is no database to drive it in."""
    if current_app.config.get("NO_DATABASE"):
        raise click.ClickException(current_app.config["NO_DATABASE"])
    return Lab(current_app.config["LAB_NAME"])


def _show(result) -> None:
    click.echo(json.dumps(result, indent=2, default=str))


def _run(name: str, body: dict[str, Any]) -> None:
    """Run an operation; print its result, or a clear error and exit non-zero."""
    try:
        lab = _lab()
        _show(ops.call(name, ops.Context(db.engine, lab, current_app.config), body))
    except ops.InvalidRequest as error:
        raise click.UsageError(str(error)) from None
    except (ops.NotFound, command_channel.CommandError) as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(1)


@lab_cli.command("reset")
@click.option("--partitions", type=click.IntRange(*Limits.PARTITIONS), default=None, help="partitions of the payments topic")
def reset(partitions):
    """Wipe the lab (tables and topics) and seed 5 accounts."""
    config, lab = current_app.config, _lab()
    partitions = partitions or config["LAB_PARTITIONS"]
    if command_channel.live_agents(db.engine):
        _run("reset_lab", {"partitions": partitions})
        return
    if not config["KAFKA_BOOTSTRAP_SERVERS"]:
        raise click.UsageError("KAFKA_BOOTSTRAP_SERVERS is not set and no lab is running (start one with `make run`)")
    # No agent runs: do the same work in this process.
    from ..agent.setup import reset_lab

    _show(reset_lab(config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"], lab, partitions))


@lab_cli.command("init")
@click.option("--partitions", type=click.IntRange(*Limits.PARTITIONS), default=None, help="partitions of a new payments topic")
def init(partitions):
    """Create the lab if it is missing (tables, topics, seed accounts); keep it if it exists.

    For deployments that start each service on its own (docker compose runs it once, before the
    web app and the agents). When the broker lost the lab's topics but PostgreSQL kept the lab,
    the journal would describe records the log no longer holds: the lab is reset, and says so.
    """
    from ..agent.setup import broker_lost_it, ensure_lab, reset_lab

    config, lab = current_app.config, _lab()
    if not config["KAFKA_BOOTSTRAP_SERVERS"]:
        raise click.UsageError("KAFKA_BOOTSTRAP_SERVERS is not set and no lab is running (start one with `make run`)")
    partitions = partitions or config["LAB_PARTITIONS"]
    services = (config["DATABASE_URL"], config["KAFKA_BOOTSTRAP_SERVERS"])
    if broker_lost_it(*services, lab):
        click.echo(f"the broker holds no {lab.topic} but PostgreSQL kept lab {lab.name}: resetting it", err=True)
        result = {**reset_lab(*services, lab, partitions), "reset": True}
    else:
        result = ensure_lab(*services, lab, partitions)
    _show({"lab": lab.name, **result})


@lab_cli.command("agent")
def agent():
    """Run a lab agent in the foreground (the same as `python -m webapp.agent`)."""
    from ..agent import main
    from ..scenarios.guided import VERB, agent_handler
    sys.exit(main({VERB: agent_handler}))


# --- one command per operation ----------------------------------------------------------------

def _click_type(annotation: Any) -> Any:
    """The click type of a model field: a choice, a whole number, a number, or text."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return click.Choice([str(arg) for arg in args])
    if origin is typing.Union or (origin is not None and type(None) in args):
        return _click_type(next(arg for arg in args if arg is not type(None)))
    return {int: click.INT, float: click.FLOAT}.get(annotation, click.STRING)


def _params(op: ops.Operation) -> list[click.Parameter]:
    params: list[click.Parameter] = []
    for name, info in op.model.model_fields.items():
        if name in op.path_params:
            params.append(click.Argument([name], type=_click_type(info.annotation)))
            continue
        aliases = [alias for alias in getattr(info.validation_alias, "choices", [])
                   if isinstance(alias, str) and alias != name]
        flags = [f"--{alias.replace('_', '-')}" for alias in [name, *aliases]]
        if info.annotation is bool:
            flags = [f"{flags[0]}/--no-{name.replace('_', '-')}"]
            params.append(click.Option(flags, name, default=None, help=info.description))
        else:
            params.append(click.Option(flags, name, type=_click_type(info.annotation), default=None,
                                       help=info.description))
    return params


def _command(op: ops.Operation) -> click.Command:
    def callback(**values: Any) -> None:
        _run(op.name, {name: value for name, value in values.items() if value is not None})
    return click.Command(op.cli, callback=with_appcontext(callback), params=_params(op), help=op.summary + ".")


for _op in ops.OPERATIONS.values():
    if _op.cli:
        lab_cli.add_command(_command(_op))


def init_app(app: Flask) -> None:
    from .explore import explore_cli
    from .housekeeping import register
    from .scenarios import scenario_cli

    register(lab_cli)  # lab list, lab prune
    app.cli.add_command(lab_cli)
    app.cli.add_command(scenario_cli)
    app.cli.add_command(explore_cli)
