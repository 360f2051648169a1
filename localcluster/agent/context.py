"""What every part of the agent shares: settings, the API client, the network, clock helpers.

A plain container with lookups that talk to the API server; it holds no lifecycle logic.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
from pathlib import Path
from typing import Any

from localcluster.agent import kube, netns

JSON = dict[str, Any]
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def now() -> str:
    """An RFC 3339 timestamp with second precision, as Kubernetes writes ``Time``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    """An RFC 3339 timestamp with microseconds, for ``MicroTime`` fields (lease renewals)."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclasses.dataclass(frozen=True)
class Settings:
    """The agent's command line."""

    kubeconfig: Path
    """Admin kubeconfig of the cluster."""
    state_dir: Path
    """Where pod directories, logs, PVC directories and the control endpoint file live."""
    nodes: int
    """How many Node objects to register."""
    gpus_per_node: int
    """``nvidia.com/gpu`` capacity per node."""
    cpu: str
    """CPU capacity per node (a quantity)."""
    memory: str
    """Memory capacity per node (a quantity)."""
    name_prefix: str = "node-"
    """Node names are ``<prefix><index>``."""
    zones: int = 2
    """Nodes are spread round-robin over ``zone-0`` .. ``zone-<zones-1>``."""
    heartbeat_s: float = 1.0
    """Lease renewal period; the control plane's node-monitor grace must be a few times this."""

    def node_names(self) -> list[str]:
        return [f"{self.name_prefix}{i}" for i in range(self.nodes)]


@dataclasses.dataclass
class Context:
    """Shared handles for the node, pod and control parts of the agent."""

    settings: Settings
    kube: kube.Kube
    network: netns.Network
    cgroups: Path | None
    """This agent's cgroup2 directory, or None to fall back to process groups."""

    def base_env(self, hostname: str) -> dict[str, str]:
        """The environment an image would provide: the agent's own Python first in PATH."""
        return {
            "PATH": f"{os.path.dirname(sys.executable)}:{SYSTEM_PATH}",
            "HOME": "/root",
            "HOSTNAME": hostname,
            "LANG": "C.UTF-8",
        }

    def configmap(self, namespace: str, name: str) -> dict[str, str] | None:
        found = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/configmaps/{name}")
        return None if found is None else dict(found.get("data") or {})

    def token(self, pod: JSON, source: JSON) -> str:
        """A service-account token bound to the pod, through the TokenRequest API."""
        meta = pod["metadata"]
        account = pod["spec"].get("serviceAccountName") or "default"
        spec: JSON = {
            "expirationSeconds": source.get("expirationSeconds", 3600),
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                               "uid": meta["uid"]},
        }  # fmt: skip
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        answer = self.kube.request(
            "POST",
            f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{account}/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"])
