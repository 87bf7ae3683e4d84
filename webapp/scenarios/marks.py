"""YAML with line numbers: a SafeLoader subclass keeps the line of every mapping key and list item,
so every error a scenario file gets names ``file:line`` and what was wrong there."""
from __future__ import annotations

import difflib
import reprlib
from typing import Any, Iterable

import yaml


class ScenarioError(ValueError):
    """A scenario file that does not follow the format; the message carries ``file:line``."""

    def __init__(self, source: str, line: int | None, message: str):
        self.source = source
        self.line = line
        self.problem = message
        super().__init__(f"{source}:{line}: {message}" if line else f"{source}: {message}")


class LocatedDict(dict):
    line: int = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: dict[Any, int] = {}

    def line_of(self, key) -> int:
        return self.lines.get(key, self.line)


class LocatedList(list):
    line: int = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lines: list[int] = []

    def line_of(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else self.line


def located(line: int, **values: Any) -> LocatedDict:
    """A mapping made up by the loader (a short form, a default), marked with the line it stands for."""
    result = LocatedDict(values)
    result.line = line
    return result


# Deeper than this is not a scenario; stopping here keeps PyYAML's recursive composer off Python's stack limit.
MAX_DEPTH = 50
class _ShortRepr(reprlib.Repr):
    """A few items and characters of a value, however large (or aliased) it is."""

    def __init__(self):
        super().__init__()
        self.maxlevel, self.maxlist, self.maxdict, self.maxstring, self.maxother, self.maxlong = 2, 4, 4, 60, 60, 40

    # reprlib dispatches on the type's name: the located containers are cut short as list and dict.
    def repr_LocatedList(self, value, level):
        return self.repr_list(value, level)

    def repr_LocatedDict(self, value, level):
        return self.repr_dict(value, level)


_SHOWN = _ShortRepr()


def shown(value: Any) -> str:
    """``repr(value)``, cut short: an error message quotes what was wrong, not a whole structure."""
    return _SHOWN.repr(value)


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps line numbers, refuses duplicate keys and nesting deeper than MAX_DEPTH,
    and names the line of a scalar it cannot construct (a 5,000-digit number, February 30)."""

    depth = 0

    def compose_node(self, parent, index):
        if self.depth >= MAX_DEPTH:
            raise ScenarioError(self.name, self.peek_event().start_mark.line + 1,
                                f"not valid here: nested deeper than {MAX_DEPTH} levels")
        self.depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except ScenarioError:
            raise
        except (ValueError, OverflowError) as error:
            raise ScenarioError(self.name, node.start_mark.line + 1,
                                f"cannot read the value {shown(node.value)}: {error}") from None


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int)):
            raise ScenarioError(loader.name, line, f"a key must be a word, not {shown(key)}")
        if key in result:
            raise ScenarioError(loader.name, line, f"key {key!r} appears twice (first on line {result.lines[key]})")
        result[key] = loader.construct_object(value_node, deep=True)
        result.lines[key] = line
    return result


def _sequence(loader: _Loader, node: yaml.SequenceNode) -> LocatedList:
    result = LocatedList()
    result.line = node.start_mark.line + 1
    for item in node.value:
        result.append(loader.construct_object(item, deep=True))
        result.lines.append(item.start_mark.line + 1)
    return result


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)
_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, _sequence)


def parse_yaml(text: str, source: str) -> Any:
    try:
        loader = _Loader(text)  # the reader refuses control characters here, before any parsing
    except yaml.reader.ReaderError as error:
        line = text.count("\n", 0, error.position) + 1
        raise ScenarioError(source, line, f"not valid YAML: character #x{error.character:04x} is not allowed "
                            "(a control character)") from None
    loader.name = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        raise ScenarioError(source, mark.line + 1 if mark else 1,
                            f"not valid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise ScenarioError(source, 1, f"not valid YAML: {error}") from None
    finally:
        loader.dispose()


def kind(value: Any) -> str:
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return "true/false"
    for types, name in ((dict, "a mapping"), (list, "a list"), (str, "text"), ((int, float), "a number")):
        if isinstance(value, types):
            return name
    return type(value).__name__


def hint(value: Any, choices: Iterable[Any]) -> str:
    """``; did you mean 'x'?`` for the closest choice, or nothing."""
    if not isinstance(value, (str, int, float)):
        return ""  # a list or a mapping is no misspelt word (and str() of an aliased one can be huge)
    close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
    return f"did you mean {close[0]!r}?" if close else ""


class Checker:
    """Checks on located values that fail with ``file:line: message``."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, line: int | None, message: str):
        raise ScenarioError(self.source, line, message)

    def mapping(self, value: Any, line: int, where: str) -> LocatedDict:
        if not isinstance(value, dict):
            self.fail(line, f"{where} must be a mapping (key: value lines), not {kind(value)}")
        return value

    def keys(self, mapping: LocatedDict, allowed, required=(), where: str = "") -> None:
        for key in mapping:
            if key not in allowed:
                close = hint(key, allowed)
                self.fail(mapping.line_of(key), f"unknown key {key!r} in {where}" + (f": {close}" if close else "")
                          + f" (allowed: {', '.join(map(str, allowed))})")
        for key in required:
            if key not in mapping:
                self.fail(mapping.line, f"{where} needs {key!r}")

    def text(self, mapping, key, where, required=False) -> str | None:
        if key not in mapping:
            if required:
                self.fail(getattr(mapping, "line", None), f"{where} needs {key!r}")
            return None
        value = mapping[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(mapping.line_of(key), f"{where}.{key} must be text, not {kind(value)}")
        return value

    def choice(self, mapping, key, choices, where, default=None):
        if key not in mapping:
            if default is None:
                self.fail(mapping.line, f"{where} needs {key!r} (one of {', '.join(map(str, choices))})")
            return default
        value = mapping[key]
        if value not in choices:
            close = hint(value, choices)
            self.fail(mapping.line_of(key), f"{where}.{key}: {shown(value)} is not one of "
                      f"{', '.join(map(str, choices))}"
                      + (f"; {close}" if close else ""))
        return value

    def number(self, mapping, key, where, bounds, default=None, whole=True):
        if key not in mapping:
            if default is None:
                self.fail(mapping.line, f"{where} needs {key!r}")
            return default
        value, (low, high) = mapping[key], bounds
        ok = isinstance(value, int) if whole else isinstance(value, (int, float))
        if not ok or isinstance(value, bool) or not low <= value <= high:
            self.fail(mapping.line_of(key), f"{where}.{key} must be a {'whole ' if whole else ''}number from "
                      f"{low} to {high}, not {shown(value)}")
        return value

    def flag(self, mapping, key, where, default: bool) -> bool:
        if key not in mapping:
            return default
        if not isinstance(mapping[key], bool):
            self.fail(mapping.line_of(key), f"{where}.{key} must be true or false, not {shown(mapping[key])}")
        return mapping[key]
