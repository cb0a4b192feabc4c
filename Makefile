# One-command entry points. `make demo` and `make test` each set up everything they need first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
SAMPLE ?= samples/mixed.pcapng
LAKE ?= out/lake

.PHONY: setup system-deps demo lint test test-slow captures bench fuzz clean

# The decoders' per-packet modules are compiled at install (setup.py, ingest/compiled.py): a change
# to any of them rebuilds, so that `make test` and `make demo` never run a stale build.
$(BIN)/amqpscope: setup.cfg pyproject.toml setup.py $(wildcard ingest/*.py)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[spark,test]'
	touch $@

# The front-end files the report and the Data Docs load from disk (package/web_assets.py), from
# the npm registry at the versions package-lock.json pins; none is committed.
WEB := package/web
$(WEB)/node_modules/.package-lock.json: $(WEB)/package.json $(WEB)/package-lock.json
	cd $(WEB) && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error

setup: $(BIN)/amqpscope $(WEB)/node_modules/.package-lock.json

# System packages the live tests and the reference decoder need (root or sudo; skipped when present).
system-deps:
	bash .ci/system-deps.sh

demo: setup
	$(BIN)/amqpscope analyze $(SAMPLE) --lake $(LAKE) --report out/report.html

# ruff (configured in pyproject.toml): lint, and the code as its formatter writes it.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Two workers (one a core), each test module on one worker with its own Spark session. The slow
# tier (whole jobs re-run in other processes: killed at each stage, on a standalone cluster, on a
# full disk) runs with `make test-slow`; both are docs/TESTING.md's.
test: setup system-deps lint
	$(BIN)/python -m pytest -n 2 --dist loadfile -m "not slow"

test-slow: setup system-deps
	$(BIN)/python -m pytest -m slow

# Regenerates the bundled samples (root: tcpdump on lo) with the testbed, which runs from the
# repository's root (it is not in the wheel). See samples/README.md.
captures: setup system-deps
	$(BIN)/python -m testbed capture --out samples --scenario amqp091_qos_confirms --scenario amqp10_credit
	$(BIN)/python -m testbed capture --out samples --scenario mixed --pcapng

# Benchmarks (minutes; results go to docs/BENCHMARKS.md by hand, with the machine).
bench: setup system-deps
	$(BIN)/python benchmarks/decode.py
	$(BIN)/python benchmarks/flow_state.py --frames 10000000
	$(BIN)/python benchmarks/ingest.py
	$(BIN)/python benchmarks/end_to_end.py
	$(BIN)/python benchmarks/engines.py

# A long fuzz run of the per-packet decoder (docs/RELIABILITY.md), compiled and as Python source side
# by side, FUZZ_MINUTES each (default 30); findings are kept in tests/fuzz_crashes/ as regression tests.
FUZZ_MINUTES ?= 30
FUZZ_SEED ?= 12
fuzz: setup
	mkdir -p out/fuzz
	$(BIN)/python -m tests.fuzz --minutes $(FUZZ_MINUTES) --seed $(FUZZ_SEED) --summary out/fuzz/compiled.json \
	  > out/fuzz/compiled.log 2>&1 & compiled=$$!; \
	AMQPSCOPE_PURE_PYTHON=1 $(BIN)/python -m tests.fuzz --minutes $(FUZZ_MINUTES) --seed $(FUZZ_SEED) \
	  --summary out/fuzz/python.json > out/fuzz/python.log 2>&1; python_status=$$?; \
	wait $$compiled; compiled_status=$$?; \
	cat out/fuzz/compiled.json out/fuzz/python.json; \
	test $$compiled_status -eq 0 -a $$python_status -eq 0

clean:
	rm -rf out build *.egg-info ingest/*.so ingest/_compiled_sources.json $(WEB)/node_modules
