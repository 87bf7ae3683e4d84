"""The scenario loader under fuzzing (hypothesis): whatever text a file holds, loading it gives a
Scenario or a ScenarioError whose message starts with ``file:line:``, never a traceback.

Three kinds of input: arbitrary text; the built-in exercises with lines dropped, repeated or
changed; and the built-in exercises' structure with one value anywhere replaced by another
(a word of the lab's vocabulary, a number at a limit, a list, a mapping, nothing)."""
from __future__ import annotations

import re

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import ROOT
from webapp import strategies as dedup_strategies
from webapp.domain.vocabulary import CONSUMER_STATES, CRASH_POINTS
from webapp.scenarios import ScenarioError, built_in
from webapp.scenarios.loader import ACTIONS, SETUP_KEYS, TOP_KEYS, Scenario, loads
from webapp.scenarios.marks import MAX_DEPTH

SOURCE = "fuzz.yaml"
# The same examples on every run (no example database in the checkout); a few seconds in all.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=250,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
EXERCISES = {path.stem: path.read_text(encoding="utf-8") for path in built_in()}
STRUCTURES = {name: yaml.safe_load(text) for name, text in EXERCISES.items()}


def load_or_located_error(text: str) -> Scenario | ScenarioError:
    """Load ``text``; a ScenarioError is returned after checking it names a line of the file."""
    try:
        return loads(text, source=SOURCE, name="fuzz")
    except ScenarioError as error:
        match = re.match(rf"{re.escape(SOURCE)}:(\d+): \S", str(error))
        assert match, f"no file:line: in {str(error)!r}"
        assert 1 <= int(match.group(1)) <= text.count("\n") + 2, str(error)
        assert len(str(error)) < 2000, "a message quoting a whole structure"
        return error


@FUZZ
@given(st.text(max_size=400))
def test_any_text_loads_or_names_a_line(text):
    load_or_located_error(text)


@FUZZ
@given(st.sampled_from(sorted(EXERCISES)), st.data())
def test_an_exercise_with_lines_dropped_repeated_or_changed_loads_or_names_a_line(name, data):
    lines = EXERCISES[name].splitlines()
    for _ in range(data.draw(st.integers(1, 3), label="edits")):
        where = data.draw(st.integers(0, len(lines) - 1), label="line")
        edit = data.draw(st.sampled_from(["drop", "repeat", "replace", "indent", "dedent"]), label="edit")
        if edit == "drop":
            del lines[where]
        elif edit == "repeat":
            lines.insert(where, lines[where])
        elif edit == "replace":
            lines[where] = data.draw(st.text(max_size=40), label="new line")
        elif edit == "indent":
            lines[where] = "  " + lines[where]
        else:
            lines[where] = lines[where][2:]
        if not lines:
            break
    load_or_located_error("\n".join(lines) + "\n")


# Values a person might write: the lab's words (some misspelt by the fuzzer), numbers at the edges,
# YAML's own types (dates, floats like .nan), and structures where a word was expected.
WORDS = sorted({*ACTIONS, *TOP_KEYS, *SETUP_KEYS, *CONSUMER_STATES, *CRASH_POINTS, *dedup_strategies.NAMES,
                "payments", "c1", "acc-1", "crash", ">= 1", "== 0", "< 2"})
scalars = st.one_of(
    st.none(), st.booleans(), st.sampled_from(WORDS), st.text(max_size=12),
    st.integers(-3, 13), st.integers(), st.sampled_from([0.0, -1.5, 1e308, float("inf"), float("nan"), 100.005]),
    st.dates(), st.datetimes())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(WORDS) | st.text(max_size=6), inner, max_size=3),
                      max_leaves=5)


def replace_somewhere(structure, data):
    """``structure`` with one value (a whole subtree) somewhere in it replaced by a drawn one."""
    if isinstance(structure, dict) and structure and data.draw(st.booleans(), label="go deeper"):
        key = data.draw(st.sampled_from(list(structure)), label="key")
        return {**structure, key: replace_somewhere(structure[key], data)}
    if isinstance(structure, list) and structure and data.draw(st.booleans(), label="go deeper"):
        index = data.draw(st.integers(0, len(structure) - 1), label="index")
        return [*structure[:index], replace_somewhere(structure[index], data), *structure[index + 1:]]
    return data.draw(values, label="new value")


@FUZZ
@given(st.sampled_from(sorted(STRUCTURES)), st.data())
def test_an_exercise_with_a_value_replaced_loads_or_names_a_line(name, data):
    structure = STRUCTURES[name]
    for _ in range(data.draw(st.integers(1, 3), label="replacements")):
        structure = replace_somewhere(structure, data)
    load_or_located_error(yaml.safe_dump(structure, allow_unicode=True, sort_keys=False))


def test_the_built_in_exercises_still_load():
    for name, text in EXERCISES.items():
        assert isinstance(load_or_located_error(text), Scenario), name


def test_every_portuguese_quote_has_an_english_gloss_and_paraphrases_say_so():
    """Source text 000 is in Portuguese: each of its quotes (not its SQL) carries an English gloss;
    a source that paraphrases is marked, and the loader keeps both (the guided page shows them)."""
    from webapp.scenarios import load
    sources = [(path.stem, s) for path in built_in() for s in load(path).sources]
    portuguese = [(name, s) for name, s in sources if s["seed"] == "pt" and not re.match(r"(INSERT INTO|DELETE FROM|UPDATE [a-z_]+ SET) ", s["quote"])]
    assert portuguese and all(s["gloss"] for _, s in portuguese), [name for name, s in portuguese if not s["gloss"]]
    assert sorted(name for name, s in sources if s["paraphrase"]) == ["05_source_duplicate_business_key",
                                                                       "12_choice_of_key_payload_hash",
                                                                       "19_your_consumer_graded"]


ALIAS_BOMB = "recorded:\n  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]\n" + "".join(
    f"  {this}: &{this} [{', '.join([f'*{previous}'] * 9)}]\n" for previous, this in zip("abcdefgh", "bcdefghi"))


@pytest.mark.parametrize("text, line, words", [
    # Each of these was a traceback before: the reader refuses control characters when it is built.
    ("title: t\nnarrative: \x07\n", 2, "character #x0007 is not allowed"),
    ("a: " + "[" * 3000 + "]" * 3000, 1, f"nested deeper than {MAX_DEPTH} levels"),
    ("".join("  " * depth + "a:\n" for depth in range(200)), MAX_DEPTH, "nested deeper"),
    ("title: t\nsetup:\n  partitions: " + "1" * 5000 + "\n", 3, "cannot read the value"),
    ("title: t\nnarrative: 2001-02-30\n", 2, "day is out of range for month"),
    # A billion laughs: quoted in a message, it is a few characters, not 9^9 numbers.
    (ALIAS_BOMB + "title: t\nnarrative: n\nsteps: [{start: c1}]\nexpect: {}\nsetup: {partitions: *i}\n", 15,
     "setup.partitions must be a whole number from 1 to 12, not [[[...], [...], [...], [...], ...], "),
])
def test_what_the_fuzzer_found_is_a_located_error(text, line, words):
    error = load_or_located_error(text)
    assert isinstance(error, ScenarioError) and error.line == line, str(error)
    assert words in str(error)


def test_a_file_is_parsed_once_per_version_and_each_caller_gets_its_own_copy(tmp_path):
    from webapp.scenarios.loader import _load, load
    path = tmp_path / "mine.yaml"
    builtin = sorted((ROOT / "scenarios").glob("*.yaml"))[0].read_text(encoding="utf-8")
    path.write_text(builtin, encoding="utf-8")
    first, second = load(path), load(path)
    assert first == second and first is not second and first.steps[0] is not second.steps[0]
    hits = _load.cache_info().hits
    load(path)
    assert _load.cache_info().hits == hits + 1, "the same version of the file was parsed again"
    # Longer by a few bytes: a new version even within the file system's timestamp granularity.
    path.write_text(builtin.replace(first.title, first.title + " (mine)", 1), encoding="utf-8")
    assert load(path).title == first.title + " (mine)", "an edited file must be read again"


def test_a_step_may_expect_a_refusal_but_a_wait_may_not():
    """`refused: TEXT` marks a step whose operation must be refused with a message holding TEXT
    (exercise 7's idempotent producer without its terms); a wait runs no operation to refuse."""
    head, tail = "title: t\nnarrative: n\nexpect: {log_end: 0}\nsteps:\n", ""
    scenario = loads(head + '  - publish: {account: acc-1, amount: 1.00, acks: "1"}\n'
                            '    refused: "`acks` must be set to `all`"\n' + tail, source=SOURCE, name="refusal")
    [step] = scenario.steps
    assert step.refused == "`acks` must be set to `all`" and step.args["acks"] == "1"
    assert step.describe().endswith("acks=1, expecting a refusal")
    with pytest.raises(ScenarioError, match=rf"{SOURCE}:6: step 1 \(wait\): `refused` is for a step that runs an "
                                            "operation, not a wait"):
        loads(head + "  - wait: {log_end: 1}\n    refused: never\n", source=SOURCE, name="refusal")
    with pytest.raises(ScenarioError, match=rf"{SOURCE}:5: step 1 \(publish\): acks must be one of"):
        loads(head + '  - publish: {account: acc-1, amount: 1.00, acks: "2"}\n', source=SOURCE, name="refusal")
