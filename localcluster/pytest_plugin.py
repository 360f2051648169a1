"""pytest fixtures for tests against the local cluster: one control plane per test session.

Enable with ``pytest_plugins = ["localcluster.pytest_plugin"]`` in ``tests/conftest.py``.

- ``cluster`` (session): a started :class:`~localcluster.controlplane.Cluster`, torn down at the
  end of the session whatever happened. It is started after collection, before the first test,
  when a collected test needs it (outside every test's timeout). With
  ``FSDPOP_CLUSTER_STATE=<dir>`` the tests reuse a cluster already started there by
  ``python -m localcluster up`` and leave it running.
- ``kube_namespace`` (function): a fresh namespace, deleted (without waiting) afterwards.

This plugin only provides fixtures; tests that use them carry ``@pytest.mark.cluster``.
"""

from __future__ import annotations

import os
import tempfile
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


_EARLY = pytest.StashKey[dict[str, object]]()


def _start(config: pytest.Config) -> controlplane.Cluster:
    # Idempotent and quick when nothing changed; the first build of the torch image is minutes.
    images.build(images.TEST_TARGETS)
    nodes = controlplane.NodeOptions(
        nodes=int(config.getoption("--cluster-nodes")),
        gpus_per_node=int(config.getoption("--cluster-gpus-per-node")),
        images=images.TEST_IMAGES,
    )
    factory = getattr(config, "_tmp_path_factory", None)  # pytest's own, as tmp_path_factory
    state = (
        factory.mktemp("cluster")
        if isinstance(factory, pytest.TempPathFactory)
        else Path(tempfile.mkdtemp(prefix="fsdpop-cluster-"))
    )
    return controlplane.Cluster.up(state, nodes=nodes)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the session's cluster once collection shows a test needs it, before any test runs:
    on a fresh machine the first import of the 7 GB worker image into each node's store (cached
    after) takes minutes, longer than the per-test timeout the fixture's first user would put
    on it. Cluster.up bounds itself."""
    if os.environ.get("FSDPOP_CLUSTER_STATE") or session.config.option.collectonly:
        return
    if not any("cluster" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    early: dict[str, object] = {}
    try:
        early["cluster"] = _start(session.config)
    except Exception as exc:  # each test that needs the cluster fails with this, not the run
        early["error"] = exc
    session.config.stash[_EARLY] = early


def pytest_sessionfinish(session: pytest.Session) -> None:
    started = session.config.stash.get(_EARLY, {}).get("cluster")
    if isinstance(started, controlplane.Cluster):
        started.down()


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[controlplane.Cluster]:
    """The session's cluster: admin kubeconfig at ``cluster.kubeconfig``."""
    if reuse := os.environ.get("FSDPOP_CLUSTER_STATE"):
        yield controlplane.Cluster.attach(Path(reuse))
        return
    early = request.config.stash.get(_EARLY, {})
    if isinstance(error := early.get("error"), Exception):
        raise error
    if isinstance(started := early.get("cluster"), controlplane.Cluster):
        yield started  # pytest_sessionfinish takes it down
        return
    started = _start(request.config)  # not seen at collection (a test asking for it by name)
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
