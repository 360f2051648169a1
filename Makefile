# One entry point for people and CI. Every target installs what it needs, idempotently.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
export FSDPOP_CACHE ?= $(HOME)/.cache/fsdp-operator

.PHONY: venv cluster-bin lint typecheck test test-unit test-worker demo clean bench gpu-check
.PHONY: worker-compat

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

test-worker: venv
	$(VPY) -m pytest -q tests/worker

# The CUDA tests alone (tests/worker/test_cuda.py; each is skipped without a GPU). On a GPU
# machine without this venv: tests/worker/gpu_check.sh (docs/worker.md, "GPU check").
gpu-check: venv
	GPU_PY=$(VPY) bash tests/worker/gpu_check.sh

# The worker tests against another torch release, in its own venv (pyproject pins what the
# worker image ships; this is how a bump is tried): make worker-compat TORCH=2.15.0
TORCH ?= 2.15.0
worker-compat:
	test -x .venv-torch-$(TORCH)/bin/python || $(PY) -m venv .venv-torch-$(TORCH)
	.venv-torch-$(TORCH)/bin/python -m pip install -q torch==$(TORCH) 'pydantic>=2.7,<3' pyyaml \
		'prometheus-client>=0.20' numpy pytest pytest-timeout
	PYTHONPATH=worker:tests/worker .venv-torch-$(TORCH)/bin/python -m pytest -q -p no:cacheprovider \
		-o addopts= tests/worker

demo: venv cluster-bin
	$(VPY) -m localcluster.demo

# Both benchmarks; numbers land in bench/results/ (docs/operator.md and
# docs/worker.md, "Benchmarks").
bench: venv cluster-bin
	PYTHONPATH=. $(VPY) bench/operator_recovery.py
	$(VPY) bench/worker_ckpt.py --reps 7

clean:
	rm -rf $(VENV) .venv-torch-* .cluster
