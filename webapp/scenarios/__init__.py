"""Scenarios: the event-replay simulator's exercises, run headless or guided, and recorded sessions.
May import ops, readmodel, strategies, store and domain: a scenario drives the lab only through ops.

- ``marks``: YAML with the line of every key and item, and ``file:line:`` errors;
- ``loader``: the format: steps are operations of the registry (``webapp.ops``), checked by their
  own argument models; ``conditions``: waits and expectations (the format's own);
- ``runner``: runs one against a fresh lab, each step through ``ops.call``;
- ``observe``: what a run waits on and expects, read through the read model's panels and verdict.py;
- ``journal``: record (a registry hook: every operation appended to the lab's session log) and
  replay (the log exported as a scenario);
- ``guided``: one click of the guided mode, carried out by a lab agent (``scenario.step``);
- their terminal commands, ``flask --app app scenario list|run|export|replay``, are the cli room's
  (``webapp/cli/scenarios.py``).
"""
from __future__ import annotations

from pathlib import Path

from .loader import Scenario, ScenarioError, load

BUILT_IN = Path(__file__).resolve().parent.parent.parent / "scenarios"


def built_in() -> list[Path]:
    """The exercises shipped in ``scenarios/``, in their order (file names start with the number)."""
    return sorted(BUILT_IN.glob("*.yaml"))


def find(name_or_path: str) -> Path:
    """A scenario by file path, by file name, by stem, or by its leading number ("1" → 01_*.yaml)."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    for candidate in built_in():
        stem = candidate.stem
        number = stem.split("_", 1)[0]
        if name_or_path in (stem, candidate.name) or (name_or_path.isdigit() and number.isdigit()
                                                       and int(number) == int(name_or_path)):
            return candidate
    names = ", ".join(p.stem for p in built_in())
    raise FileNotFoundError(f"no scenario {name_or_path!r}: give a file, or one of {names}")


__all__ = ["BUILT_IN", "Scenario", "ScenarioError", "built_in", "find", "load"]
