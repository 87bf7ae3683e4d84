"""The rooms of webapp/ and their one-way doors (ARCHITECTURE: the architecture page).

- the import-linter contracts of pyproject.toml ([tool.importlinter]) hold: the layers, no cycles,
  no Kafka client in the web, no Flask in the consumers and the agent, and the rest;
- every module imports on its own, in a fresh interpreter (an import cycle shows up here as an
  ImportError, whichever module happens to be imported first);
- a consumer process and the agent load no Flask.
"""
from __future__ import annotations

import pkgutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import webapp

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def modules() -> list[str]:
    names = ["webapp"]
    for info in pkgutil.walk_packages(webapp.__path__, prefix="webapp."):
        # Alembic's own scripts (env.py and the revisions) run inside Alembic, not on import.
        alembic = info.name == "webapp.store.migrations.env" or info.name.startswith("webapp.store.migrations.versions.")
        if alembic or info.name.rsplit(".", 1)[-1] == "__main__":
            continue
        names.append(info.name)
    return sorted(names)


def test_the_import_contracts_hold():
    result = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_module_imports_on_its_own():
    names = modules()
    assert "webapp.web.scenarios" in names and "webapp.agent.loop" in names

    def fresh_import(name: str) -> tuple[str, int, str]:
        result = subprocess.run([sys.executable, "-c", f"import {name}"], cwd=ROOT, capture_output=True, text=True,
                                timeout=120)
        return name, result.returncode, result.stderr.strip()

    with ThreadPoolExecutor(max_workers=4) as pool:
        failed = [(name, stderr) for name, code, stderr in pool.map(fresh_import, names) if code != 0]
    assert not failed, "\n\n".join(f"import {name}:\n{stderr}" for name, stderr in failed)


FLASK_ISH = ("flask", "flask_sqlalchemy", "flask_wtf", "werkzeug")


def test_a_consumer_process_and_the_agent_load_no_flask():
    probe = (
        "import sys\n"
        "import webapp.consumer.loop, webapp.consumer.batch, webapp.agent.loop, webapp.agent.handlers\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {FLASK_ISH!r})\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"a consumer process or the agent loads: {result.stdout.strip()}"
