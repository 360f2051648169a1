"""A simulated GPU fleet on a local control plane: kwok's fake nodes and the pods on them.

``Fleet.start`` runs kwok (built by ``build-kwok.sh``) as a child process against the cluster's
API server. kwok manages only the nodes carrying ``FAKE_LABEL`` (never a kubelet node) and plays
the kubelet for them from stages: the fleet's nodes turn Ready and keep their leases, pods bound
to them turn Running with an address from ``FAKE_POD_RANGE`` and go as soon as they are deleted,
and a Running pod that ``fail_pod`` labels fails with the exit code it was given. Each node has
``nvidia.com/gpu`` capacity and a NoSchedule taint, so only pods that tolerate it (``toleration``)
and select ``FAKE_LABEL`` (``NODE_SELECTOR``) land there; the real scheduler places them.

Fake addresses reach nothing: while any fleet runs, a blackhole route covers ``FAKE_POD_RANGE``
(added before kwok hands out an address), so a connection from this machine to a fake pod fails
at once and no packet leaves the machine.

This module does not build kwok and knows nothing about FSDPJobs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import fcntl
import hashlib
import ipaddress
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from localcluster import controlplane, kubeclient, network, nodes, poll, procs

FAKE_POD_RANGE = ipaddress.ip_network("10.244.128.0/17")
"""The upper half of the local cluster's pod range (``network.POD_RANGE``); the bridge holds
the lower half, so a kubelet pod never draws from it."""
FAKE_NODE_IP = str(FAKE_POD_RANGE.broadcast_address - 1)
"""Every fake node's InternalIP (the API server would dial it for logs or exec): the range's
last address, which kwok's pool (counting up from the first) does not reach."""
FAKE_LABEL = "fsdp.local/fake"
NODE_SELECTOR = {FAKE_LABEL: "true"}
"""A pod's nodeSelector for the fleet's nodes (kwok manages exactly the nodes with this label)."""
FAIL_STAGE = "pod-container-running-failed.stage.kwok.x-k8s.io"
"""kwok's chaos stage: a Running pod with this label set to "true" fails; annotations under the
same name (``/exit-code``, ``/reason``, ``/delay``) say how and when."""
ROUTE_USERS = Path("/run/fsdplc/kwok-route")
"""One file per running fleet (its state dir and a live process of it), and ``added`` when a
fleet added the blackhole route (so the last fleet to stop removes only what a fleet added)."""
_STAGE_NAMES = (
    "node-fast-node-initialize",
    "node-heartbeat-with-lease-node-heartbeat-with-lease",
    "pod-fast-pod-ready",
    "pod-fast-pod-complete",
    "pod-fast-pod-delete",
    "pod-chaos-pod-container-running-failed",
)
_ROUTE_TYPES = {"unicast", "local", "broadcast", "blackhole", "unreachable", "prohibit", "throw"}


class FleetError(RuntimeError):
    """kwok could not be built or started, or the fleet's nodes did not turn Ready."""


@dataclasses.dataclass(frozen=True)
class FleetOptions:
    """The fake nodes to create; every node is the same."""

    nodes: int = 5
    """How many nodes (up to a few thousand: each one is a Node object and a Lease)."""
    gpus_per_node: int = 8
    """``nvidia.com/gpu`` capacity and allocatable of each node."""
    cpu: str = "96"
    memory: str = "1Ti"
    max_pods: int = 110
    lease_seconds: int = 8
    """Node lease duration; kwok renews every quarter of it. The default keeps the renewals
    inside the local control plane's 8 s node-monitor grace; a fleet of a thousand nodes under a
    kubelet-like 40 s grace wants 40 (100 lease writes a second, not 500)."""
    zones: int = 2
    """Nodes are labelled ``topology.kubernetes.io/zone=zone-<i mod zones>``."""
    prefix: str = "fake-gpu"
    """Node names are ``<prefix>-<i>``."""

    def __post_init__(self) -> None:
        if not 0 <= self.nodes <= 10_000:
            raise ValueError(f"nodes={self.nodes} must be within 0..10000")
        if not 1 <= self.lease_seconds <= 3600:
            raise ValueError(f"lease_seconds={self.lease_seconds} must be within 1..3600")
        if self.gpus_per_node < 0 or self.max_pods < 1 or self.zones < 1:
            raise ValueError("gpus_per_node must be >= 0, max_pods and zones >= 1")

    def names(self) -> list[str]:
        return [f"{self.prefix}-{i}" for i in range(self.nodes)]


def find_kwok_dir() -> Path:
    """kwok's directory (``bin/kwok``, ``stages/``), building it on first use.

    ``FSDPOP_KWOK_DIR`` overrides; otherwise ``build-kwok.sh`` (idempotent, fast when cached)
    prints it as its last line.
    """
    return controlplane.built_dir("build-kwok.sh", override="FSDPOP_KWOK_DIR")


def toleration() -> dict[str, str]:
    """The toleration a pod needs to land on the fleet's nodes."""
    return {"key": FAKE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def fail_patch(exit_code: int, *, reason: str = "Error") -> dict[str, Any]:
    """The merge patch that makes kwok fail a Running pod's containers with ``exit_code``."""
    if not 1 <= exit_code <= 255:
        raise ValueError(f"exit_code={exit_code} must be within 1..255 (0 is not a failure)")
    if not reason.isalnum():
        raise ValueError(f"reason={reason!r} must be one word (kwok writes it into YAML)")
    notes = {"exit-code": str(exit_code), "reason": reason, "delay": "0s", "jitter-delay": "0s"}
    annotations = {f"{FAIL_STAGE}/{key}": value for key, value in notes.items()}
    return {"metadata": {"labels": {FAIL_STAGE: "true"}, "annotations": annotations}}


def node_doc(name: str, *, index: int, options: FleetOptions) -> dict[str, Any]:
    """One fake node: labels, the taint, and capacity = allocatable (kwok keeps both)."""
    resources = {
        "cpu": options.cpu,
        "memory": options.memory,
        "pods": str(options.max_pods),
        nodes.GPU_RESOURCE: str(options.gpus_per_node),
    }
    labels = {
        FAKE_LABEL: "true",
        "type": "kwok",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": f"zone-{index % options.zones}",
    }
    annotations = {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": [{"key": FAKE_LABEL, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": resources, "allocatable": resources},
    }


def route_kind(ip: str) -> str:
    """The type of the main table's most specific route to ``ip`` ("blackhole", "unicast"...)."""
    address = ipaddress.ip_address(ip)
    best: tuple[int, str] | None = None
    listing = subprocess.run(
        ["ip", "-o", "-4", "route", "show", "table", "main"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in listing.splitlines():
        words = line.split()
        kind, dest = (words[0], words[1]) if words[0] in _ROUTE_TYPES else ("unicast", words[0])
        net = ipaddress.ip_network("0.0.0.0/0" if dest == "default" else dest, strict=False)
        if address in net and (best is None or net.prefixlen > best[0]):
            best = (net.prefixlen, kind)
    return best[1] if best else "none"


class Fleet:
    """kwok and its nodes on one cluster; ``start``/``stop`` or use it as a context manager."""

    def __init__(
        self,
        cluster: controlplane.Cluster,
        options: FleetOptions | None = None,
        *,
        kwok_dir: Path | None = None,
    ) -> None:
        self.cluster = cluster
        self.options = options or FleetOptions()
        self._kwok_dir = kwok_dir
        self._dir = cluster.state_dir / "kwok"
        self._procs: procs.Registry | None = None
        self._kube: kubeclient.Kube | None = None

    @property
    def log(self) -> Path:
        return self.cluster.logs / "kwok.log"

    @property
    def pid(self) -> int | None:
        return self._procs.pid("kwok") if self._procs else None

    def kube(self) -> kubeclient.Kube:
        if self._kube is None:
            self._kube = kubeclient.Kube(self.cluster.kubeconfig)
        return self._kube

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, timeout: float = 300.0) -> None:
        """Route, kwok, nodes; returns once every node is Ready with its GPUs allocatable.

        Anything started is stopped again if a step fails.
        """
        kwok_dir = self._kwok_dir or find_kwok_dir()
        deadline = time.monotonic() + timeout
        self._dir.mkdir(parents=True, exist_ok=True)
        self._procs = procs.Registry(self._dir / "kwok.json")
        try:
            claim_route(str(self._dir), pid=os.getpid())
            self._procs.spawn("kwok", self.argv(kwok_dir), log=self.log, cwd=self._dir)
            claim_route(str(self._dir), pid=self.pid or os.getpid())
            self._create_nodes()
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise

    def argv(self, kwok_dir: Path) -> list[str]:
        """kwok's command line; the stages go in one config file of several documents."""
        config = self._dir / "stages.yaml"
        docs = [(kwok_dir / "stages" / f"{name}.yaml").read_text() for name in _STAGE_NAMES]
        config.write_text("\n---\n".join(doc.strip() for doc in docs) + "\n")
        return [
            str(kwok_dir / "bin" / "kwok"),
            "--kubeconfig",
            str(self.cluster.kubeconfig),
            "--config",
            str(config),
            "--manage-nodes-with-label-selector",
            f"{FAKE_LABEL}=true",
            "--cidr",
            str(FAKE_POD_RANGE),
            "--node-ip",
            FAKE_NODE_IP,
            "--node-lease-duration-seconds",
            str(self.options.lease_seconds),
        ]

    def stop(self) -> None:
        """Delete the nodes (pods bound to them go with them), stop kwok, release the route."""
        if self._procs is None:
            return
        # One collection delete (a kubectl delete of a thousand nodes takes a minute); nodes
        # have no finalizers, so they are gone when it answers.
        with contextlib.suppress(kubeclient.KubeError):
            self.kube().request(
                "DELETE", "/api/v1/nodes", query={"labelSelector": f"{FAKE_LABEL}=true"}
            )
        self._procs.stop_all(grace=10.0)
        self._procs = None
        release_route(str(self._dir))

    def fail_pod(self, namespace: str, name: str, exit_code: int) -> None:
        """Make a Running fake pod's containers terminate with ``exit_code`` (phase Failed).

        kwok plays its chaos stage at once; the API shows the Failed pod a moment later.
        """
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        patch = fail_patch(exit_code)
        self.kube().request("PATCH", path, body=patch, content_type=kubeclient.MERGE)

    def ready_nodes(self) -> list[str]:
        """The fleet's nodes that are Ready with their GPUs allocatable."""
        items = self.kube().get("/api/v1/nodes", labelSelector=f"{FAKE_LABEL}=true")["items"]
        gpus = str(self.options.gpus_per_node)
        return [
            n["metadata"]["name"]
            for n in items
            if _ready(n) and _allocatable(n, nodes.GPU_RESOURCE) == gpus
        ]

    def _create_nodes(self) -> None:
        docs = [
            node_doc(name, index=i, options=self.options)
            for i, name in enumerate(self.options.names())
        ]
        kube = self.kube()
        # One POST each; a handful in flight keeps a thousand nodes to seconds.
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda doc: kube.request("POST", "/api/v1/nodes", body=doc), docs))

    def _wait_ready(self, deadline: float) -> None:
        """Every fake node Ready by `deadline`; kwok's exit ends the wait at once."""

        def all_ready() -> bool:
            if len(self.ready_nodes()) >= self.options.nodes:
                return True
            if not (self._procs and self._procs.status().get("kwok")):
                raise FleetError(f"kwok exited:\n{procs.tail(self.log)}")
            return False

        try:
            poll.until(
                "fake nodes Ready", all_ready, timeout=deadline - time.monotonic(), every=0.5
            )
        except poll.TimedOut as exc:
            ready = len(self.ready_nodes())
            raise FleetError(
                f"{ready}/{self.options.nodes} fake nodes Ready in time:\n{procs.tail(self.log)}"
            ) from exc


def _allocatable(node: dict[str, Any], resource: str) -> str | None:
    value = (node.get("status", {}).get("allocatable") or {}).get(resource)
    return str(value) if value is not None else None


def _ready(node: dict[str, Any]) -> bool:
    conditions = node.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


# --- the blackhole route ------------------------------------------------------------------------
def _ip(*argv: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise FleetError(f"ip {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


@contextlib.contextmanager
def _route_lock() -> Iterator[None]:
    ROUTE_USERS.mkdir(parents=True, exist_ok=True)
    with (ROUTE_USERS / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _route_present() -> bool:
    listing = _ip("-o", "-4", "route", "show", "type", "blackhole", str(FAKE_POD_RANGE))
    return bool(listing.strip())


def _live_users() -> list[Path]:
    live = []
    for entry in ROUTE_USERS.glob("user-*"):
        with contextlib.suppress(OSError, ValueError, KeyError):
            if network._alive(int(json.loads(entry.read_text())["pid"])):
                live.append(entry)
                continue
        entry.unlink(missing_ok=True)
    return live


def _user_file(owner: str) -> Path:
    return ROUTE_USERS / f"user-{hashlib.sha256(owner.encode()).hexdigest()[:16]}"


def claim_route(owner: str, *, pid: int) -> None:
    """Record ``owner`` (alive while ``pid`` is) and make sure the blackhole route exists."""
    with _route_lock():
        if not _route_present():
            _ip("route", "replace", "blackhole", str(FAKE_POD_RANGE))
            (ROUTE_USERS / "added").touch()
        _user_file(owner).write_text(json.dumps({"owner": owner, "pid": pid}))


def release_route(owner: str) -> None:
    """Forget ``owner``; the last live user removes the route if a fleet added it."""
    with _route_lock():
        _user_file(owner).unlink(missing_ok=True)
        added = ROUTE_USERS / "added"
        if not _live_users() and added.exists():
            _ip("route", "del", "blackhole", str(FAKE_POD_RANGE), check=False)
            added.unlink()
