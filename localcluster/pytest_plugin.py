"""pytest fixtures for tests against the local cluster: one control plane per test session.

Enable with ``pytest_plugins = ["localcluster.pytest_plugin"]`` in ``tests/conftest.py``.

- ``cluster`` (session): a started :class:`~localcluster.controlplane.Cluster`, torn down at the
  end of the session whatever happened. With ``FSDPOP_CLUSTER_STATE=<dir>`` the tests reuse a
  cluster already started there by ``python -m localcluster up`` and leave it running.
- ``kube_namespace`` (function): a fresh namespace, deleted (without waiting) afterwards.

This plugin only provides fixtures; tests that use them carry ``@pytest.mark.cluster``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import controlplane, images


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("localcluster")
    group.addoption(
        "--cluster-nodes",
        type=int,
        default=3,
        help="kubelet nodes for the session cluster",
    )
    group.addoption("--cluster-gpus-per-node", type=int, default=8)


@pytest.fixture(scope="session")
def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[controlplane.Cluster]:
    """The session's cluster: admin kubeconfig at ``cluster.kubeconfig``."""
    if reuse := os.environ.get("FSDPOP_CLUSTER_STATE"):
        yield controlplane.Cluster.attach(Path(reuse))
        return
    # Idempotent and quick when nothing changed; the first build of the torch image is minutes.
    images.build(images.TEST_TARGETS)
    nodes = controlplane.NodeOptions(
        nodes=int(request.config.getoption("--cluster-nodes")),
        gpus_per_node=int(request.config.getoption("--cluster-gpus-per-node")),
        images=images.TEST_IMAGES,
    )
    started = controlplane.Cluster.up(tmp_path_factory.mktemp("cluster"), nodes=nodes)
    try:
        yield started
    finally:
        started.down()


@pytest.fixture
def kube_namespace(cluster: controlplane.Cluster) -> Iterator[str]:
    """A namespace of its own for one test."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
