"""Markdown as the pages show it (scenario narratives, the presenter's notes): CommonMark with raw
HTML off, so a scenario's text can format, never inject markup."""
from __future__ import annotations

from markdown_it import MarkdownIt
from markupsafe import Markup

_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})


def markdown(source: str) -> Markup:
    return Markup(_markdown.render(source or ""))  # noqa: S704 - markdown-it escapes raw HTML (html=False)
