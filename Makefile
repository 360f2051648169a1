# One entry point for people and CI. Every target installs what it needs, idempotently.
SHELL := /bin/bash
PY ?= python3.11
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml requirements/dev-overrides.txt | sha256sum | cut -c1-12)
export FSDPOP_CACHE ?= $(HOME)/.cache/fsdp-operator

.PHONY: venv cluster-bin lint typecheck test test-unit test-worker demo clean bench gpu-check
.PHONY: worker-compat images kind-e2e packages bench-goodput bench-failover bench-node-loss
.PHONY: kwok-bin versitygw-bin kueue-bin scheduler-plugins-bin bench-fleet lock bench-in-place bench-memory-tier
.PHONY: bench-gang-scale krew-bin release-artifacts bench-fast-hang

venv: $(STAMP)

# uv, not pip, resolves the venv: it holds the operator's and the worker's packages together,
# whose python-dateutil bounds disagree (requirements/dev-overrides.txt says why); pip's resolver
# backtracked through every botocore release for more than 15 minutes before giving up.
$(STAMP): pyproject.toml requirements/dev-overrides.txt
	@command -v $(PY) >/dev/null || { echo "need $(PY)"; exit 1; }
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip 'uv>=0.9'
	$(VENV)/bin/uv pip install -q --python $(VPY) --override requirements/dev-overrides.txt \
		-e '.[operator,worker,dev]'
	rm -f $(VENV)/.installed-*; touch $@

# Debian packages for the nodes and image builds (one target: two apt-gets cannot overlap).
packages:
	bash localcluster/install-packages.sh

# Compiling needs only Go: the targets that start nodes name `packages` (or `images`) themselves.
cluster-bin:
	bash localcluster/build-helm.sh >/dev/null & helm=$$!; \
	bash localcluster/build-binaries.sh >/dev/null && wait $$helm

# kwok (fake nodes and pods for the simulated GPU fleet, localcluster/kwok.py) and the stage
# files it plays, from its Go module into the cache; tests/cluster/test_kwok.py needs it.
kwok-bin:
	bash localcluster/build-kwok.sh >/dev/null

# versitygw (an S3 API server over a directory: the local cluster's object store for
# checkpoints, localcluster/build-versitygw.sh) from its Go module into the cache.
versitygw-bin:
	bash localcluster/build-versitygw.sh >/dev/null

# krew (kubectl's plugin manager) from its Go module into the cache:
# tests/cluster/test_release_artifacts.py installs the release's kubectl-fsdp archive with it.
krew-bin:
	bash localcluster/build-krew.sh >/dev/null

# Kueue (the queueing controller, localcluster/kueue.py) with its CRDs and webhook manifests,
# from its Go module into the cache; tests/integration/test_kueue.py needs it.
kueue-bin:
	bash localcluster/build-kueue.sh >/dev/null

# scheduler-plugins' kube-scheduler (Coscheduling, localcluster/schedulerplugins.py) and its
# PodGroup CRD, from its Go module into the cache; tests/integration/test_gang_scheduler.py needs it.
scheduler-plugins-bin:
	nice -n 15 bash localcluster/build-scheduler-plugins.sh >/dev/null

# `ruff format` owns layout. `# fmt: skip` belongs only on an aligned table, and there is
# none today: a new one must raise this allowance in the same change (hack/fmt_skips.py).
FMT_SKIPS_MAX := 0

lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VPY) -m hack.fmt_skips --max $(FMT_SKIPS_MAX)

typecheck: venv
	$(VENV)/bin/mypy

# The images' hash-locked requirements (requirements/*.lock, installed by the Dockerfile with
# --require-hashes), resolved from pyproject.toml for the images' Python and platform. Run it
# after changing a dependency; tests/unit/test_locks.py fails until the locks agree.
LOCK_ARGS := --generate-hashes --no-header --no-annotate --quiet --python-version 3.11 \
	--python-platform x86_64-manylinux_2_28
# fsdpctl's lock (what the krew archives of hack/krew.py vendor) is for every platform krew
# serves, constrained by the operator's, so the CLI ships the versions the operator image runs
# (tests/unit/test_locks.py checks).
CLI_LOCK_ARGS := --generate-hashes --no-header --no-annotate --quiet --python-version 3.11 \
	-c requirements/operator.lock
lock: venv
	mkdir -p requirements
	$(VENV)/bin/uv pip compile pyproject.toml --extra operator $(LOCK_ARGS) -o requirements/operator.lock
	$(VENV)/bin/uv pip compile pyproject.toml --extra worker $(LOCK_ARGS) -o requirements/worker.lock
	$(VENV)/bin/uv pip compile pyproject.toml --extra cli --universal $(CLI_LOCK_ARGS) -o requirements/cli.lock

# What the release workflow attaches, built here into dist/: the fsdp-operator wheel (fsdpctl),
# the fsdp-kit wheel (the trainer kit for a team's own image) and kubectl-fsdp's krew archives
# with their manifest fsdp.yaml (hack/krew.py; its wheels from PyPI, checked against
# requirements/cli.lock's hashes).
release-artifacts: venv
	mkdir -p dist
	$(VPY) -m pip wheel -q --no-deps --no-build-isolation -w dist .
	$(VPY) -m hack.kit build --out dist
	$(VPY) -m hack.krew build --out dist

# The project's images, built here with podman from a Debian base (docs/images.md); the
# cluster tests load them into every node's containerd, by digest.
images: venv packages
	$(VPY) -m localcluster.images build --target all

# With -j (.ci/run) make starts these in this order: the Go builds of the control plane (the
# longest chain) first, the venv's download beside them, then the images, kwok, and lint and
# typecheck last. `packages` (seconds once installed) goes before the venv: listed after it,
# make -j2 passed over the images while the packages installed and started another build in
# that slot instead (seen on a fresh machine). Kueue builds beside pytest: on a fresh machine
# its 5-8 minutes of compiling (niced) then fill the cluster tests' waits, and the Kueue tests,
# which come after those, run the same script and wait on its lock if it is not done yet.
# scheduler-plugins' kube-scheduler builds the same way just before it (~6.5 minutes fresh,
# seconds cached): tests/integration/test_gang_scheduler.py comes before the Kueue tests.
# tests/unit and tests/worker (CPU: real torchrun ranks, no cluster) run niced beside the
# cluster suites, whose time is mostly waiting on the control plane, the kubelets and the
# operator; their report is printed once the cluster suites end (the log: $(CPU_LOG)). The
# stand-in suites go first, so that those 10 minutes overlap them and not tests/e2e's real
# torch ranks (run after them, each e2e scenario took 50 s longer beside the CPU suites).
# tests/unit/test_release.py checks that these two lists name every test directory.
CPU_LOG := .test-unit-worker.log
CLUSTER_TESTS := tests/cluster tests/integration tests/e2e
test: cluster-bin packages venv images kwok-bin versitygw-bin krew-bin lint typecheck
	{ nice -n 10 bash localcluster/build-scheduler-plugins.sh; \
	  nice -n 10 bash localcluster/build-kueue.sh; } >/dev/null 2>&1 & kueue=$$!; \
	nice -n 10 $(VPY) -m pytest -q -p no:cacheprovider --durations=15 tests/unit tests/worker \
		>$(CPU_LOG) 2>&1 & cpu=$$!; trap 'kill $$cpu $$kueue 2>/dev/null' INT TERM; \
	$(VPY) -m pytest -q -p no:cacheprovider --durations=25 $(CLUSTER_TESTS); rc=$$?; \
	wait $$cpu; crc=$$?; echo "== tests/unit and tests/worker (ran beside the above) =="; \
	cat $(CPU_LOG); wait $$kueue; test $$rc -eq 0 -a $$crc -eq 0

test-unit: venv
	$(VPY) -m pytest -q tests/unit

test-worker: venv
	$(VPY) -m pytest -q tests/worker

# The CUDA tests alone (tests/worker/test_cuda.py; each is skipped without a GPU). On a GPU
# machine without this venv: tests/worker/gpu_check.sh (docs/worker.md, "GPU check").
gpu-check: venv
	GPU_PY=$(VPY) bash tests/worker/gpu_check.sh

# The worker tests against another torch release, in its own venv (pyproject pins what the
# worker image ships; this is how a bump is tried): make worker-compat TORCH=2.14.1
TORCH ?= 2.14.1
worker-compat:
	test -x .venv-torch-$(TORCH)/bin/python || $(PY) -m venv .venv-torch-$(TORCH)
	.venv-torch-$(TORCH)/bin/python -m pip install -q torch==$(TORCH) 'pydantic>=2.7,<3' pyyaml \
		'prometheus-client>=0.20' numpy pytest pytest-timeout
	PYTHONPATH=worker:tests/worker .venv-torch-$(TORCH)/bin/python -m pytest -q -p no:cacheprovider \
		-o addopts= tests/worker

demo: venv cluster-bin images
	$(VPY) -m harness.demo

# Both benchmarks; numbers land in bench/results/ (docs/benchmarks.md and
# docs/worker.md, "Benchmarks").
bench: venv cluster-bin images
	PYTHONPATH=. $(VPY) bench/operator_recovery.py
	PYTHONPATH=. $(VPY) bench/pod_start.py
	$(VPY) bench/worker_ckpt.py --reps 7

# Node loss with the control plane at Kubernetes' defaults (50 s node grace, kubelet Leases of
# 40 s), by Lease and by NotReady, and an API-server stall longer than a Lease:
# bench/results/node_loss_production.json (about 10 minutes).
bench-node-loss: venv cluster-bin images
	PYTHONPATH=. $(VPY) bench/operator_recovery.py --production-defaults --node-losses 2

# A rank's crash -> the next first step, gang recreated against restarted in place
# (failurePolicy.inPlaceRestarts), on the same draws: bench/results/in_place.json (5 minutes).
bench-in-place: venv cluster-bin images
	PYTHONPATH=. $(VPY) bench/operator_recovery.py --in-place 5

# The memory tier against the claim on the same 1.13 GiB state (CPU only, a few minutes):
# blocking save and same-size load; bench/results/memory_tier.json.
bench-memory-tier: venv
	PYTHONPATH=. $(VPY) bench/memory_tier.py

# A hang restarted in place: failurePolicy.hangStepTimes 3 against the progress deadline alone,
# alternating (CPU only, a few minutes): bench/results/fast_hang.json.
bench-fast-hang: venv
	PYTHONPATH=. $(VPY) bench/fast_hang.py

# The goodput soak alone (about an hour here): auto against fixed checkpoint intervals under a
# Poisson fault process; bench/results/goodput.json and docs/goodput.png.
GOODPUT_ARGS ?=
bench-goodput: venv cluster-bin images
	PYTHONPATH=. $(VPY) bench/goodput.py $(GOODPUT_ARGS)

# Leader failover: SIGKILL and clean shutdown of the leader, 10 trials each (about 7 minutes);
# bench/results/failover.json.
bench-failover: venv packages cluster-bin
	PYTHONPATH=. $(VPY) bench/failover.py

# The operator at fleet scale (tens of minutes at the defaults): a control plane with a thousand
# kwok GPU nodes, 100 and 1000 jobs; bench/results/fleet.json and docs/fleet.png.
FLEET_ARGS ?=
bench-fleet: venv packages cluster-bin kwok-bin
	PYTHONPATH=. $(VPY) bench/fleet.py $(FLEET_ARGS)

# One gang of 8 to 1,024 simulated nodes (real keepers and coordinator over 127.0.0.1, rank
# stand-ins), this tree against the 0.2 s-poll keeper of GANG_SCALE_BEFORE in the same run;
# bench/results/gang_scale.json and docs/gang_scale.png (about 10 minutes).
GANG_SCALE_BEFORE ?= b8820a6
GANG_SCALE_ARGS ?= --before $(GANG_SCALE_BEFORE)
bench-gang-scale: venv
	PYTHONPATH=. $(VPY) bench/gang_scale.py $(GANG_SCALE_ARGS)

# tests/e2e on a kind cluster, where a Docker engine exists (a hosted runner, a laptop; not
# this project's machines): builds the images with docker, loads them, runs the suite.
KIND_VERSION ?= v0.30.0
KIND := $(FSDPOP_CACHE)/kind-$(KIND_VERSION)/kind
E2E_DIR := /tmp/fsdp-e2e
kind-e2e: venv
	docker info >/dev/null 2>&1 || { echo "kind-e2e needs a running Docker engine"; exit 1; }
	test -x $(KIND) || GOBIN=$(dir $(KIND)) go install sigs.k8s.io/kind@$(KIND_VERSION)
	mkdir -p $(E2E_DIR)
	$(KIND) get clusters | grep -qx fsdp-e2e || $(KIND) create cluster --name fsdp-e2e \
		--config tests/e2e/kind-config.yaml --kubeconfig $(E2E_DIR)/kubeconfig --wait 120s
	docker build --target operator -t fsdp-operator:e2e .
	docker build --target worker -t fsdp-worker:e2e .
	$(KIND) load docker-image --name fsdp-e2e fsdp-operator:e2e fsdp-worker:e2e
	FSDP_E2E_KUBECONFIG=$(E2E_DIR)/kubeconfig FSDP_E2E_FAULTS=kind \
		FSDP_E2E_HOST_DIR=$(E2E_DIR) FSDP_E2E_NODE_DIR=/fsdp-e2e \
		FSDP_E2E_WORKER_IMAGE=docker.io/library/fsdp-worker:e2e \
		FSDP_E2E_OPERATOR_IMAGE=docker.io/library/fsdp-operator:e2e \
		$(VPY) -m pytest -q -p no:cacheprovider tests/e2e; rc=$$?; \
		$(KIND) delete cluster --name fsdp-e2e; exit $$rc

clean:
	rm -rf $(VENV) .venv-torch-* .cluster
