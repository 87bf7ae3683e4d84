"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated pages, built fresh on every ``make docs``.

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
