"""`make kind-e2e`: the same end-to-end suite on a kind cluster, where a Docker engine exists."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from harness import stack

NO_DOCKER = (
    "make kind-e2e needs a running Docker engine (kind runs its nodes as containers) and this "
    "machine has none; tests/e2e runs here against the local cluster's kubelet nodes instead"
)


def _docker_engine() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, check=False).returncode == 0


# Inside make kind-e2e itself (FSDP_E2E_KUBECONFIG set) it would start itself again.
@pytest.mark.skipif(
    not _docker_engine() or bool(os.environ.get("FSDP_E2E_KUBECONFIG")), reason=NO_DOCKER
)
def test_kind_e2e_passes() -> None:
    done = subprocess.run(["make", "kind-e2e"], cwd=stack.ROOT, timeout=5400, check=False)
    assert done.returncode == 0
