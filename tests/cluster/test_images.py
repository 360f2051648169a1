"""What the images ship, read from inside them: the product, its own dependencies, nothing of
the test cluster."""

from __future__ import annotations

import json
import shutil

import pytest

from localcluster import images

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None, reason="needs podman (a container engine) to run the images"
)

_PROBE = (
    "import importlib.util, json; "
    "print(json.dumps(sorted(m for m in ('fsdp_operator', 'fsdp_worker', 'localcluster', "
    "'harness', 'kopf', 'kubernetes', 'torch') if importlib.util.find_spec(m))))"
)


def _modules(ref: str) -> set[str]:
    return set(json.loads(images.python_in(ref, _PROBE).strip().splitlines()[-1]))


def test_the_operator_image_has_the_operator_and_neither_torch_nor_the_test_cluster() -> None:
    assert _modules(images.OPERATOR) == {"fsdp_operator", "fsdp_worker", "kopf", "kubernetes"}


def test_the_worker_image_has_torch_and_no_kubernetes_client_nor_the_test_cluster() -> None:
    """Workers hold no credentials: no Kubernetes client in their image."""
    assert _modules(images.WORKER) == {"fsdp_operator", "fsdp_worker", "torch"}
