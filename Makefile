# fxcodegen developer loop. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH := torch==2.15.0
DEV_DEPS := "$(TORCH)" "transformers==5.23.*" "maturin>=1.9.4,<2" pytest pytest-timeout pytest-benchmark ruff filelock tqdm matplotlib "redis>=5" "tlparse>=0.4"
export VIRTUAL_ENV := $(abspath $(VENV))
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help
help: ## show this help
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(BIN)/python:
	$(PY) -m venv $(VENV)

$(VENV)/.deps: pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(DEV_DEPS)
	touch $@

.PHONY: install
install: $(VENV)/.deps ## create .venv, install torch and dev tools, build the extension (release)
	$(BIN)/maturin develop --release --quiet

.PHONY: build-dev
build-dev: $(VENV)/.deps ## rebuild the extension in debug mode (fast compile, slow code)
	$(BIN)/maturin develop --quiet

.PHONY: demo
demo: install ## the main job: compile a toy decoder piecewise with Inductor and check it
	$(BIN)/python -m fxcodegen demo

.PHONY: lint
lint: $(VENV)/.deps ## cargo fmt --check, clippy -D warnings, ruff
	cargo fmt --check
	cargo clippy --all-targets -- -D warnings
	cargo clippy --all-targets --no-default-features -- -D warnings
	$(BIN)/ruff check python tests benches
	$(BIN)/ruff format --check python tests benches

.PHONY: format
format: $(VENV)/.deps ## apply cargo fmt and ruff format
	cargo fmt
	$(BIN)/ruff format python tests benches
	$(BIN)/ruff check --fix python tests benches

.PHONY: test-rust
test-rust: ## cargo test of the pure-Rust core (unit, golden, property and fuzz-loop tests)
	cargo test --no-default-features --profile ci

.PHONY: redis
redis: ## install redis-server (the cache tests start their own on a loopback port)
	@command -v redis-server >/dev/null || { \
		if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
		$$SUDO apt-get update -q && $$SUDO apt-get install -y -q redis-server; }

.PHONY: test-py
test-py: install redis ## pytest: the whole Python suite, slow Inductor tests included
	$(BIN)/pytest tests -q

.PHONY: test-fast
test-fast: install redis ## pytest without the slow Inductor tests (the quick loop; CI runs `make test`)
	$(BIN)/pytest tests -q -m "not slow"

.PHONY: bench-smoke
bench-smoke: install ## run every benchmark once on tiny sizes (checks they still work)
	FXCODEGEN_BENCH_SMOKE=1 $(BIN)/pytest benches -q --benchmark-disable

.PHONY: test
test: install lint test-rust test-py bench-smoke ## everything CI runs: lints, Rust tests, Python tests, bench smoke

.PHONY: bench
bench: install ## codegen benchmarks vs baselines (table + JSON) and the Rust criterion bench
	$(BIN)/python -m fxcodegen bench --json benches/results.json
	cargo bench --no-default-features --bench emit

.PHONY: fuzz
fuzz: ## long fuzz-loop run of the serialized-node-list reader (FUZZ_ITERS, default 2M)
	FXCODEGEN_FUZZ_ITERS=$${FUZZ_ITERS:-2000000} cargo test --no-default-features --profile ci --test serial_fuzz -- --nocapture

.PHONY: clean
clean: ## remove build outputs (keeps .venv)
	cargo clean
	rm -f python/fxcodegen/_core*.so
