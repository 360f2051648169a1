"""Fixtures for operator integration tests: CRD installed, operator running with chart RBAC."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from localcluster import controlplane
from tests import hostile_specs as hs
from tests.integration import harness


# Package scope: it stops when this package's tests end. A session operator outlived them,
# so `pytest tests/integration tests/e2e` ran two operators on the e2e suite's jobs (this one
# with the stand-in worker's settings): the OOM test's job "Succeeded" with no OOM at all.
@pytest.fixture(scope="package")
def operator(
    cluster: controlplane.Cluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[harness.Operator]:
    harness.install_crd(cluster)
    # with the runtime profile the hostile table's profile cases name (tests/hostile_specs.py),
    # and a fabric's (host network, host path, privileged daemon) for the admission tests
    profiles = json.dumps({hs.PROFILE: hs.PROFILE_SPEC, hs.FABRIC_PROFILE: hs.FABRIC_SPEC})
    kubeconfig = harness.install_rbac(cluster, json_values=[f"runtimeProfiles={profiles}"])
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
