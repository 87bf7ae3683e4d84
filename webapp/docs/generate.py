"""The generated parts of the documentation, as Markdown (see the package's docstring)."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import click

from .. import ops
from ..cli import lab_cli
from ..cli.explore import explore_cli
from ..cli.scenarios import scenario_cli
from ..scenarios import built_in, load
from ..scenarios.claims import claims_markdown
from ..scenarios.loader import REFERENCES, SEEDS, STEP_OPERATIONS, Scenario
from ..scenarios.takeaways import takeaways
from ..settings.model import LabSettings
from ..settings.reference import reference_markdown

IMAGES = Path(__file__).resolve().parents[2] / "docs" / "images"
PATH_PARAM = re.compile(r"<(?:\w+:)?(\w+)>")
# click shows an option whose default is "not given" as ``[default: (name)]``: nothing to say.
NO_DEFAULT = re.compile(r"\s*\[default: \(\w+\)\]")


def cell(text: Any) -> str:
    """Markdown table cell text: pipes escaped, one line."""
    return " ".join(str(text).replace("|", "\\|").split())


# --- configuration -----------------------------------------------------------------------------

def setting_names() -> list[str]:
    """Every setting the code reads, in the model's order."""
    return list(LabSettings.model_fields)


def configuration_table() -> str:
    return reference_markdown()


# --- the JSON API ------------------------------------------------------------------------------

def _schema_type(schema: dict[str, Any]) -> str:
    """``integer 1–600``, ``one of `a`, `b` ``, ``boolean``, ``text``: a field's JSON schema for a person."""
    if "anyOf" in schema:
        kinds = [_schema_type(option) for option in schema["anyOf"] if option.get("type") != "null"]
        return " or ".join(dict.fromkeys(kinds))
    if "enum" in schema or "const" in schema:
        return "one of " + ", ".join(f"`{choice}`" for choice in schema.get("enum", [schema.get("const")]))
    kind = {"integer": "integer", "number": "number", "boolean": "boolean", "string": "text",
            "object": "object", "array": "list"}.get(schema.get("type", ""), schema.get("type", "any"))
    low = schema.get("minimum", schema.get("exclusiveMinimum"))
    high = schema.get("maximum", schema.get("exclusiveMaximum"))
    if low is not None and high is not None:
        return f"{kind} {low:,}–{high:,}" if isinstance(low, (int, float)) else kind
    if low is not None:
        return f"{kind} ≥ {low:,}"
    if high is not None:
        return f"{kind} ≤ {high:,}"
    if schema.get("maxLength"):
        return f"{kind}, at most {schema['maxLength']:,} characters"
    return kind


def _fields(op: ops.Operation) -> list[tuple[str, str, str, str]]:
    """(name, type, default, description) of each of the operation's fields."""
    schema = op.model.model_json_schema()
    definitions = schema.get("$defs", {})
    rows = []
    for name, prop in schema.get("properties", {}).items():
        if "$ref" in prop:
            prop = {**definitions.get(prop["$ref"].rsplit("/", 1)[-1], {}), **prop}
        required = name in schema.get("required", [])
        default = "required" if required else (f"`{json.dumps(prop['default'])}`" if prop.get("default") is not None else "")
        rows.append((name, _schema_type(prop), default, prop.get("description", "")))
    return rows


def api_reference() -> str:
    """One section per operation of the registry: method and path, what it does, its fields, and
    the same operation as a CLI command and a scenario step."""
    parts = []
    for op in sorted(ops.OPERATIONS.values(), key=lambda o: (o.path, o.method)):
        path = PATH_PARAM.sub(r"{\1}", op.path)
        parts.append(f"### `{op.method} /api/v1{path}`\n")
        also = [f"operation `{op.name}`", f"CLI `flask --app app lab {op.cli}`"]
        if op.step:
            also.append(f"scenario step `{op.step}`")
        parts.append(f"{op.summary[0].upper() + op.summary[1:]}. ({'; '.join(also)}.) Success: `{op.status}`.\n")
        fields = _fields(op)
        if fields:
            where = ("path" if name in op.path_params else "body" if op.changes_state else "query"
                     for name, *_ in fields)
            parts.append("| field | in | type | default | meaning |\n|---|---|---|---|---|")
            parts += [f"| `{name}` | {place} | {cell(kind)} | {cell(default)} | {cell(meaning)} |"
                      for (name, kind, default, meaning), place in zip(fields, where)]
            parts.append("")
    return "\n".join(parts)


# --- the command line --------------------------------------------------------------------------

def _command_section(prefix: str, name: str, command: click.Command) -> str:
    context = click.Context(command, info_name=f"{prefix} {name}")
    lines = [f"### `{prefix} {name}`\n", f"```\n{command.get_usage(context)}\n```\n"]
    if command.help:
        lines.append(command.help.split("\n\n")[0].strip() + "\n")
    rows = [param.get_help_record(context) for param in command.get_params(context)
            if not isinstance(param, click.Argument)]
    arguments = [param.human_readable_name for param in command.params if isinstance(param, click.Argument)]
    if arguments:
        lines.append("Arguments: " + ", ".join(f"`{argument}`" for argument in arguments) + ".\n")
    rows = [row for row in rows if row and not row[0].startswith("--help")]
    if rows:
        lines.append("| option | meaning |\n|---|---|")
        lines += [f"| `{cell(option)}` | {cell(NO_DEFAULT.sub('', meaning))} |" for option, meaning in rows]
        lines.append("")
    return "\n".join(lines)


def cli_reference() -> str:
    """Every `flask lab`, `flask scenario` and `flask explore` command with its options, from the click commands the
    CLI builds out of the operation registry."""
    parts = ["## `flask --app app lab`\n"]
    parts += [_command_section("flask --app app lab", name, command)
              for name, command in sorted(lab_cli.commands.items())]
    parts.append("## `flask --app app scenario`\n")
    parts += [_command_section("flask --app app scenario", name, command)
              for name, command in sorted(scenario_cli.commands.items())]
    parts.append("## `flask --app app explore`\n")
    parts += [_command_section("flask --app app explore", name, command)
              for name, command in sorted(explore_cli.commands.items())]
    return "\n".join(parts)


# --- the scenario steps ------------------------------------------------------------------------

def step_table() -> str:
    """Every scenario step: the operation it runs and the keys a file may give it (a field's name,
    or one of its aliases; a consumer or an event by the name a file gave it)."""
    lines = ["| step | operation | arguments |", "|---|---|---|"]
    for step, op in sorted(STEP_OPERATIONS.items()):
        arguments = []
        for name, info in op.model.model_fields.items():
            if name in REFERENCES:
                arguments.append(f"`{REFERENCES[name]}` (a name)")
                continue
            alias = info.validation_alias
            aliases = [key for key in (getattr(alias, "choices", None) or ([alias] if isinstance(alias, str) else []))
                       if isinstance(key, str) and key != name]
            arguments.append(f"`{name}`" + (" (or " + ", ".join(f"`{key}`" for key in aliases) + ")" if aliases else ""))
        lines.append(f"| `{step}` | `{op.name}` | {cell(', '.join(arguments)) or 'none'} |")
    return "\n".join(lines) + "\n"


# --- the exercises -----------------------------------------------------------------------------

def exercises() -> list[Scenario]:
    return [load(path) for path in built_in()]


def exercise_path(scenario: Scenario) -> str:
    """The page's path under docs/: ``exercises/01_naive_double_credit.md``."""
    return f"exercises/{scenario.name}.md"


def exercise_list() -> str:
    """The exercises as a table: number, title, what it shows (linked from docs/exercises/index.md)."""
    lines = ["| exercise | what it shows |", "|---|---|"]
    lines += [f"| [{cell(s.title)}]({s.name}.md) | {cell(s.summary)} |" for s in exercises()]
    return "\n".join(lines) + "\n"


def _expectation(e) -> str:
    return f"- {cell(e.label)}: **{cell(e.wanted)}**"


def exercise_page(scenario: Scenario) -> str:
    """An exercise sheet: the lesson, the source passages, what to click, what the verdict shows.
    Printable as it is (the theme hides the navigation when printing)."""
    number = scenario.name.split("_", 1)[0].lstrip("0")
    lines = [f"# {scenario.title}\n"]
    if scenario.summary:
        lines.append(f"*{scenario.summary}*\n")
    if scenario.name in takeaways():
        lines.append(f"**To keep:** {takeaways()[scenario.name]}\n")
    lines.append(f"Run it: in the lab, **Exercises** → *{scenario.title}* → **Start**, then **Prepare a fresh "
                 f"lab** and **Next step** for each step below ([open the exercises in the lab](/scenarios/)); "
                 f"or headless, `.venv/bin/flask --app app scenario run {number}`. "
                 f"File: `scenarios/{scenario.name}.yaml`.\n")
    if scenario.requires:
        lines.append("Needs of the broker: " + ", ".join(f"`{r}`" for r in scenario.requires)
                     + " (reported *not run* where the broker lacks it).\n")
    lines.append("## The lesson\n")
    lines.append(scenario.narrative.strip() + "\n")
    if scenario.sources:
        lines.append("## The source passages\n")
        for source in scenario.sources:
            seed = SEEDS.get(source["seed"], source["seed"])
            why = f" · {source['why']}" if source.get("why") else ""
            if source.get("paraphrase"):  # not the source's words: said so, never set as a quote
                lines.append(f"In other words: {source['quote']} (paraphrasing {seed}{why})\n")
                continue
            gloss = f"\n>\n> *{source['gloss']}*" if source.get("gloss") else ""
            lines.append(f"> {source['quote']}{gloss}\n>\n> — {seed}{why}\n")
    lines.append("## What to click\n")
    groups = "; ".join(f"group `{g.name}` with `{g.strategy}`" + (f" (lane `{g.lane}`: its own copy of the "
                                                                    f"accounts)" if g.lane else "")
                       for g in scenario.groups)
    lines.append(f"The first click (*Prepare a fresh lab*) sets the lab up, a run's own lab or, in a class, the "
                 f"attendee's own lab, reset: {scenario.partitions} partition(s); {groups}. Then:\n")
    for step in scenario.steps:
        text = f"{step.index}. {step.describe()}"
        if step.note:
            text += "  \n   " + " ".join(step.note.split())
        if step.refused:
            text += f"  \n   Expected: refused, with a message that says {step.refused}"
        lines.append(text)
    lines.append("")
    lines.append("## What the verdict shows\n")
    lines.append("The last click checks each expectation against what the lab observed "
                 "(green when it held, red with the observed value when it did not):\n")
    lines += [_expectation(e) for e in scenario.expectations]
    lines.append("")
    screenshot = IMAGES / f"exercise-{number}-verdict.png"
    if screenshot.is_file():  # taken by `make screenshots` (webapp/dev/screenshots.py)
        lines.append(f"![{cell(scenario.title)}: the run after its last step](../images/{screenshot.name})\n")
    return "\n".join(lines)


# --- every generated block, by the name a page gives it ----------------------------------------

BLOCKS = {
    "settings": configuration_table,
    "api": api_reference,
    "cli": cli_reference,
    "exercises": exercise_list,
    "steps": step_table,
    "claims": claims_markdown,
}
