# Two commands on a fresh machine: `make demo` and `make test`. Both set everything up first.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: demo test test-fast lint system-deps clean

$(STAMP): pyproject.toml requirements-dev.txt requirements-extras.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements-dev.txt
	$(BIN)/python -m pip install --quiet --no-deps -r requirements-extras.txt
	$(BIN)/python -m pip install --quiet --no-deps -e .
	touch $@

# Debian packages: Fashion-MNIST and iproute2 (network namespaces + tc). Needs root; skipped
# with a note otherwise (the tests that need them say why they skip).
system-deps:
	@scripts/system-deps.sh

demo: $(STAMP) system-deps
	$(BIN)/ringps train

test: $(STAMP) system-deps
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check ringps tests benchmarks examples

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache
