"""The rooms of webapp/ and their one-way doors (ARCHITECTURE: the architecture page).

- the import-linter contracts of pyproject.toml ([tool.importlinter]) hold: the layers, no cycles,
  no Kafka client in the web, no Flask in the consumers and the agent, and the rest;
- every module imports on its own, in a fresh interpreter (an import cycle shows up here as an
  ImportError, whichever module happens to be imported first);
- a consumer process and the agent load no Flask.
"""
from __future__ import annotations

import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

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


# Each module is imported in a child forked from one interpreter that has loaded the third-party
# libraries the project uses: the child starts as a fresh interpreter does, as far as webapp is
# concerned, and costs a fork instead of ~1 s of interpreter start-up and library imports (150
# fresh interpreters took 210 s of a CI run on two cores).
#
# The parent then loads the project in TIERS, each the modules one import of its roots loads. Every
# module of a tier is imported in a child *before* the parent loads that tier, so each module is
# tried once, from a parent holding only earlier tiers. What the parent holds is closed (importing
# it loaded nothing else), so it imports nothing outside itself: no import circle can run through
# it, and a child imports the rest of the project in the order a fresh interpreter would. The
# tiers only save the children the cost of the modules below them (the operations' pydantic
# models, the store's tables: about 0.2 s each).
TIERS = [["webapp.store.tables"], ["webapp.ops"]]
_IMPORT_EACH = """
import json, os, sys, traceback
import flask, flask_sqlalchemy, flask_wtf, sqlalchemy, sqlalchemy.orm, psycopg, confluent_kafka, pydantic, yaml
import alembic, click, markdown_it, markupsafe, dotenv
import sqlalchemy.dialects.postgresql
assert not [m for m in sys.modules if m.split(".")[0] == "webapp"], "the parent must not load the project"
failed, tried = {}, set()

def import_in_a_child(name):
    tried.add(name)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        code = 0
        try:
            __import__(name)
        except BaseException:
            os.write(write, traceback.format_exc().encode())
            code = 1
        os._exit(code)
    os.close(write)
    with os.fdopen(read) as pipe:
        error = pipe.read()
    _, status = os.waitpid(pid, 0)
    if status != 0:
        failed[name] = error or f"exit status {status}"

def project_modules():
    return {m for m in sys.modules if m.split(".")[0] == "webapp"}

def tier_of(roots):
    # What importing the roots loads, learnt in a child: the parent must not load it untried.
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        before = project_modules()
        for root in roots:
            __import__(root)
        os.write(write, json.dumps(sorted(project_modules() - before)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        loaded = json.loads(pipe.read() or "[]")
    os.waitpid(pid, 0)
    return loaded

tiers, names = json.loads(sys.argv[1]), json.loads(sys.argv[2])
for roots in tiers:
    for name in tier_of(roots):
        if name not in tried:
            import_in_a_child(name)
    if failed:
        break
    for root in roots:
        __import__(root)
if not failed:
    for name in names:
        if name not in tried:
            import_in_a_child(name)
print(json.dumps(failed))
"""


@pytest.mark.long
def test_every_module_imports_on_its_own():
    names = modules()
    assert "webapp.web.scenarios" in names and "webapp.agent.loop" in names
    assert {root for roots in TIERS for root in roots} <= set(names)
    result = subprocess.run([sys.executable, "-c", _IMPORT_EACH, json.dumps(TIERS), json.dumps(names)], cwd=ROOT,
                            capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    failed = json.loads(result.stdout.strip().splitlines()[-1])
    assert not failed, "\n\n".join(f"import {name}:\n{error}" for name, error in failed.items())


FLASK_ISH = ("flask", "flask_sqlalchemy", "flask_wtf", "werkzeug")
# A consumer process talks to PostgreSQL with psycopg and to Kafka with confluent-kafka, nothing else:
# the agent starts one per consumer, and every library it loads is paid again at each start.
NOT_IN_A_CONSUMER = FLASK_ISH + ("sqlalchemy", "alembic", "pydantic", "yaml")


def loaded_by(modules: str, roots: tuple[str, ...]) -> str:
    """The modules under ``roots`` that importing ``modules`` loads, in a fresh interpreter."""
    probe = (
        "import sys\n"
        f"import {modules}\n"
        f"loaded = sorted(m for m in sys.modules if m.split('.')[0] in {roots!r})\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_a_consumer_process_and_the_agent_load_no_flask():
    loaded = loaded_by("webapp.consumer.loop, webapp.consumer.batch, webapp.agent.loop, webapp.agent.handlers",
                       FLASK_ISH)
    assert loaded == "", f"a consumer process or the agent loads: {loaded}"


def test_a_consumer_process_loads_no_sqlalchemy_alembic_pydantic_or_flask():
    loaded = loaded_by("webapp.consumer.__main__", NOT_IN_A_CONSUMER)
    assert loaded == "", f"a consumer process loads: {loaded}"
