"""Fixtures for operator integration tests: CRD installed, operator running with chart RBAC."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import controlplane
from tests.integration import harness


@pytest.fixture(scope="session")
def operator(
    cluster: controlplane.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.Operator]:
    harness.install_crd(cluster)
    kubeconfig = harness.install_rbac(cluster)
    op = harness.Operator(cluster, kubeconfig, Path(tmp_path_factory.mktemp("operator")))
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def jobs(operator: harness.Operator, kube_namespace: str) -> harness.Jobs:
    j = harness.Jobs(operator.cluster, kube_namespace)
    j.ensure_pvc()
    return j
