"""Dynamic provisioning: a claim that names no StorageClass gets the cluster's default class,
a directory of this machine of its own that the project's non-root pods write (on any node),
and that directory goes with the claim.
"""

from __future__ import annotations

import stat

import pytest

from localcluster import components, poll, procs
from localcluster.controlplane import Cluster
from tests.cluster._podkit import JSON, apply, python_pod, terminated, wait_phase

pytestmark = pytest.mark.cluster

WORKER_ID = 1000  # the uid and gid of the project's images


def claim(name: str, *, access: str) -> JSON:
    """A 1Gi claim with no storageClassName."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": [access], "resources": {"requests": {"storage": "1Gi"}}},
    }


def pod_on_claim(name: str, claim_name: str, code: str, *, node: str | None = None) -> JSON:
    """A restricted pod (uid 1000, fsGroup 1000) running ``code`` with the claim at /data."""
    pod = python_pod(name, code, node=node)
    pod["spec"]["securityContext"]["fsGroup"] = WORKER_ID
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}]
    return pod


def wait_bound(cluster: Cluster, namespace: str, name: str, *, timeout: float = 60.0) -> JSON:
    """The claim once Bound; past ``timeout``, fail with its status, events and the
    provisioner's log."""

    def bound() -> JSON | None:
        found: JSON = cluster.get_json("pvc", name, "-n", namespace)
        return found if found.get("status", {}).get("phase") == "Bound" else None

    def diagnosis() -> str:
        described = cluster.kubectl("describe", "pvc", name, "-n", namespace, check=False).stdout
        return f"{described}\n{procs.tail(cluster.logs / 'storage-provisioner.log')}"

    found: JSON = poll.until(
        f"claim {namespace}/{name} Bound", bound, timeout=timeout, diagnosis=diagnosis
    )
    return found


def run_to_success(cluster: Cluster, namespace: str, pod: JSON) -> JSON:
    apply(cluster, namespace, pod)
    name = pod["metadata"]["name"]
    done = wait_phase(cluster, namespace, name, ("Succeeded", "Failed"))
    assert done["status"]["phase"] == "Succeeded", terminated(done)
    return done


def volume_gone(cluster: Cluster, name: str) -> bool:
    found = cluster.kubectl("get", "pv", name, check=False)
    return found.returncode != 0 and "NotFound" in found.stderr


def test_a_claim_gets_a_directory_the_workers_write_and_loses_it_with_the_claim(
    cluster: Cluster, kube_namespace: str
) -> None:
    apply(cluster, kube_namespace, claim("data", access="ReadWriteOnce"))
    bound = wait_bound(cluster, kube_namespace, "data")
    assert bound["spec"]["storageClassName"] == components.STORAGE_CLASS, "the default class"
    volume_name = bound["spec"]["volumeName"]
    volume = cluster.get_json("pv", volume_name)["spec"]
    directory = cluster.dynamic_volumes / f"{kube_namespace}-data-{volume_name}"
    assert volume["hostPath"]["path"] == str(directory)
    assert volume["accessModes"] == ["ReadWriteOnce"]
    assert volume["capacity"]["storage"] == "1Gi"
    assert volume["persistentVolumeReclaimPolicy"] == "Delete"
    owner = directory.stat()
    assert (owner.st_uid, owner.st_gid) == (WORKER_ID, WORKER_ID)
    assert owner.st_mode & stat.S_ISGID, "files made in it keep the workers' group"

    code = "open('/data/hello', 'w').write('from a pod')"
    run_to_success(cluster, kube_namespace, pod_on_claim("writer", "data", code))
    written = directory / "hello"
    assert written.read_text() == "from a pod"
    assert (written.stat().st_uid, written.stat().st_gid) == (WORKER_ID, WORKER_ID)

    # A claim in use by a pod stays until the pod goes (the pvc-protection finalizer).
    cluster.kubectl("delete", "pod", "writer", "-n", kube_namespace)
    cluster.kubectl("delete", "pvc", "data", "-n", kube_namespace)
    poll.until(
        f"PersistentVolume {volume_name} and {directory} removed with the claim",
        lambda: volume_gone(cluster, volume_name) and not directory.exists(),
        timeout=30,
    )


def test_a_read_write_many_claim_is_shared_across_nodes(
    cluster: Cluster, kube_namespace: str
) -> None:
    apply(cluster, kube_namespace, claim("shared", access="ReadWriteMany"))
    bound = wait_bound(cluster, kube_namespace, "shared")
    assert bound["status"]["accessModes"] == ["ReadWriteMany"]
    nodes = sorted(n["metadata"]["name"] for n in cluster.get_json("nodes")["items"])
    write = "open('/data/step', 'w').write('42')"
    run_to_success(cluster, kube_namespace, pod_on_claim("writer", "shared", write, node=nodes[0]))
    read = "open('/dev/termination-log', 'w').write(open('/data/step').read())"
    reader = pod_on_claim("reader", "shared", read, node=nodes[-1])
    assert terminated(run_to_success(cluster, kube_namespace, reader))["message"] == "42"
