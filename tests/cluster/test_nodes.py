"""The nodes are real kubelets with containerd: what a user of the cluster sees of them.

The pod's phase, exit code, reason and termination message; the environment, volumes and
hostname a container is promised; deletion honouring the grace period; a lost node turning
NotReady through the node lifecycle controller while its containers keep running; GPU
capacity advertised as an extended resource.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from localcluster import poll
from localcluster.controlplane import Cluster
from localcluster.faults import Faults
from tests.cluster._podkit import (
    alive,
    apply,
    get_pod,
    node_ready,
    python_pod,
    running,
    terminated,
    wait_phase,
)

pytestmark = pytest.mark.cluster

SLEEPER = "import time\nwhile True: time.sleep(0.2)"


def taints(cluster: Cluster, node: str) -> set[str]:
    return {t["key"] for t in cluster.get_json("node", node)["spec"].get("taints", [])}


@pytest.fixture
def faults(cluster: Cluster) -> Faults:
    return Faults.for_cluster(cluster.state_dir)


def test_nodes_are_kubelets_on_containerd(cluster: Cluster) -> None:
    items = cluster.get_json("nodes")["items"]
    assert len(items) >= 2
    for node in items:
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.37.2"
        assert info["containerRuntimeVersion"].startswith("containerd://")
        assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        internal = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
        assert internal and not internal[0].startswith("127.")
    wide = cluster.kubectl("get", "nodes", "-o", "wide").stdout
    assert "containerd://" in wide


def test_pod_runs_in_a_container_and_succeeds(cluster: Cluster, kube_namespace: str) -> None:
    apply(cluster, kube_namespace, python_pod("ok", "print('hello from a kubelet node')"))
    pod = wait_phase(cluster, kube_namespace, "ok", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Succeeded"
    assert terminated(pod)["exitCode"] == 0
    assert terminated(pod)["reason"] == "Completed"
    nodes = {n["metadata"]["name"] for n in cluster.get_json("nodes")["items"]}
    assert pod["spec"]["nodeName"] in nodes
    assert pod["status"]["podIP"].startswith("10.")
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["PodScheduled"] == "True"
    assert conditions["Ready"] == "False"
    logs = cluster.kubectl("logs", "ok", "-n", kube_namespace).stdout
    assert logs == "hello from a kubelet node\n", "kubectl logs reaches the kubelet"


def test_failure_reports_exit_code_and_termination_message(
    cluster: Cluster, kube_namespace: str
) -> None:
    code = "import sys\nopen('/dev/termination-log','w').write('disk on fire')\nsys.exit(3)"
    apply(cluster, kube_namespace, python_pod("bad", code))
    pod = wait_phase(cluster, kube_namespace, "bad", ("Succeeded", "Failed"))
    assert pod["status"]["phase"] == "Failed"
    assert terminated(pod)["exitCode"] == 3
    assert terminated(pod)["reason"] == "Error"
    assert terminated(pod)["message"] == "disk on fire"


def test_environment_volumes_and_hostname(cluster: Cluster, kube_namespace: str) -> None:
    code = (
        "import os, socket, json\n"
        "open('/shared/out', 'w').write('x')\n"
        "out = {k: os.environ[k] for k in ('POD', 'NS', 'NODE', 'IP', 'TEAM', 'LINE')}\n"
        "out['host'] = socket.gethostname()\n"
        "out['cwd'] = os.getcwd()\n"
        "out['files'] = sorted(os.listdir('/shared'))\n"
        "open('/dev/shm/marker', 'w').write('x')\n"
        "mounts = [line.split() for line in open('/proc/self/mounts')]\n"
        "out['shm'] = [m[2] for m in mounts if m[1] == '/dev/shm'][-1]\n"
        "open('/dev/termination-log', 'w').write(json.dumps(out))\n"
    )
    pod = python_pod("env", code, labels={"team": "infra"}, hostname="worker-7")
    main = pod["spec"]["containers"][0]
    main["workingDir"] = "/shared"
    main["env"] = [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "TEAM", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}}},
        {"name": "LINE", "value": "$(POD)/$$(POD)/$(MISSING)"},
    ]
    main["volumeMounts"] = [
        {"name": "scratch", "mountPath": "/shared"},
        {"name": "shm", "mountPath": "/dev/shm"},
    ]
    pod["spec"]["volumes"] = [
        {"name": "scratch", "emptyDir": {}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
    ]
    apply(cluster, kube_namespace, pod)
    done = wait_phase(cluster, kube_namespace, "env", ("Succeeded", "Failed"))
    seen = json.loads(terminated(done)["message"])
    assert seen["POD"] == "env"
    assert seen["NS"] == kube_namespace
    assert seen["NODE"] == done["spec"]["nodeName"]
    assert seen["IP"] == done["status"]["podIP"]
    assert seen["TEAM"] == "infra"
    assert seen["LINE"] == "env/$(POD)/$(MISSING)"
    assert seen["host"] == "worker-7"
    assert seen["cwd"] == "/shared"
    assert seen["files"] == ["out"]
    assert seen["shm"] == "tmpfs", "a Memory emptyDir is memory-backed"
    assert not os.path.exists("/dev/shm/marker"), "and private to the pod"


def test_delete_stops_the_process_within_the_grace_period(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    stubborn = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + SLEEPER
    apply(cluster, kube_namespace, python_pod("stubborn", stubborn, grace=3))
    running(cluster, kube_namespace, "stubborn")
    pids = poll.until("pod pids", lambda: faults.pids(kube_namespace, "stubborn"))
    started = time.monotonic()
    cluster.kubectl("delete", "pod", "stubborn", "-n", kube_namespace, "--wait=false")
    poll.until("process gone", lambda: not any(alive(p) for p in pids), timeout=10)
    elapsed = time.monotonic() - started
    assert 2.0 < elapsed < 8.0, f"SIGTERM ignored, so SIGKILL after the 3 s grace; took {elapsed}"
    poll.until("pod object deleted", lambda: get_pod(cluster, kube_namespace, "stubborn") is None)


def test_lost_node_turns_not_ready_and_gets_no_new_pods(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    apply(cluster, kube_namespace, python_pod("victim", SLEEPER))
    node = running(cluster, kube_namespace, "victim")["spec"]["nodeName"]
    apply(cluster, kube_namespace, python_pod("doomed", SLEEPER, node=node))
    running(cluster, kube_namespace, "doomed")
    pids = faults.pids(kube_namespace, "victim")
    doomed = faults.pids(kube_namespace, "doomed")
    faults.lose_node(node)
    try:
        poll.until("NotReady", lambda: node_ready(cluster, node) != "True", timeout=60)
        poll.until(
            "the node lifecycle controller taints the node",
            lambda: "node.kubernetes.io/unreachable" in taints(cluster, node),
        )
        # What the operator does to pods on a lost node: force-delete them.
        cluster.kubectl(
            "delete", "pod", "doomed", "-n", kube_namespace, "--force", "--grace-period=0"
        )
        assert all(alive(p) for p in doomed), "partitioned: the node cannot know, a zombie runs"
        pinned = python_pod("pinned", "print(1)", node=node)
        apply(cluster, kube_namespace, pinned, python_pod("free", "print(1)"))
        free = wait_phase(cluster, kube_namespace, "free", ("Succeeded",))
        assert free["spec"]["nodeName"] != node
        time.sleep(3)
        pinned_now = get_pod(cluster, kube_namespace, "pinned")
        assert pinned_now is not None
        assert not pinned_now["spec"].get("nodeName"), "the scheduler avoids the lost node"
    finally:
        faults.restore_node(node)
    poll.until("Ready again", lambda: node_ready(cluster, node) == "True", timeout=60)
    assert all(alive(p) for p in pids), "a restored node's pods kept running"
    poll.until(
        "pods deleted meanwhile are killed on restore",
        lambda: not any(alive(p) for p in doomed),
        timeout=10,
    )
    wait_phase(cluster, kube_namespace, "pinned", ("Succeeded",), timeout=90)


def test_claim_is_shared_across_pods_and_on_failure_restarts(
    cluster: Cluster, kube_namespace: str, tmp_path: Path
) -> None:
    export = tmp_path / "export"
    export.mkdir()
    os.chown(export, 1000, 1000)
    volume = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": f"pv-{kube_namespace}"},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "manual",
            "hostPath": {"path": str(export)},
            "claimRef": {"namespace": kube_namespace, "name": "ckpt"},
        },
    }
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "ckpt"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "manual",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    # Fails until its second run, then leaves a count that the next pod reads.
    counter = (
        "import os, sys\np = '/ckpt/count'\n"
        "n = int(open(p).read()) + 1 if os.path.exists(p) else 1\n"
        "open(p, 'w').write(str(n))\nsys.exit(0 if n >= 2 else 5)\n"
    )
    mounts = {"volumes": [{"name": "c", "persistentVolumeClaim": {"claimName": "ckpt"}}]}
    first = python_pod("first", counter, extra={**mounts, "restartPolicy": "OnFailure"})
    first["spec"]["containers"][0]["volumeMounts"] = [{"name": "c", "mountPath": "/ckpt"}]
    try:
        cluster.kubectl("apply", "-f", "-", input=json.dumps(volume))
        apply(cluster, kube_namespace, claim, first)
        done = wait_phase(cluster, kube_namespace, "first", ("Succeeded", "Failed"))
        assert done["status"]["phase"] == "Succeeded"
        status = done["status"]["containerStatuses"][0]
        assert status["restartCount"] == 1
        assert status["lastState"]["terminated"]["exitCode"] == 5
        reader = python_pod("second", "print(open('/ckpt/count').read())", extra=mounts)
        reader["spec"]["containers"][0]["volumeMounts"] = [{"name": "c", "mountPath": "/ckpt"}]
        apply(cluster, kube_namespace, reader)
        wait_phase(cluster, kube_namespace, "second", ("Succeeded",))
        assert cluster.kubectl("logs", "second", "-n", kube_namespace).stdout == "2\n"
    finally:
        cluster.kubectl("delete", "pv", f"pv-{kube_namespace}", "--wait=false", check=False)
