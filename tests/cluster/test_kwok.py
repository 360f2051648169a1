"""The simulated GPU fleet: kwok's fake nodes under the real scheduler, unreachable pod addresses.

A control plane of its own (no kubelet nodes, so it runs beside a cluster that has them) and five
fake nodes. A restricted pod that tolerates the fleet's taint and asks for a GPU is placed by the
real scheduler, turns Running with an address no packet can reach, and fails with the exit code
``fail_pod`` gave it. kwok or the binaries failing to build fails these tests: nothing skips.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import controlplane, kwok, nodes, poll
from tests.cluster._podkit import RESTRICTED_CONTAINER

# The first run builds kwok from its Go module (about 80 s here) inside the first test's setup.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
FLEET = kwok.FleetOptions(nodes=5, gpus_per_node=8)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[kwok.Fleet]:
    state = Path(tmp_path_factory.mktemp("kwok")) / "cluster"
    cluster = controlplane.Cluster.up(state, nodes=controlplane.NodeOptions(nodes=0))
    try:
        with kwok.Fleet(cluster, FLEET) as started:
            yield started
    finally:
        cluster.down()


@pytest.fixture
def namespace(fleet: kwok.Fleet) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    doc = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
    }
    fleet.cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    try:
        yield name
    finally:
        fleet.cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def gpu_pod(name: str, *, tolerate: bool = True) -> dict[str, Any]:
    """A Pod Security "restricted" pod asking for one GPU on the fleet."""
    container = {
        "name": "main",
        "image": "registry.invalid/never-pulled:1",
        "command": ["run"],
        "securityContext": RESTRICTED_CONTAINER,
        "resources": {"limits": {nodes.GPU_RESOURCE: "1"}},
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "nodeSelector": kwok.NODE_SELECTOR,
        "tolerations": [kwok.toleration()] if tolerate else [],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def create(fleet: kwok.Fleet, namespace: str, pod: dict[str, Any]) -> None:
    fleet.cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))


def get(fleet: kwok.Fleet, namespace: str, name: str) -> dict[str, Any]:
    found: dict[str, Any] = fleet.cluster.get_json("pod", name, "-n", namespace)
    return found


def running(fleet: kwok.Fleet, namespace: str, name: str) -> dict[str, Any] | None:
    pod = get(fleet, namespace, name)
    return pod if pod["status"].get("phase") == "Running" and pod["status"].get("podIP") else None


def test_fake_nodes_are_ready_tainted_and_offer_gpus(fleet: kwok.Fleet) -> None:
    assert sorted(fleet.ready_nodes()) == sorted(FLEET.names())
    for name in FLEET.names():
        node = fleet.cluster.get_json("node", name)
        assert node["status"]["allocatable"][nodes.GPU_RESOURCE] == "8"
        assert node["metadata"]["labels"][kwok.FAKE_LABEL] == "true"
        assert {"key": kwok.FAKE_LABEL, "value": "true", "effect": "NoSchedule"} in node["spec"][
            "taints"
        ]


def test_scheduler_places_a_gpu_pod_that_runs_at_an_unreachable_address(
    fleet: kwok.Fleet, namespace: str
) -> None:
    create(fleet, namespace, gpu_pod("gpu"))
    pod = poll.until("pod Running", lambda: running(fleet, namespace, "gpu"), timeout=30)

    assert pod["spec"]["nodeName"] in FLEET.names()
    ip = pod["status"]["podIP"]
    assert ipaddress.ip_address(ip) in kwok.FAKE_POD_RANGE
    assert kwok.route_kind(ip) == "blackhole"
    started = time.monotonic()
    with pytest.raises(OSError) as refused, socket.create_connection((ip, 29500), timeout=5):
        pass
    assert refused.value.errno == errno.EINVAL  # a blackhole route: nothing was sent
    assert time.monotonic() - started < 0.5


def test_a_pod_without_the_toleration_is_not_scheduled(fleet: kwok.Fleet, namespace: str) -> None:
    create(fleet, namespace, gpu_pod("untolerated", tolerate=False))

    def unschedulable() -> bool:
        conditions = get(fleet, namespace, "untolerated")["status"].get("conditions") or []
        return any(
            c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable" for c in conditions
        )

    poll.until("PodScheduled=False, Unschedulable", unschedulable, timeout=30)
    assert not get(fleet, namespace, "untolerated")["spec"].get("nodeName")


def test_fail_pod_terminates_the_container_with_the_exit_code(
    fleet: kwok.Fleet, namespace: str
) -> None:
    create(fleet, namespace, gpu_pod("crash"))
    poll.until("pod Running", lambda: running(fleet, namespace, "crash"), timeout=30)

    fleet.fail_pod(namespace, "crash", 137)

    def failed() -> dict[str, Any] | None:
        pod = get(fleet, namespace, "crash")
        return pod if pod["status"].get("phase") == "Failed" else None

    pod = poll.until("pod Failed", failed, timeout=15)
    (status,) = pod["status"]["containerStatuses"]
    assert status["state"]["terminated"]["exitCode"] == 137
    assert status["state"]["terminated"]["reason"] == "Error"
