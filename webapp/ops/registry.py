"""The operation registry: every control of the lab declared once.

An operation is a name, an argument model (pydantic: types, ranges, choices, defaults and a
description per field) and a function ``(ctx, args) -> dict``. The JSON API routes, the
dashboard's forms, the ``flask lab`` CLI, the scenario steps, the session-log recorder and the
OpenAPI document all come from this table, so a limit or a field lives in one place.

Errors: bad input raises :class:`InvalidRequest` naming the field (from the pydantic error's
location, or raised by the operation itself); unknown ids raise :class:`NotFound`.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from sqlalchemy import Engine

from ..domain.commands import Command
from ..domain.lab import Lab
from ..store.settings_changes import settle

CommandModel = TypeVar("CommandModel", bound=Command)


class InvalidRequest(Exception):
    """Bad input: ``field`` names what to fix, ``message`` says how.

    Not a ValueError on purpose: raised inside a pydantic validator it passes through pydantic
    unchanged, so an operation's own cross-field checks name their field too.
    """

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class Busy(InvalidRequest):
    """The lab is busy with a job that must finish (or be stopped) first: the API answers 409, a
    form shows it at its top. The message says what runs and how to stop it."""

    def __init__(self, message: str):
        super().__init__("busy", message)


class NotFound(LookupError):
    """The request names a consumer, group or command that does not exist."""


class Args(BaseModel):
    """Base of every argument model: unknown keys are ignored (forms carry a CSRF token), and an
    empty form field counts as not given."""
    model_config = ConfigDict(extra="ignore", populate_by_name=True, frozen=True)

    @model_validator(mode="before")
    @classmethod
    def _blank_is_absent(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None and value != ""}
        return data

    def as_command(self, model: type[CommandModel], **overrides: Any) -> CommandModel:
        """The agent's command ``model`` carrying these arguments (the fields given, ``overrides``
        replacing some): for an operation whose command has its fields, validated here already."""
        return model.model_validate({**self.model_dump(exclude_none=True), **overrides})


class NoArgs(Args):
    """The arguments of an operation that takes none (a read of the lab's state, a cancel)."""


@dataclass(frozen=True)
class Context:
    """What an operation works with: the database, the lab, and the app's settings."""
    engine: Engine
    lab: Lab
    config: Mapping[str, Any] = field(default_factory=dict)
    # Set by a caller no request holds open (a guided step): the agent's commands are waited for
    # patiently, and this is told why one has not ended yet (store/command_channel.wait_for).
    waiting: Callable[[str], None] | None = None


@dataclass(frozen=True)
class Operation:
    name: str
    model: type[Args]
    function: Callable[[Context, Any], dict]
    summary: str
    method: str                    # GET for reads, POST for every change
    path: str                      # under /api/v1, Flask syntax: /consumers/<int:consumer_id>/arm
    status: int = 200              # success status of the API
    recorded: bool = True          # appended to the lab's session log (record and replay)
    step: str | None = None        # the scenario step's name, when a scenario may do it
    cli: str | None = None         # the `flask lab` command's name
    tags: tuple[str, ...] = ()
    settles: bool = False          # changes what consumers apply: returns once the running ones saw it

    @property
    def changes_state(self) -> bool:
        return self.method == "POST"

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(part.strip("<>").split(":")[-1] for part in self.path.split("/") if part.startswith("<"))


OPERATIONS: dict[str, Operation] = {}
# Hooks around every state-changing call: ``before(ctx, op) -> token`` and
# ``after(ctx, op, args, token, result)``. The session-log recorder is one (installed by the app).
_before_hooks: list[Callable[[Context, Operation], Any]] = []
_after_hooks: list[Callable[[Context, Operation, dict, Any, dict], None]] = []


def operation(name: str, *, method: str = "POST", path: str, summary: str, status: int = 200,
              recorded: bool | None = None, step: str | None = None, cli: str | None = None,
              tags: tuple[str, ...] = (), settles: bool = False):
    """Declare ``function(ctx, args: Model) -> dict`` as operation ``name``."""
    def declare(function: Callable[[Context, Any], dict]) -> Callable[[Context, Any], dict]:
        model = inspect.signature(function, eval_str=True).parameters["args"].annotation
        if name in OPERATIONS:
            raise ValueError(f"operation {name} is declared twice")
        OPERATIONS[name] = Operation(
            name=name, model=model, function=function, summary=summary, method=method, path=path,
            status=status, recorded=(method == "POST") if recorded is None else recorded, step=step,
            cli=cli if cli is not None else name.replace("_", "-"), tags=tags, settles=settles)
        return function
    return declare


def get(name: str) -> Operation:
    return OPERATIONS[name]


def by_step(step: str) -> Operation | None:
    return next((op for op in OPERATIONS.values() if op.step == step), None)


def add_hooks(before: Callable[[Context, Operation], Any],
              after: Callable[[Context, Operation, dict, Any, dict], None]) -> None:
    """Run ``before`` and ``after`` around every recorded operation (once per pair)."""
    if after not in _after_hooks:
        _before_hooks.append(before)
        _after_hooks.append(after)


# --- validation ----------------------------------------------------------------------------

def validate(op: Operation, raw: Mapping[str, Any]) -> Args:
    """The operation's arguments from ``raw``, or InvalidRequest naming the first bad field."""
    if not isinstance(raw, Mapping):
        raise InvalidRequest("body", "must be a JSON object")
    try:
        return op.model.model_validate(dict(raw))
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        raise InvalidRequest(*describe_error(op.model, first)) from None


def describe_error(model: type[Args], error: Mapping[str, Any]) -> tuple[str, str]:
    """(field, message) for one pydantic error, worded for a person, with the field's limits."""
    loc = [part for part in error.get("loc", ()) if isinstance(part, str)]
    name = field_of(model, loc[0]) if loc else "body"
    info = model.model_fields.get(name)
    kind = error.get("type", "")
    if kind == "missing":
        return name, "is required"
    if kind == "value_error":
        return name, str(error.get("ctx", {}).get("error", error.get("msg", "")))
    if info is not None:
        bounds = _bounds(info)
        choices = _choices(info.annotation)
        if choices:
            return name, f"must be one of {', '.join(map(str, choices))}"
        if kind.startswith("bool"):
            return name, "must be true or false"
        if bounds and info.annotation is float:
            return name, f"must be a number from {bounds[0]} to {bounds[1]}"
        if bounds and (kind.startswith("int") or kind.startswith("greater") or kind.startswith("less")):
            return name, f"must be a whole number from {bounds[0]} to {bounds[1]}"
        if kind == "string_pattern_mismatch":
            from .fields import PATTERN_RULES
            return name, PATTERN_RULES.get(error.get("ctx", {}).get("pattern"), "is not in the expected form")
    return name, str(error.get("msg", "is not valid")).removeprefix("Value error, ")


def field_of(model: type[Args], key: str) -> str:
    """The field a key names: itself, or the field that accepts it as an alias (``account``)."""
    for name, info in model.model_fields.items():
        if key in getattr(info.validation_alias, "choices", ()):
            return name
    return key


def _bounds(info) -> tuple[Any, Any] | None:
    low = high = None
    for item in info.metadata:
        low = getattr(item, "ge", low) if getattr(item, "ge", None) is not None else low
        high = getattr(item, "le", high) if getattr(item, "le", None) is not None else high
    return (low, high) if low is not None and high is not None else None


def _choices(annotation) -> tuple | None:
    from typing import Literal, Union, get_args, get_origin
    origin = get_origin(annotation)
    if origin is Literal:
        return get_args(annotation)
    if origin is Union or str(origin) == "<class 'types.UnionType'>":
        for arg in get_args(annotation):
            found = _choices(arg)
            if found:
                return found
    return None


# --- calling -------------------------------------------------------------------------------

def call(name: str, ctx: Context, raw: Mapping[str, Any] | None = None) -> dict:
    """Validate ``raw`` for operation ``name`` and run it; recorded operations pass the hooks."""
    op = OPERATIONS[name]
    args = validate(op, raw or {})
    return run(op, ctx, args)


def run(op: Operation, ctx: Context, args: Args) -> dict:
    if not op.recorded:
        return _settled(op, ctx, op.function(ctx, args))
    tokens = [hook(ctx, op) for hook in _before_hooks]
    result = _settled(op, ctx, op.function(ctx, args))
    for hook, token in zip(_after_hooks, tokens):
        hook(ctx, op, args.model_dump(mode="json", exclude_none=True), token, result)
    return result


def _settled(op: Operation, ctx: Context, result: dict) -> dict:
    """An operation that changes what consumers apply returns once every running consumer of the
    lab has read it (settings_changes.settle); those that had not in time are named in the result."""
    if op.settles:
        unseen = settle(ctx.engine, ctx.lab)
        if unseen:
            result = {**result, "not_yet_seen_by": unseen}
    return result
