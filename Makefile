# shardwise — every target documented with "## ...": `make help` lists them.
.DEFAULT_GOAL := help
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
TORCH_STAMP := $(VENV)/.torch-$(shell cat pyproject.toml | sha1sum | cut -c1-12)

.PHONY: help install install-torch install-baseline install-browser lint typecheck test test-fast bench bench-greedy bench-2d run shell dist plan-example load bench-queue all clean

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-17s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[server,dev]'
	touch $(STAMP)

install: $(STAMP) ## create .venv and install shardwise with the server and dev extras

# TorchRec's CPU triple (docs/architecture.md, "The torch side"): torch 2.13.0 + fbgemm-gpu-cpu 1.8.0 + torchrec 1.8.0. torchrec goes in
# --no-deps: its metadata asks for the CUDA fbgemm-gpu wheel (GBs), which replaces the CPU one and fails to load.
# iopath is for torchrec.datasets; torch is named again in step 2 so that no dependency can move it.
# torch 2.13.0 goes in first (the CPU build on this machine's disk) so that the open range torch>=2.6 of the torch
# extra installs nothing more.
$(TORCH_STAMP): $(STAMP)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[server,dev,torch]'
	$(PIP) install -q torch==2.13.0 fbgemm-gpu-cpu==1.8.0 tensordict torchmetrics==1.0.3 tqdm pyre-extensions iopath
	$(PIP) install -q --no-deps torchrec==1.8.0
	$(PY) -c "from torchrec.distributed.planner import EmbeddingShardingPlanner"
	touch $(TORCH_STAMP)

install-torch: $(TORCH_STAMP) ## add torch 2.13.0 (CPU) and TorchRec's CPU triple: the torch side, its tests, the baseline

install-baseline: install-torch ## the same as install-torch (TorchRec for the baseline benchmark)

# The Playwright tests drive Debian's Chromium (playwright install cannot download browsers here), or the Chromium or
# Chrome binary SHARDWISE_CHROMIUM names; they skip themselves when there is none. Installing Debian's takes apt-get,
# so root: as another user (or without apt-get) this says so and goes on, and `make test` runs with the browser tests
# skipped (`sudo make install-browser` adds it; a browser of one's own needs no root: SHARDWISE_CHROMIUM=... make test).
install-browser: ## Debian's chromium for the browser tests (apt-get as root, only when no browser is there)
	@if [ -n "$$SHARDWISE_CHROMIUM" ] || command -v chromium >/dev/null || command -v chromium-browser >/dev/null; then :; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "install-browser: Chromium is missing and installing it needs root and apt-get (sudo make install-browser," \
	       "or SHARDWISE_CHROMIUM=/path/to/chromium-or-chrome make test); the browser tests will skip themselves"; \
	else apt-get update -q && apt-get install -y -q chromium; fi

lint: install-torch ## ruff lint + format check, and the layer contracts (import-linter, pyproject.toml)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: install-torch ## mypy --strict on the packages (torch installed so that runtime/ and calibrate/ are checked against it)
	$(VENV)/bin/mypy

test: lint typecheck install-browser ## lint, typecheck, then the whole test suite (what CI runs)
	$(VENV)/bin/pytest -q

# The slow kinds (pyproject's markers): a real server or worker process, gloo process groups, Triton's interpreter,
# and what is marked slow. PostgreSQL stays in: it is the database production runs.
FAST := not (server or dist or interpreter or slow)

test-fast: install-torch ## the edit loop: the suite without the slow kinds (no lint, no typecheck; stops at the first failure)
	$(VENV)/bin/pytest -q -x -m "$(FAST)"

bench: install ## greedy vs CP-SAT (vs TorchRec if installed) on the benchmark instances; BENCH_ARGS=... to filter
	$(PY) benchmarks/run.py $(BENCH_ARGS)

bench-greedy: install ## the greedy planner alone on every instance (seconds to answer)
	$(PY) benchmarks/run.py --greedy-only $(BENCH_ARGS)

bench-2d: install ## the best 1D plan against the best 2D plan (replica groups) at 128-1,024 GPUs, and why 2D loses
	$(PY) benchmarks/sparse2d.py $(BENCH_2D_ARGS)

run: install ## install, migrate and serve on http://127.0.0.1:8000 (SQLite ./shardwise.db unless SHARDWISE_DATABASE_URL)
	@echo "the CLI, in another terminal: $(VENV)/bin/shardwise --help (or make shell, or source $(VENV)/bin/activate)"
	$(VENV)/bin/shardwise serve --host 127.0.0.1 --port 8000

shell: install ## a shell with .venv activated: shardwise, alembic and pytest on the PATH (exit leaves it)
	@echo "shardwise's .venv is active in this shell; exit leaves it"
	@bash --init-file <(echo '[ -f ~/.bashrc ] && . ~/.bashrc; . $(VENV)/bin/activate') -i

# python -m build makes the sdist, then the wheel from the unpacked sdist (so nothing stale in build/ reaches it);
# the build backend comes from the package index in build's isolated environment.
dist: install ## a wheel and an sdist in dist/, to install elsewhere: pip install 'dist/shardwise-<version>-py3-none-any.whl[torch]'
	rm -rf dist build shardwise.egg-info
	$(PY) -m build --outdir dist .
	@ls dist

plan-example: install ## plan the example DLRM on 8x H100 locally (no server) and print the per-rank table
	$(VENV)/bin/shardwise plan examples/dlrm_dcnv2.json examples/fleet_8xh100.json --time-limit 10 -o plan.json

load: install ## a real uvicorn (a process per core): cold plans, 500 waiting POSTs + probes, 1,024 ranks at once, the reused path at 50 clients
	$(PY) benchmarks/load_service.py $(LOAD_ARGS)

bench-queue: install ## cold plans per minute with 1 and 2 Celery workers, and the latency the queue adds (Redis, PostgreSQL)
	$(PY) benchmarks/queue_bench.py $(QUEUE_ARGS)

all: test ## everything CI checks

clean: ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
