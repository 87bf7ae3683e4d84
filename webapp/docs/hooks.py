"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated pages, built fresh on every ``make docs``.

- ``on_config``: the navigation's exercises, one entry per exercise of ``scenarios/`` right after
  ``exercises/index.md`` (never hand-kept in mkdocs.yml: an exercise listed there stops the build);
- ``on_files``: one page per exercise of ``scenarios/``, under ``exercises/``;
- ``on_page_markdown``: a line ``<!-- generated: NAME -->`` in a page becomes the block NAME of
  ``webapp.docs.generate.BLOCKS`` (settings, api, cli, exercises, steps, claims); an unknown name stops the
  build.

MkDocs loads this file by its path, hence the absolute imports.
"""
from __future__ import annotations

import re

from mkdocs.structure.files import File, Files

from webapp.docs import generate

MARKER = re.compile(r"^<!-- generated: ([\w-]+) -->$", re.MULTILINE)


EXERCISES_INDEX = "exercises/index.md"


def _section_holding(nav: list, entry: str) -> list | None:
    """The nav list (at any depth) that holds the page ``entry`` itself, or None."""
    for item in nav:
        if item == entry:
            return nav
        children = list(item.values())[0] if isinstance(item, dict) else None
        if isinstance(children, list):
            found = _section_holding(children, entry)
            if found is not None:
                return found
    return None


def exercise_nav(nav: list) -> list:
    """``nav`` with every exercise's page listed after ``exercises/index.md``, in the files' order."""
    section = _section_holding(nav, EXERCISES_INDEX)
    if section is None:
        raise ValueError(f"mkdocs.yml: the nav lists no {EXERCISES_INDEX}, after which the exercises go")
    pages = [generate.exercise_path(scenario) for scenario in generate.exercises()]
    listed = [item for item in section
              if (item if isinstance(item, str) else next(iter(item.values()))) in pages]
    if listed:
        raise ValueError(f"mkdocs.yml: the nav lists {listed}: the exercises are listed by webapp/docs/hooks.py; "
                         "remove them from mkdocs.yml")
    at = section.index(EXERCISES_INDEX) + 1
    section[at:at] = pages
    return nav


def on_config(config):
    exercise_nav(config["nav"])
    return config


def on_files(files: Files, config) -> Files:
    for scenario in generate.exercises():
        files.append(File.generated(config, generate.exercise_path(scenario), content=generate.exercise_page(scenario)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def block(match: re.Match) -> str:
        name = match.group(1)
        if name not in generate.BLOCKS:
            raise ValueError(f"{page.file.src_uri}: no generated block {name!r} (one of {', '.join(generate.BLOCKS)})")
        return generate.BLOCKS[name]().rstrip("\n")
    return MARKER.sub(block, markdown)
