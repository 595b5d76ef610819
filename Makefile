# Linkpack: every target installs what it needs into .venv from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
SHARED ?= ../shared
export LINKPACK_SHARED ?= $(abspath $(SHARED))

.PHONY: demo test lint typecheck imports unit bench-placement bench-cluster bench-extender bench clean proto

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

proto: $(VENV)/.installed
	$(PY) -m node_agent.deviceplugin.build_proto

demo: $(VENV)/.installed proto
	$(PY) -m demo

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(VENV)/.installed proto
	$(VENV)/bin/mypy topology extender node_agent demo

imports: $(VENV)/.installed
	$(VENV)/bin/lint-imports

test: $(VENV)/.installed proto lint typecheck imports
	$(PY) -m tests.cluster.binaries
	$(PY) -m pytest -q

bench-placement: $(VENV)/.installed
	$(PY) -m bench.placement

bench-cluster: $(VENV)/.installed
	$(PY) -m bench.cluster

bench-extender: $(VENV)/.installed proto
	$(PY) -m bench.extender
	$(PY) -m bench.scheduler_throughput

bench: bench-placement bench-cluster bench-extender

clean:
	rm -rf $(VENV) build node_agent/deviceplugin/_generated
