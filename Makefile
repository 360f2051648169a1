# One entry point for people and CI. Every target installs what it needs, idempotently.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
export FSDPOP_CACHE ?= $(HOME)/.cache/fsdp-operator

.PHONY: venv cluster-bin lint typecheck test test-unit test-worker test-cluster demo clean bench

venv: $(STAMP)

$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q -e '.[operator,worker,dev]'
	rm -f $(VENV)/.installed-*; touch $@

cluster-bin:
	bash localcluster/build-binaries.sh >/dev/null
	bash localcluster/build-helm.sh >/dev/null

lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy

test: venv cluster-bin lint typecheck
	$(VPY) -m pytest -q -p no:cacheprovider

test-unit: venv
	$(VPY) -m pytest -q tests/unit

demo: venv cluster-bin
	$(VPY) -m localcluster.demo

bench: venv
	$(VPY) bench/run_all.py

clean:
	rm -rf $(VENV) .cluster
