"""Helpers for tests that run pods on the kubelet nodes: manifests, waits, lookups."""

from __future__ import annotations

import json
from typing import Any

from localcluster import images, poll
from localcluster.controlplane import Cluster, KubectlError

JSON = dict[str, Any]
RESTRICTED_CONTAINER: JSON = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}


def python_pod(
    name: str,
    code: str,
    *,
    labels: dict[str, str] | None = None,
    hostname: str | None = None,
    subdomain: str | None = None,
    node: str | None = None,
    grace: int | None = None,
    extra: JSON | None = None,
) -> JSON:
    """A restartPolicy=Never pod whose one container runs ``python -c code``.

    The image is the project's operator image (a Python with no torch); the pod meets Pod
    Security "restricted", as every pod the operator makes does.
    """
    container = {
        "name": "main",
        "image": images.OPERATOR,
        "command": ["python", "-u", "-c", code],
        "securityContext": RESTRICTED_CONTAINER,
    }
    spec: JSON = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 1000,
            "runAsGroup": 1000,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
    }
    if hostname:
        spec["hostname"] = hostname
    if subdomain:
        spec["subdomain"] = subdomain
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    if grace is not None:
        spec["terminationGracePeriodSeconds"] = grace
    spec |= extra or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


def apply(cluster: Cluster, namespace: str, *objects: JSON) -> None:
    items = {"apiVersion": "v1", "kind": "List", "items": list(objects)}
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(items))


def get_pod(cluster: Cluster, namespace: str, name: str) -> JSON | None:
    try:
        found: JSON = cluster.get_json("pod", name, "-n", namespace)
    except KubectlError as exc:
        if "NotFound" in exc.stderr:
            return None
        raise
    return found


def wait_phase(
    cluster: Cluster, namespace: str, name: str, phases: tuple[str, ...], *, timeout: float = 60.0
) -> JSON:
    def check() -> JSON | None:
        pod = get_pod(cluster, namespace, name)
        return pod if pod and pod.get("status", {}).get("phase") in phases else None

    found: JSON = poll.until(f"pod {name} in {phases}", check, timeout=timeout)
    return found


def terminated(pod: JSON) -> JSON:
    """The first container's terminated state."""
    state: JSON = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    return state


def running(cluster: Cluster, namespace: str, name: str, *, timeout: float = 60.0) -> JSON:
    """Wait until the pod's container runs; the pod."""

    def check() -> JSON | None:
        pod = get_pod(cluster, namespace, name)
        statuses = (pod or {}).get("status", {}).get("containerStatuses") or []
        return pod if statuses and "running" in statuses[0]["state"] else None

    found: JSON = poll.until(f"pod {name} running", check, timeout=timeout)
    return found


def node_ready(cluster: Cluster, node: str) -> str:
    """The node's Ready condition status: True, False or Unknown."""
    conditions = cluster.get_json("node", node)["status"]["conditions"]
    return str(next(c["status"] for c in conditions if c["type"] == "Ready"))


def process_state(pid: int) -> str:
    """The one-letter state of a process (R, S, T, ...), or '' when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("State:"):
                    return line.split()[1]
    except OSError:
        return ""
    return ""


def alive(pid: int) -> bool:
    return process_state(pid) not in ("", "Z", "X")
