"""What the seeds claim, and where the lab shows it: the table from each claim of the two source
texts to the exercise that shows it and the tests that prove it.

One data file, ``claims.yaml`` beside this module, is the only copy: the guided mode's exercise
list (webapp/web/scenarios.py) and the documentation's Concepts page (webapp/docs/) both render
:func:`claims_markdown`, so the two can never disagree.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

CLAIMS_FILE = Path(__file__).resolve().parent / "claims.yaml"


@dataclass(frozen=True)
class Claim:
    claim: str        # Markdown: the claim, with the source passage quoted exactly
    exercises: str    # the exercise numbers, with what to look at
    tests: str        # Markdown: the tests that prove it


@lru_cache(maxsize=1)
def claims() -> tuple[Claim, ...]:
    """Every claim, in the file's order; a clear error naming the file when an entry is malformed."""
    data = yaml.safe_load(CLAIMS_FILE.read_text(encoding="utf-8"))
    entries = data.get("claims") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{CLAIMS_FILE}: a top-level `claims:` list is expected")
    found = []
    for number, entry in enumerate(entries, start=1):
        if not isinstance(entry, dict) or set(entry) != {"claim", "exercises", "tests"}:
            raise ValueError(f"{CLAIMS_FILE}: claim {number} needs exactly `claim`, `exercises` and `tests`")
        found.append(Claim(**{key: str(value) for key, value in entry.items()}))
    return tuple(found)


def _cell(text: str) -> str:
    """Markdown table cell text: pipes escaped, one line."""
    return " ".join(text.replace("|", "\\|").split())


def claims_markdown() -> str:
    """The table as Markdown (GitHub/CommonMark tables): claim, exercise, tests."""
    lines = ["| claim | exercise | tests |", "|---|---|---|"]
    lines += [f"| {_cell(c.claim)} | {_cell(c.exercises)} | {_cell(c.tests)} |" for c in claims()]
    return "\n".join(lines) + "\n"
