"""The generated table of every setting (name, type, default, classroom default, description),
rendered from the model, so the documentation never drifts from what the code reads."""
from __future__ import annotations

from typing import Any, Literal

from annotated_types import Ge, Gt, Le, MinLen
from pydantic.fields import FieldInfo

from .model import LabSettings, classroom_default, value_type

TYPE_NAMES = {int: "integer", float: "number", str: "text", bool: "0 or 1"}


def type_label(field: FieldInfo) -> str:
    """``integer 1–65535``, ``number > 0``, ``0 or 1``, ``kafka, tansu``, ``text``."""
    kind = value_type(field)
    if getattr(kind, "__origin__", None) is Literal:
        return " or ".join(f"`{choice}`" for choice in kind.__args__)
    bounds = {type(rule): rule for rule in field.metadata if isinstance(rule, (Ge, Gt, Le))}
    if kind is int and Ge in bounds and Le in bounds and (bounds[Ge].ge, bounds[Le].le) == (0, 1):
        return "0 or 1"
    label = TYPE_NAMES.get(kind, getattr(kind, "__name__", str(kind)))
    if Ge in bounds and Le in bounds:
        return f"{label} {bounds[Ge].ge}–{bounds[Le].le}"
    if Ge in bounds:
        return f"{label} ≥ {bounds[Ge].ge:,}"
    if Gt in bounds:
        return f"{label} > {bounds[Gt].gt:,}"
    if any(isinstance(rule, MinLen) for rule in field.metadata):
        return f"{label}, not empty"
    return label


def shown(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, int):
        return f"`{value}`" + (f" ({value // 1024:,} KiB)" if value >= 1024 and value % 1024 == 0
                               and value < 1024 * 1024 else
                               f" ({value // (1024 * 1024):,} MiB)" if value >= 1024 * 1024
                               and value % (1024 * 1024) == 0 else "")
    return f"`{value}`"


def cell(text: str) -> str:
    """Markdown table cell text: pipes escaped, one line."""
    return " ".join(text.replace("|", "\\|").split())


def reference_markdown() -> str:
    """Every setting as a Markdown table, in the model's order."""
    lines = ["| setting | type | default | classroom default | meaning |", "|---|---|---|---|---|"]
    for name, field in LabSettings.model_fields.items():
        classroom = classroom_default(field)
        lines.append(" | ".join(["", f"`{name}`", type_label(field), shown(field.default),
                                 shown(classroom) if classroom is not None else "", cell(field.description or ""),
                                 ""]).strip())
    return "\n".join(lines) + "\n"
