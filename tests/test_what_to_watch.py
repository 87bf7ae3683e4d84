"""Each exercise's "What to watch" paragraph, and each step's note, names only what its guided page shows.

The guided run's page (templates/scenarios/run.html) keeps the paragraph in view beside its live
panels (_live.html) and its step list (_guide.html). A paragraph that sends the learner to a
dashboard panel (the Dedup tables, the Partitions panel's strip, the SQL view, a drill-down...)
points at something the page does not have. These tests hold the narratives to the page: a table
of the panels and lines the guided page renders, each checked against the templates, and every
watch paragraph checked against the table.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from webapp.scenarios import built_in, load
from webapp.web.scenarios import what_to_watch

TEMPLATES = Path(__file__).resolve().parents[1] / "templates" / "scenarios"

# The guided page's panels, by the names it shows them under, and the template text that renders
# each heading: a panel renamed or removed there fails here before a narrative sends anyone to it.
GUIDED_PANELS = {
    "Expectations": ("_live.html", "<h2>Expectations"),
    "Accounts": ("_live.html", '"Accounts" if lane is none'),
    "Lane": ("_live.html", '"Lane " ~ lane'),  # one per lane: "Lane naive", "Lane mine"...
    "Consumers": ("_live.html", "<h2>Consumers"),
    "Timeline": ("_live.html", "<h2>Timeline"),
}
# Lines and columns of those panels a paragraph quotes, with the template text that renders each.
GUIDED_WORDS = {
    "verdict headline": ("_live.html", "duplicate(s), {{ v.effects_lost }} lost"),
    "exactly-once headline": ("_live.html", "✓ exactly-once effect"),
    "set(s) regressed": ("_live.html", "set(s) regressed"),
    "set(s) changed by a redelivery": ("_live.html", "set(s) changed by a redelivery"),
    "committed offsets": ("_live.html", "committed {{"),
    "log end": ("_live.html", "log end {{ end }}"),
    "redeliveries absorbed": ("_live.html", "redeliveries absorbed {{"),
    "source duplicates absorbed": ("_live.html", "source duplicates absorbed {{"),
    "dedup table rows": ("_live.html", "{{ table }} {{ dedup.rows }}"),
    "oldest key": ("_live.html", "(oldest key {{"),
    "failed commits": ("_live.html", "failed commits</th>"),
    "armed column": ("_live.html", "armed</th>"),
    "step mode's wait": ("_live.html", "‖ {{ c.step_at }}"),
    "All steps": ("_guide.html", "All steps ("),
    "a step's observed result": ("_guide.html", "{{ result.observed }}"),
}
# What only the dashboard shows (its panels and their parts): a paragraph that names one must say
# "on the dashboard" in the same sentence.
DASHBOARD_ONLY = {
    "the Dedup tables panel": r"dedup tables",
    "the Dedup at scale panel": r"dedup at scale",
    "the Partitions panel": r"partitions panel",
    "the Partitions panel's strip": r"partition strip",
    "the Partitions panel's ⇅ marks": r"⇅|\bhover",
    "the SQL panel": r"sql view|show the sql|\bsql panel",
    "a record's drill-down": r"drill[- ]?down",
    "the Notifications panel": r"notifications panel",
    "the Outbox panel": r"outbox panel",
    "the Verdict panel": r"verdict panel|verdict's why|\bits why\b",
    "the Strategy lanes panel": r"strategy lanes panel",
    "the Chaos panel": r"chaos panel",
    "the Load panel": r"load panel",
    "the chart": r"expected vs actual|\bchart\b",
    "a consumer's card": r"\bcards?\b",
}
ON_THE_DASHBOARD = "on the dashboard"


def _exercises() -> list[tuple[str, str | None]]:
    return [(path.stem, what_to_watch(load(path).narrative)[0]) for path in built_in()]


def _step_notes() -> list[tuple[str, str]]:
    """Every step's note: the guided page shows the current step's beside its action."""
    return [(f"{path.stem} step {step.index}", step.note) for path in built_in() for step in load(path).steps
            if step.note]


def _plain(paragraph: str) -> str:
    """The paragraph as the page reads: emphasis and code marks off, lines joined."""
    return re.sub(r"[*`]", "", " ".join(paragraph.split()))


def _sentences(paragraph: str) -> list[str]:
    """Its sentences and semicolon-separated clauses: a dashboard name is excused only in its own."""
    return [s for s in re.split(r"(?<=[.;])\s+", _plain(paragraph)) if s]


def unshown_names(paragraph: str) -> list[str]:
    """What the paragraph names that the guided page does not show, outside a sentence that says
    it is on the dashboard."""
    problems = []
    for sentence in _sentences(paragraph):
        if ON_THE_DASHBOARD in sentence.lower():
            continue
        for name, pattern in DASHBOARD_ONLY.items():
            if re.search(pattern, sentence, re.IGNORECASE):
                problems.append(f"{name} (in: {sentence!r})")
        for match in re.finditer(r"(?:\bLane [\w-]+|\b[\w'’-]+) panel\b", sentence):
            named = match.group(0)[: -len(" panel")]
            if named.split()[0] not in GUIDED_PANELS:
                problems.append(f"the {named} panel (in: {sentence!r})")
    return problems


@pytest.mark.parametrize(("what", "where"), sorted({**GUIDED_PANELS, **GUIDED_WORDS}.items()))
def test_the_guided_page_renders_what_the_table_says(what, where):
    template, text = where
    assert text in (TEMPLATES / template).read_text(), f"{template} no longer renders {what!r} ({text!r})"


@pytest.mark.parametrize(("name", "watch"), _exercises(), ids=[name for name, _ in _exercises()])
def test_what_to_watch_names_only_what_the_guided_page_shows(name, watch):
    assert watch, f"{name} has no paragraph starting with **What to watch:**"
    assert not unshown_names(watch), f"{name}'s What to watch names what its guided page does not show"


@pytest.mark.parametrize(("where", "note"), _step_notes(), ids=[where for where, _ in _step_notes()])
def test_a_step_note_names_only_what_the_guided_page_shows(where, note):
    assert not unshown_names(note), f"{where}'s note names what the guided page does not show"


@pytest.mark.parametrize("paragraph", [
    "**What to watch:** the Dedup tables panel — rows climb with each burst.",
    "**What to watch:** the Partitions panel, where the committed offset stays at 1.",
    "**What to watch:** the partition strip (the offset turns \"applied twice\").",
    "**What to watch:** the SQL view's commit line for each group.",
    "**What to watch:** the `processed_events` panel (1 row, then 0).",
    "**What to watch:** the Notifications panel for acc-1.",
    "**What to watch:** the redelivery window on its card.",
    "**What to watch:** open the record's drill-down.",
])
def test_a_dashboard_panel_in_a_watch_paragraph_is_caught(paragraph):
    assert unshown_names(paragraph)


def test_a_dashboard_panel_is_allowed_in_a_sentence_that_says_so():
    paragraph = ("**What to watch:** the Timeline's TTL line. On the dashboard (Lab, in the header), the "
                 "Dedup tables panel shows the oldest key's age.")
    assert unshown_names(paragraph) == []


def test_the_guided_panels_pass():
    paragraph = ("**What to watch:** the Accounts panel's headline; the *Lane naive* panel; the Consumers "
                 "panel's failed commits; the Expectations panel; the Timeline panel.")
    assert unshown_names(paragraph) == []


def test_a_paragraph_that_sends_the_learner_to_the_dashboard_has_a_link_there():
    """A sentence may name a dashboard panel only with "on the dashboard"; then the run's page must
    lead to the dashboard of the run's own lab (a guided run outside a class works in a fresh lab,
    which the header's Lab link does not show): marked ``data-run-lab-dashboard`` in run.html."""
    sending = [name for name, watch in _exercises() if watch and ON_THE_DASHBOARD in _plain(watch).lower()]
    if sending:
        assert "data-run-lab-dashboard" in (TEMPLATES / "run.html").read_text(), (
            f"{', '.join(sending)} send the learner to the dashboard, and the run's page has no link to its lab there")
