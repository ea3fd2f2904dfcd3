# shardwise — every target documented with "## ...": `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: help install lint typecheck test test-fast bench run all clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[server,dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install shardwise with the server and dev extras

lint: install ## ruff lint + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: install ## mypy --strict on the packages
	$(VENV)/bin/mypy

test: lint typecheck ## lint, typecheck, then the whole test suite (what CI runs)
	$(VENV)/bin/pytest -q

test-fast: install ## the test suite without lint and typecheck
	$(VENV)/bin/pytest -q -x

bench: install ## planner benchmarks (prints tables; see benchmarks/)
	$(PY) benchmarks/bench_greedy.py

run: install ## plan the example DLRM on 8x H100 and print the per-rank table
	$(VENV)/bin/shardwise plan examples/dlrm_small.json examples/fleet_8xh100.json -o plan.json

all: test ## everything CI checks

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
