# The two commands of the README (`make run`, `make test`) and their helpers; each sets itself up first
# (idempotent). Every target calls the `fedprune` command that `make setup` installs into .venv/bin.
VENV ?= .venv
PY := $(VENV)/bin/python
FEDPRUNE := $(VENV)/bin/fedprune
export PATH := $(abspath $(VENV))/bin:$(PATH)
# offline unless you set these yourself (HF_HUB_OFFLINE=0 make run ... lets a Hub model download)
HF_HUB_OFFLINE ?= 1
HF_DATASETS_OFFLINE ?= 1
TRANSFORMERS_OFFLINE ?= 1
export HF_HUB_OFFLINE HF_DATASETS_OFFLINE TRANSFORMERS_OFFLINE TOKENIZERS_PARALLELISM=false
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1
# a local simulation's Ray listens on 127.0.0.1 only (docs/reliability.md#network-exposure-of-a-local-simulation)
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0

RUN_CONFIG ?= conf/sftp.toml
FEDERATION ?= num-supernodes=4 client-resources-num-cpus=1

.PHONY: setup run run-references smoke smoke-all test test-slow lint bench-overhead bench-scale

setup:
	@./scripts/setup.sh

# The main job: one Flower simulation of the preset (SFT-P by default).
run: setup
	$(FEDPRUNE) run --run-config $(RUN_CONFIG) $(if $(ARGS),--run-config "$(ARGS)") \
		--federation-config "$(FEDERATION)"

# SFT-P beside its floor (the post hoc cut) and ceiling (every gate open): three simulations in a row.
run-references: setup
	$(FEDPRUNE) run --references --run-config $(RUN_CONFIG) $(if $(ARGS),--run-config "$(ARGS)") \
		--federation-config "$(FEDERATION)"

# The quick check: the smoke preset (1 round, small splits), a few minutes; ARGS="method='sftp'" swaps method.
smoke: setup
	$(FEDPRUNE) run --run-config conf/smoke.toml $(if $(ARGS),--run-config "$(ARGS)") \
		--federation-config "$(FEDERATION)"

# Every method through the smoke preset, one after another (~20 min): a table of times and broken-model flags.
smoke-all: setup
	./scripts/smoke_all.sh

test: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench-overhead: setup
	$(FEDPRUNE) bench overhead

bench-scale: setup
	$(FEDPRUNE) bench scale $(ARGS)
