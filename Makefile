# The two commands of the README; each sets itself up first (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
export PATH := $(abspath $(VENV))/bin:$(PATH)
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 RAY_USAGE_STATS_ENABLED=0
export FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1

RUN_CONFIG ?= conf/sftp.toml
FEDERATION ?= num-supernodes=4 client-resources-num-cpus=1

.PHONY: setup run test test-slow lint bench-overhead bench-scale

setup:
	@./tools/setup.sh

# SFT-P's preset runs beside its floor and ceiling (tools/sftp_references.py); any other preset runs alone.
RUN_TOOL = $(if $(filter conf/sftp.toml,$(RUN_CONFIG)),tools.sftp_references,tools.launch)

run: setup
	$(PY) -m $(RUN_TOOL) --run-config $(RUN_CONFIG) $(if $(ARGS),--run-config "$(ARGS)") --federation-config "$(FEDERATION)"

test: setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q

test-slow: setup
	$(PY) -m pytest -q -m slow

bench-overhead: setup
	$(PY) -m tools.bench_overhead

bench-scale: setup
	$(PY) -m tools.bench_scale $(ARGS)
