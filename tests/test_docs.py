"""The documentation site (docs/, mkdocs.yml; `make docs`).

- it builds with `mkdocs build --strict` and its log holds no warning: no broken link, no page missing
  from the navigation, no unknown generated block; every exercise of scenarios/ has its page, listed in
  the navigation by the hook (never by hand), and every page links back into the lab;
- the generated configuration page names every setting the code reads;
- the claims table the guided mode's Exercises page shows is the docs' one, cell for cell;
- the lab serves the built site at /docs (each page with a CSP that allows its own inline scripts
  by hash, and nothing outside the site), says how to build it when it is not built, and links to
  it from the header and from each exercise.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from webapp.scenarios import built_in
from webapp.settings.model import LabSettings
from webapp.web import docs as docs_blueprint

ROOT = Path(__file__).resolve().parent.parent
# Keys the code reads that are no setting of a person's: Flask's and Flask-SQLAlchemy's own
# configuration (derived from the settings by create_app), flags the app sets for itself, and what
# the agent tells the processes it starts.
NOT_SETTINGS = {
    "FLASK_RUN_FROM_CLI",           # Flask's own environment flag
    "SESSION_COOKIE_HTTPONLY", "SESSION_COOKIE_SAMESITE", "SESSION_COOKIE_SECURE",  # from LAB_HTTPS
    "SQLALCHEMY_DATABASE_URI", "SQLALCHEMY_ENGINE_OPTIONS",                          # from DATABASE_URL
    "NO_DATABASE",                  # create_app's note that DATABASE_URL is unset
    "LAB_AGENT_ID",                 # the agent names itself to the outbox relays it starts
}
READ_KEY = re.compile(r"""(?:config|environ)(?:\.get\(|\.setdefault\(|\[)\s*"([A-Z][A-Z0-9_]+)\"""")


class Tables(HTMLParser):
    """Every table of a page as rows of cell texts (whitespace collapsed)."""

    def __init__(self):
        super().__init__()
        self.tables: list[list[list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(" ".join("".join(self._cell).split()))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def tables_of(html: str) -> list[list[list[str]]]:
    parser = Tables()
    parser.feed(html)
    return parser.tables


def build(config: Path, target: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of ``config`` into ``target``, as `make docs` runs it, with its log.

    Not --quiet: with it MkDocs drops its warnings before --strict counts them, and the build passes."""
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(target)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def warnings_of(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (result.stdout + result.stderr).splitlines() if line.startswith(("WARNING", "ERROR"))]


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for this module with `mkdocs build --strict`, as `make docs` does."""
    target = tmp_path_factory.mktemp("site")
    started = time.monotonic()
    result = build(ROOT / "mkdocs.yml", target)
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    assert time.monotonic() - started < 60, "the docs build should take seconds"
    # Read as well, so that a warning fails here even if a later MkDocs stopped counting one.
    assert not warnings_of(result), "the docs build warned:\n" + "\n".join(warnings_of(result))
    return target


def test_a_page_with_a_broken_link_fails_the_build(tmp_path):
    """The build the tests run fails on a warning: a copy of the docs, one page of it given a link to
    a page that does not exist, does not build, and the log names the link."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    page = docs / "getting-started.md"
    page.write_text(page.read_text() + "\nSee [the missing page](no-such-page.md).\n")
    config = (ROOT / "mkdocs.yml").read_text()
    # The copy's docs, the real theme and hooks: the same site but for the one link.
    for relative, absolute in (("docs_dir: docs", f"docs_dir: {docs}"),
                               ("custom_dir: webapp/docs/theme", f"custom_dir: {ROOT / 'webapp/docs/theme'}"),
                               ("- webapp/docs/hooks.py", f"- {ROOT / 'webapp/docs/hooks.py'}")):
        assert relative in config, f"mkdocs.yml no longer says {relative!r}: update this test's copy"
        config = config.replace(relative, absolute)
    (tmp_path / "mkdocs.yml").write_text(config)

    result = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0, "a page with a broken link built under --strict:\n" + result.stderr[-3000:]
    broken = [line for line in warnings_of(result) if "no-such-page.md" in line]
    assert broken and "getting-started.md" in broken[0], "\n".join(warnings_of(result))


def test_the_site_builds_strictly_with_a_page_per_exercise_and_every_setting(site):
    home = (site / "index.html").read_text()
    for exercise in built_in():
        page = site / "exercises" / exercise.stem / "index.html"
        assert page.is_file(), f"no page for {exercise.name}"
        assert f'href="exercises/{exercise.stem}/"' in home, f"{exercise.name} is missing from the navigation"
    assert '<a href="./../scenarios/">Exercises</a>' in home, "the docs link back to the lab's exercises"
    first = (site / "exercises" / "01_naive_double_credit" / "index.html").read_text()
    assert "after-effect-before-commit" in first and "What the verdict shows" in first

    configuration = (site / "operations" / "configuration" / "index.html").read_text()
    read_by_code = {key for path in (ROOT / "webapp").rglob("*.py") for key in READ_KEY.findall(path.read_text())}
    assert read_by_code >= {"DATABASE_URL", "LAB_TOKEN", "LAB_NOTIFY_URL"}, "the scan finds the settings"
    missing = sorted(key for key in (read_by_code - NOT_SETTINGS) | set(LabSettings.model_fields)
                     if f"<code>{key}</code>" not in configuration)
    assert not missing, f"read by the code, absent from the configuration page: {missing}"

    api = (site / "reference" / "api" / "index.html").read_text()
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "/api/v1/consumers/{consumer_id}/arm" in api and "after-effect-before-commit" in api
    assert "flask --app app lab start-consumer" in cli and "flask --app app scenario run" in cli


def test_the_lab_shows_the_docs_claims_table_and_serves_the_built_site_at_docs(site, client, monkeypatch, tmp_path):
    # One test for both, so that the site is built once per worker that runs this module.
    catalogue = client.get("/scenarios/").get_data(as_text=True)
    section = catalogue[catalogue.index('id="claims"'):]
    shown = tables_of(section[:section.index("</table>") + len("</table>")])[0]
    documented = tables_of((site / "concepts" / "claims" / "index.html").read_text())[0]
    assert len(shown) > 15 and shown[0] == ["claim", "exercise", "tests"]
    assert shown == documented, "the Exercises page's claims table differs from the docs' one"

    monkeypatch.setattr(docs_blueprint, "SITE", site)
    home = client.get("/docs/")
    assert home.status_code == 200 and "Idempotency Lab" in home.get_data(as_text=True)
    policy = home.headers["Content-Security-Policy"]
    assert "'sha256-" in policy and "'unsafe-inline'" not in policy and "style-src 'self'" in policy
    exercise = client.get("/docs/exercises/01_naive_double_credit/")
    assert exercise.status_code == 200 and "What to click" in exercise.get_data(as_text=True)
    assert client.get("/docs/exercises/01_naive_double_credit").status_code == 308  # its relative links need the /
    stylesheet = client.get("/docs/assets/stylesheets/" + next((site / "assets" / "stylesheets").glob("main*.css")).name)
    stylesheet.close()  # a file sent as it is: closed by the server after sending, by hand here
    assert stylesheet.status_code == 200
    assert client.get("/docs/no-such-page/").status_code == 404
    assert client.get("/docs/../pyproject.toml").status_code == 404
    assert client.get("/docs/%2e%2e/pyproject.toml").status_code == 404

    dashboard = client.get("/").get_data(as_text=True)
    assert 'class="docs-link" href="/docs/"' in dashboard
    assert 'href="/docs/exercises/01_naive_double_credit/"' in catalogue

    monkeypatch.setattr(docs_blueprint, "SITE", tmp_path / "not-built")
    missing = client.get("/docs/reference/api/")
    assert missing.status_code == 200 and "make docs" in missing.get_data(as_text=True)


def test_the_navigation_lists_the_exercises_from_scenarios_and_refuses_a_hand_kept_one():
    from webapp.docs import generate, hooks

    nav = [{"Home": "index.md"}, {"Exercises": ["exercises/index.md", {"Your consumer": "exercises/your-consumer.md"}]}]
    section = hooks.exercise_nav(nav)[1]["Exercises"]
    pages = [generate.exercise_path(s) for s in generate.exercises()]
    assert section == ["exercises/index.md", *pages, {"Your consumer": "exercises/your-consumer.md"}]
    with pytest.raises(ValueError, match="remove them from mkdocs.yml"):
        hooks.exercise_nav([{"Exercises": ["exercises/index.md", pages[0]]}])
    with pytest.raises(ValueError, match="lists no exercises/index.md"):
        hooks.exercise_nav([{"Home": "index.md"}])
