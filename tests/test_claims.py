"""Every passage the lab says it quotes from the two source texts is in them, word for word.

The source texts are kept in tests/seeds/ (000 in Portuguese, 001 in English). A quote is the
text between double quotes in a claim of webapp/scenarios/claims.yaml, and each `quote` of an
exercise's `sources` that is not marked `paraphrase`. Whitespace is compared collapsed (the texts
break lines and separate table cells with tabs) and so is case (a quote may begin mid-sentence);
"…" marks words left out, so each side of it is
checked on its own.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from webapp.scenarios import built_in, load
from webapp.scenarios.claims import claims

SEEDS = Path(__file__).resolve().parent / "seeds"


def collapsed(text: str) -> str:
    return re.sub(r"\s+", " ", text.replace("“", '"').replace("”", '"')).strip().casefold()


SOURCE_TEXT = collapsed(" ".join(path.read_text(encoding="utf-8") for path in sorted(SEEDS.glob("*.txt"))))


def missing_from_the_sources(quote: str) -> list[str]:
    return [part for part in (p.strip(" .,;:") for p in re.split(r"\s*(?:…|\[\.\.\.\])\s*", collapsed(quote)))
            if part and part not in SOURCE_TEXT]


def claim_quotes() -> list[tuple[int, str]]:
    """The double-quoted passages of every claim (not the code spans: they quote SQL by its shape)."""
    found = []
    for number, claim in enumerate(claims(), start=1):
        prose = re.sub(r"`[^`]*`", "", claim.claim)
        found += [(number, quote) for quote in re.findall(r'"([^"]+)"', prose)]
    return found


def test_the_two_source_texts_are_there():
    assert len(list(SEEDS.glob("*.txt"))) == 2 and "dois problemas, dois donos" in SOURCE_TEXT


@pytest.mark.parametrize("number, quote", claim_quotes(), ids=lambda v: str(v)[:40])
def test_every_quote_of_a_claim_is_in_the_source_texts(number, quote):
    assert not missing_from_the_sources(quote), f"claim {number}: {missing_from_the_sources(quote)}"


def test_every_exercise_quote_not_marked_paraphrase_is_in_the_source_texts():
    wrong = {}
    for path in built_in():
        for source in load(path).sources:
            if not source["paraphrase"] and missing_from_the_sources(source["quote"]):
                wrong.setdefault(path.stem, []).append(missing_from_the_sources(source["quote"]))
    assert not wrong, wrong


def test_exercise_11_says_the_ttl_its_step_sets():
    [scenario] = [load(path) for path in built_in() if path.stem.startswith("11_")]
    [ttl] = [step.args for step in scenario.steps if step.action == "ttl"]
    said = re.findall(r"\*\*TTL\*\* of (\d+) seconds?", scenario.narrative)
    assert said == [f"{ttl['ttl_seconds']:g}"], (said, ttl)


def test_the_strategies_page_lists_every_error_class_the_consumer_tells_apart():
    """docs/concepts/strategies.md's error table against the consumer's own list (ERROR_OUTCOMES):
    each error class it names, 40001 and 40P01 among them, has its row."""
    from webapp.consumer.loop import ERROR_OUTCOMES

    page = (Path(__file__).resolve().parent.parent / "docs" / "concepts" / "strategies.md").read_text()
    table = page[page.index("| error | outcome |"):]
    table = table[:table.index("\n\n")]
    named = {name for error, _ in ERROR_OUTCOMES
             for name in re.findall(r"\b(UniqueViolation|SerializationFailure|DeadlockDetected|OperationalError|"
                                    r"40001|40P01)\b", error)}
    assert named >= {"SerializationFailure", "DeadlockDetected", "40001", "40P01"}, named
    assert all(name in table for name in named), sorted(name for name in named if name not in table)
