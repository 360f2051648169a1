"""The Node objects of the process nodes, kept alive the way a kubelet keeps its node alive.

Registers each node (labels, capacity, allocatable, addresses), then renews its Lease in
kube-node-lease every ``heartbeat_s`` and posts a Ready status heartbeat every few renewals.
The real node lifecycle controller reads both: a "lost" node simply stops both, and the
controller marks it NotReady/Unknown and taints it. No pod logic lives here.
"""

from __future__ import annotations

import logging
import platform
import threading
from typing import Any

from localcluster.agent import context, kube, kubeletapi

JSON = dict[str, Any]
log = logging.getLogger(__name__)
LEASE_DURATION_S = 40
STATUS_EVERY = 5
"""Post a node status heartbeat every this many lease renewals."""
MAX_PODS = "110"
PRESSURE = (
    ("MemoryPressure", "KubeletHasSufficientMemory"),
    ("DiskPressure", "KubeletHasNoDiskPressure"),
    ("PIDPressure", "KubeletHasSufficientPID"),
)


class Nodes:
    """Registration and heartbeats of every node this agent serves."""

    def __init__(self, ctx: context.Context) -> None:
        self.ctx = ctx
        self.names = ctx.settings.node_names()
        self.lost: set[str] = set()
        self._ready_since = {name: context.now() for name in self.names}
        self._lock = threading.Lock()

    def index(self, name: str) -> int:
        return self.names.index(name)

    # --- registration --------------------------------------------------------------------
    def _node(self, i: int, name: str) -> JSON:
        s = self.ctx.settings
        cidr = f"{self.ctx.network.subnet.network_address + 256 * (i + 1)}/24"
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "topology.kubernetes.io/zone": f"zone-{i % max(1, s.zones)}",
                    "node.kubernetes.io/instance-type": "localcluster-process",
                },
            },
            "spec": {"podCIDR": cidr, "podCIDRs": [cidr]},
        }

    def _capacity(self) -> JSON:
        s = self.ctx.settings
        return {"cpu": s.cpu, "memory": s.memory, "pods": MAX_PODS,
                "nvidia.com/gpu": str(s.gpus_per_node), "ephemeral-storage": "100Gi"}  # fmt: skip

    def register(self) -> None:
        for i, name in enumerate(self.names):
            node = self._node(i, name)
            try:
                self.ctx.kube.request("POST", "/api/v1/nodes", body=node)
            except kube.KubeError as exc:
                if exc.status != 409:
                    raise
                self.ctx.kube.request("PATCH", f"/api/v1/nodes/{name}", body=node,
                                      content_type=kube.MERGE)  # fmt: skip
            self.post_status(name)
            self.renew(name)

    def _status(self, name: str) -> JSON:
        now = context.now()
        ready = self._ready_since[name]
        started = self._ready_since[self.names[0]]
        conditions = [
            {"type": kind, "status": "False", "reason": reason, "message": "no pressure",
             "lastHeartbeatTime": now, "lastTransitionTime": started}
            for kind, reason in PRESSURE
        ] + [
            {"type": "Ready", "status": "True", "reason": "KubeletReady",
             "message": "process node agent is posting ready status",
             "lastHeartbeatTime": now, "lastTransitionTime": ready},
        ]  # fmt: skip
        return {
            "capacity": self._capacity(),
            "allocatable": self._capacity(),
            "conditions": conditions,
            # No Hostname address: the API server would prefer it for `kubectl logs`, and node
            # names resolve nowhere on the host.
            "addresses": [
                {"type": "InternalIP", "address": self.ctx.network.node_ip(self.index(name))},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubeletapi.PORT}},
            "nodeInfo": {
                "machineID": name,
                "systemUUID": name,
                "bootID": self.ctx.network.instance,
                "kernelVersion": platform.release(),
                "osImage": "localcluster process node",
                "containerRuntimeVersion": "process://localcluster",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },  # fmt: skip
        }

    def post_status(self, name: str) -> None:
        self.ctx.kube.request("PATCH", f"/api/v1/nodes/{name}/status",
                              body={"status": self._status(name)},
                              content_type=kube.STRATEGIC)  # fmt: skip

    def renew(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        patch = {"spec": {"holderIdentity": name, "renewTime": context.now_micro(),
                          "leaseDurationSeconds": LEASE_DURATION_S}}  # fmt: skip
        try:
            self.ctx.kube.request("PATCH", path, body=patch, content_type=kube.MERGE)
        except kube.KubeError as exc:
            if exc.status != 404:
                raise
            node = self.ctx.kube.get(f"/api/v1/nodes/{name}")
            owner = {"apiVersion": "v1", "kind": "Node", "name": name,
                     "uid": node["metadata"]["uid"]}  # fmt: skip
            lease = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                     "metadata": {"name": name, "ownerReferences": [owner]}, **patch}  # fmt: skip
            self.ctx.kube.request("POST", path.rsplit("/", 1)[0], body=lease)

    # --- heartbeats ----------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Renew leases (and now and then node status) until ``stop`` is set."""
        tick = 0
        while not stop.wait(self.ctx.settings.heartbeat_s):
            tick += 1
            for name in self.names:
                with self._lock:
                    if name in self.lost:
                        continue
                try:
                    self.renew(name)
                    if tick % STATUS_EVERY == 0:
                        self.post_status(name)
                except Exception as exc:  # the heartbeat must outlive any one failure
                    log.warning("node %s: heartbeat failed: %s", name, exc)

    def lose(self, name: str) -> None:
        with self._lock:
            self.lost.add(self._known(name))

    def restore(self, name: str) -> None:
        with self._lock:
            self.lost.discard(self._known(name))
            self._ready_since[name] = context.now()
        self.renew(name)
        self.post_status(name)

    def _known(self, name: str) -> str:
        if name not in self.names:
            raise LookupError(f"node {name!r} is not served by this agent ({self.names})")
        return name
