"""The local control plane acts as a real cluster: API, RBAC, PodSecurity, garbage collection."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from localcluster import poll
from localcluster.controlplane import Cluster, KubectlError

pytestmark = pytest.mark.cluster


def pod(
    name: str, *, security: dict[str, object] | None = None, owner: dict[str, str] | None = None
) -> str:
    container: dict[str, object] = {"name": "main", "image": "busybox", "command": ["true"]}
    if security:
        container["securityContext"] = security
    meta: dict[str, object] = {"name": name}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "v1", **owner}]
    spec = {
        "containers": [container],
        # No node carries this label: the pods stay Pending whether process nodes exist or not.
        "nodeSelector": {"fsdp-operator.test/never": "true"},
    }
    return json.dumps({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def test_apiserver_is_ready_and_every_component_runs(cluster: Cluster) -> None:
    assert cluster.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    assert all(cluster.component_status().values()), cluster.component_status()


def test_kubectl_talks_to_the_pinned_version(cluster: Cluster) -> None:
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.")
    assert cluster.get_json("namespace", "default")["metadata"]["name"] == "default"


def test_rbac_forbids_a_service_account_until_a_role_allows_it(
    cluster: Cluster, kube_namespace: str
) -> None:
    cluster.kubectl("create", "serviceaccount", "reader", "-n", kube_namespace)
    as_reader = cluster.kubeconfig_for_serviceaccount(kube_namespace, "reader")

    with pytest.raises(KubectlError, match="forbidden"):
        cluster.kubectl("get", "pods", "-n", kube_namespace, kubeconfig=as_reader)

    cluster.kubectl(
        "create", "role", "pod-reader", "--verb=get,list", "--resource=pods", "-n", kube_namespace
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "reader",
        "--role=pod-reader",
        f"--serviceaccount={kube_namespace}:reader",
        "-n",
        kube_namespace,
    )

    def can_list() -> bool:
        args = ("get", "pods", "-n", kube_namespace)
        return cluster.kubectl(*args, kubeconfig=as_reader, check=False).returncode == 0

    poll.until("the RoleBinding to take effect", can_list, timeout=10)
    # Still least privilege: nothing outside the Role.
    with pytest.raises(KubectlError, match="forbidden"):
        cluster.kubectl("get", "secrets", "-n", kube_namespace, kubeconfig=as_reader)
    with pytest.raises(KubectlError, match="forbidden"):
        cluster.kubectl("get", "pods", "-n", "default", kubeconfig=as_reader)


def test_pod_security_restricted_namespace_rejects_a_privileged_pod(
    cluster: Cluster, kube_namespace: str
) -> None:
    cluster.kubectl(
        "label", "namespace", kube_namespace, "pod-security.kubernetes.io/enforce=restricted"
    )
    with pytest.raises(KubectlError, match="violates PodSecurity"):
        cluster.kubectl(
            "create",
            "-n",
            kube_namespace,
            "-f",
            "-",
            input=pod("privileged", security={"privileged": True}),
        )

    restricted = {
        "runAsNonRoot": True,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    cluster.kubectl(
        "create",
        "--dry-run=server",
        "-n",
        kube_namespace,
        "-f",
        "-",
        input=pod("compliant", security=restricted),
    )


def test_deleting_an_owner_garbage_collects_its_pods(cluster: Cluster, kube_namespace: str) -> None:
    ns = ("-n", kube_namespace)
    cluster.kubectl("create", "configmap", "owner", *ns)
    uid = cluster.get_json("configmap", "owner", *ns)["metadata"]["uid"]
    owner = {"kind": "ConfigMap", "name": "owner", "uid": uid}
    for name in ("owned-0", "owned-1"):
        cluster.kubectl("create", *ns, "-f", "-", input=pod(name, owner=owner))
    cluster.kubectl("create", *ns, "-f", "-", input=pod("bystander"))

    cluster.kubectl("delete", "configmap", "owner", *ns)

    def names() -> set[str]:
        return {p["metadata"]["name"] for p in cluster.get_json("pods", *ns)["items"]}

    poll.until("owned pods to be collected", lambda: names() == {"bystander"}, timeout=30)


def test_cli_cluster_outlives_up_and_down_stops_it(tmp_path: Path) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "localcluster", "--state-dir", str(tmp_path), *args]
        return subprocess.run(argv, capture_output=True, text=True, timeout=180)

    up = cli("up", "--nodes", "0")
    try:
        assert up.returncode == 0, up.stderr
        assert up.stdout.strip() == f"export KUBECONFIG={tmp_path / 'kubeconfig'}"
        status = cli("status")
        assert status.returncode == 0, status.stdout + status.stderr
        assert "apiserver            running" in status.stdout
        started = json.loads((tmp_path / "cluster.json").read_text())["processes"]
    finally:
        assert cli("down").returncode == 0
    assert {p["name"] for p in started} == {
        "etcd",
        "apiserver",
        "controller-manager",
        "scheduler",
        "cluster-dns",
        "storage-provisioner",
        "s3",  # the object store for checkpoints (versitygw, localcluster/objectstore.py)
    }
    poll.until("all stopped", lambda: not any(running(p["pid"]) for p in started), timeout=5)
    assert cli("status").returncode == 1


def running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
