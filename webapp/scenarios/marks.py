"""YAML with line numbers: a SafeLoader subclass keeps the line of every mapping key and list item,
so every error a scenario file gets names ``file:line`` and what was wrong there."""
from __future__ import annotations

import difflib
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


class _Loader(yaml.SafeLoader):
    """SafeLoader that keeps line numbers and refuses duplicate keys."""


def _mapping(loader: _Loader, node: yaml.MappingNode) -> LocatedDict:
    loader.flatten_mapping(node)
    result = LocatedDict()
    result.line = node.start_mark.line + 1
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if not isinstance(key, (str, int)):
            raise ScenarioError(loader.name, line, f"a key must be a word, not {key!r}")
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
    loader = _Loader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        raise ScenarioError(source, mark.line + 1 if mark else None,
                            f"not valid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise ScenarioError(source, None, f"not valid YAML: {error}") from None
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
            self.fail(mapping.line_of(key), f"{where}.{key}: {value!r} is not one of {', '.join(map(str, choices))}"
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
                      f"{low} to {high}, not {value!r}")
        return value

    def flag(self, mapping, key, where, default: bool) -> bool:
        if key not in mapping:
            return default
        if not isinstance(mapping[key], bool):
            self.fail(mapping.line_of(key), f"{where}.{key} must be true or false, not {mapping[key]!r}")
        return mapping[key]
