"""What the operator knows of pods and nodes between passes, kept from its watches.

The store is kopf's in-memory indices (handlers.py registers them), not an informer of our own:
kopf already holds one watch per resource kind, and it runs no other handler until every index
has been filled from its initial listing, so no pass ever reads a half-filled cache (a pod not
yet seen would read as a vanished one, and restart a healthy job). What the indices keep is
small: a slimmed copy of each of the operator's pods, each bound pod's resource requests and
each node's few scheduling facts, never whole objects. (The last two are kept by index
functions in the `Store`: `Usage` and a record per node; the kopf indices for them stay
empty.)

The indices change on the event loop; a pass runs in a thread. So a pass never reads them: the
loop takes a `View` (plain lists and dicts; the node list and usage table shared between views
until they change) just before the pass starts. Pure functions here, and the `Store` that
holds the indices (given to it) and the tables; no kopf, no API calls.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fsdp_operator.types import api, names, observed

_ACTIVE = ("Pending", "Running", "Unknown")
# What observe.pod_view reads of a pod's conditions and container states. The rest
# (Initialized, ContainersReady, a running container's start) was 14 of a kept pod's 22 dicts.
# Ready is rank 0's progress probe (templates.progress_probe): kept with its transition time.
# TerminationTarget: Kueue evicts the pod's group (queueing.py), with its message.
_POD_CONDITIONS = ("PodScheduled", "DisruptionTarget", "Ready", "TerminationTarget")
_STATES = ("terminated", "waiting")


def slim_pod(body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of one of the operator's pods that observation reads (observe.pod_view,
    observe.owned_by, the capacity estimate); managedFields, env, volumes, the conditions and
    container states nothing reads are dropped."""
    meta = body.get("metadata", {})
    spec = body.get("spec", {})
    status = body.get("status", {})
    kept = {k: meta[k] for k in ("name", "uid", "deletionTimestamp") if k in meta}
    if "namespace" in meta:
        kept["namespace"] = _shared(meta["namespace"])
    if "labels" in meta:
        kept["labels"] = {_shared(k): _shared(v) for k, v in (meta["labels"] or {}).items()}
    if "ownerReferences" in meta:
        kept["ownerReferences"] = [
            {k: _shared(v) for k, v in ref.items()} for ref in meta["ownerReferences"] or []
        ]
    return {
        "kind": "Pod",
        "metadata": kept,
        "spec": {
            "nodeName": _shared(spec.get("nodeName")),
            "containers": [
                {"name": _shared(c.get("name")), "resources": {"requests": _requests_of(c)}}
                for c in spec.get("containers") or []
            ],
            # the team's init containers: which are sidecars (observe._sidecars)
            **(
                {"initContainers": [_init_of(c) for c in inits]}
                if (inits := spec.get("initContainers"))
                else {}
            ),
            # Kueue's admission gate: the pod is queued (queueing.py)
            **(
                {"schedulingGates": [{"name": _shared(g.get("name"))} for g in gates]}
                if (gates := spec.get("schedulingGates"))
                else {}
            ),
        },
        "status": {
            "phase": _shared(status.get("phase", "Pending")),
            "podIP": status.get("podIP"),
            "conditions": [
                {k: _shared(c[k]) for k in ("type", "status", "reason") if k in c}
                | (
                    {"lastTransitionTime": c.get("lastTransitionTime")}
                    if c.get("type") == "Ready"
                    else {}
                )
                | (
                    {"message": str(c.get("message") or "")[:300]}
                    if c.get("type") == "TerminationTarget"
                    else {}
                )
                | (  # the scheduler's own reason (observe.pod_view)
                    {"message": str(c.get("message") or "")[: observed.SCHEDULER_MESSAGE_LIMIT]}
                    if c.get("type") == "PodScheduled" and c.get("status") == "False"
                    else {}
                )
                for c in status.get("conditions") or []
                if c.get("type") in _POD_CONDITIONS
            ],
            "containerStatuses": [
                {"name": _shared(cs.get("name")), "state": state}
                for cs in status.get("containerStatuses") or []
                if (state := {k: v for k, v in (cs.get("state") or {}).items() if k in _STATES})
            ],
            **(
                {"initContainerStatuses": [_init_status(cs) for cs in init_statuses]}
                if (init_statuses := status.get("initContainerStatuses"))
                else {}
            ),
        },
    }


def _init_of(container: Mapping[str, Any]) -> dict[str, Any]:
    kept = {"name": _shared(container.get("name"))}
    if container.get("restartPolicy"):
        kept["restartPolicy"] = _shared(container["restartPolicy"])
    return kept


def _init_status(cs: Mapping[str, Any]) -> dict[str, Any]:
    """An init container's or sidecar's state (a failure, an image error) and its restarts."""
    state = {k: v for k, v in (cs.get("state") or {}).items() if k in _STATES}
    kept: dict[str, Any] = {"name": _shared(cs.get("name")), "state": state}
    if cs.get("restartCount"):
        last = (cs.get("lastState") or {}).get("terminated") or {}
        kept["restartCount"] = cs["restartCount"]
        kept["lastState"] = {
            "terminated": {k: last[k] for k in ("reason", "exitCode") if k in last}
        }
    return kept


def _shared(value: Any) -> Any:
    """One string object for the values every pod repeats (label keys and values, node names,
    the owner's name and uid, phases): parsed JSON gives each pod its own copies."""
    return sys.intern(value) if type(value) is str else value


def _requests_of(container: Mapping[str, Any]) -> dict[str, Any]:
    """Requests, where unset the limits (the API server's defaulting, for a pod not yet
    stored)."""
    res = container.get("resources") or {}
    return {**(res.get("limits") or {}), **(res.get("requests") or {})}


def pod_requests(pod: Mapping[str, Any]) -> dict[str, float]:
    """Summed container requests of one pod, as numbers."""
    total: dict[str, float] = {}
    for c in pod.get("spec", {}).get("containers") or []:
        for key, value in _requests_of(c).items():
            total[key] = total.get(key, 0.0) + api.quantity(value)
    return total


def usage(pod: Mapping[str, Any]) -> tuple[str, str, dict[str, float]] | None:
    """(node, pod uid, requests) of a pod that holds node resources; None for the rest
    (unbound, or Succeeded/Failed: its room is free again)."""
    node = pod.get("spec", {}).get("nodeName")
    if not node or pod.get("status", {}).get("phase", "Pending") not in _ACTIVE:
        return None
    return str(node), str(pod.get("metadata", {}).get("uid", "")), pod_requests(pod)


@dataclasses.dataclass(frozen=True)
class NodeRecord:
    """One node, reduced to what readiness and the capacity estimate need."""

    name: str
    ready: bool
    not_ready_since: float | None
    schedulable: bool
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    allocatable: Mapping[str, float]


def node_record(node: Mapping[str, Any], ts: Any) -> NodeRecord:
    """`ts` parses RFC 3339 (observe.ts; passed in to keep this module free of observe)."""
    ready: Mapping[str, Any] = next(
        (c for c in node.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"),
        {},
    )
    is_ready = ready.get("status") == "True"
    alloc = node.get("status", {}).get("allocatable") or {}
    return NodeRecord(
        name=node["metadata"]["name"],
        ready=is_ready,
        not_ready_since=None if is_ready else ts(ready.get("lastTransitionTime")),
        schedulable=not node.get("spec", {}).get("unschedulable", False),
        labels=dict(node.get("metadata", {}).get("labels") or {}),
        taints=tuple(dict(t) for t in node.get("spec", {}).get("taints") or []),
        allocatable={k: api.quantity(v) for k, v in alloc.items()},
    )


@dataclasses.dataclass(frozen=True)
class View:
    """What one pass observes of the cluster, copied from the indices on the event loop."""

    pods: list[dict[str, Any]]
    """Every pod carrying the job's label (owned or not: observe.owned_by sorts them)."""
    nodes: Sequence[NodeRecord]
    """Shared between views (Store.nodes): not to be changed."""
    used: Mapping[str, Mapping[str, float]]
    """Per node, requests of the active pods bound there (this job's own included)."""
    progress: observed.Progress | None = None
    """Rank 0's newest scrape not yet seen by a pass (probe.Prober.take), of `progress_pod`."""
    progress_pod: str = ""
    scrape: observed.ScrapeHealth | None = None
    """How the scrapes of rank 0's endpoint have gone lately (probe.Prober.health)."""
    lease_lost: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Nodes lost by their Leases, with their silence in seconds (Store.lease_lost)."""
    lease_quiet: frozenset[str] = frozenset()
    """Nodes that missed a Lease renewal (Store.lease_quiet): their jobs are scraped often."""
    lease_renewed: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)
    """Per node: when its last Lease renewal was seen and its renew period (Store.lease_renewed)."""


def job_key(namespace: str, job_name: str) -> tuple[str, str]:
    """The pods index key of a job: its namespace and the value of its job label."""
    return namespace, names.job_label_value(job_name)


class Usage:
    """Requests of the active pods bound to each node, kept pod by pod as events arrive (the
    pods index function and the DELETED handler feed it), so that a pass copies per-node
    totals instead of summing every pod of the cluster. Totals are replaced, never changed in
    place: a copy handed to a pass stays as it was."""

    def __init__(self) -> None:
        self._by_uid: dict[str, tuple[str, dict[str, float]]] = {}
        self._totals: dict[str, dict[str, float]] = {}
        self._copy: Mapping[str, Mapping[str, float]] | None = None

    def put(self, uid: str, entry: tuple[str, dict[str, float]] | None) -> None:
        old = self._by_uid.get(uid)
        if old == entry:
            return
        if old is not None:
            del self._by_uid[uid]
            self._add(old, -1.0)
        if entry is not None:
            self._by_uid[uid] = entry
            self._add(entry, 1.0)

    def _add(self, entry: tuple[str, dict[str, float]], sign: float) -> None:
        self._copy = None
        node, requests = entry
        total = dict(self._totals.get(node, {}))
        for key, value in requests.items():
            left = total.get(key, 0.0) + sign * value
            if abs(left) < 1e-9:
                total.pop(key, None)
            else:
                total[key] = left
        if total:
            self._totals[node] = total
        else:
            self._totals.pop(node, None)

    def totals(self) -> Mapping[str, Mapping[str, float]]:
        """A copy, shared by every caller until the next change (not to be changed: passes
        queued behind a busy API server would each hold their own, a node table apiece)."""
        if self._copy is None:
            self._copy = dict(self._totals)
        return self._copy

    def __len__(self) -> int:
        return len(self._by_uid)


def without(
    totals: Mapping[str, Mapping[str, float]], pods: Iterable[Mapping[str, Any]]
) -> dict[str, Mapping[str, float]]:
    """Per-node totals minus what `pods` (the job's own) hold: they free it on a restart."""
    used: dict[str, Mapping[str, float]] = dict(totals)
    for pod in pods:
        held = usage(pod)
        if held is None:
            continue
        node, _uid, requests = held
        left = dict(used.get(node, {}))
        for key, value in requests.items():
            left[key] = left.get(key, 0.0) - value
        used[node] = left
    return used


class Store:
    """What the watches keep between passes: kopf's pods index (given once kopf made it), a
    record per node and the usage table (both fed by index functions), and the one node list
    every view shares until a node changes. Changed only on the event loop."""

    def __init__(self, pods: Mapping[tuple[str, str], Any] | None = None) -> None:
        self.pods: Mapping[tuple[str, str], Any] = pods if pods is not None else {}
        """kopf's `fsdp_job_pods` index: job key -> the slim pods carrying its label."""
        self.usage = Usage()
        self._nodes: dict[str, NodeRecord] = {}
        self._node_list: list[NodeRecord] | None = None
        self.lease_lost: Mapping[str, float] = {}
        """Nodes lost by their Leases (nodelease.LeaseClock.lost), replaced whole, never
        changed in place: views share it."""
        self.lease_quiet: frozenset[str] = frozenset()
        """Nodes that missed a renewal (nodelease.LeaseClock.quiet), lost ones included."""
        self.lease_renewed: Mapping[str, tuple[float, float]] = {}
        """Per node: when (time.time()) its last Lease renewal was seen, and its renew period
        (nodelease.LeaseClock.renewed); empty while the Lease watch is not healthy. Replaced
        whole."""

    def node_seen(self, record: NodeRecord) -> bool:
        """Keep a node's record; True when a node already known changed in what a pass reads
        (a heartbeat changes nothing, a node's first sighting wakes nobody)."""
        old = self._nodes.get(record.name)
        if old == record:
            return False
        self._nodes[record.name] = record
        self._node_list = None
        return old is not None

    def node_gone(self, name: str) -> None:
        self._nodes.pop(name, None)
        self._node_list = None

    def nodes(self) -> list[NodeRecord]:
        """One list for every view until a node changes (see Usage.totals). Made from the
        records changed together with the invalidation: kopf stores an index function's result
        only after it returns, so a view made in between would read the old one."""
        if self._node_list is None:
            self._node_list = list(self._nodes.values())
        return self._node_list

    def jobs_on_node(self, node: str, kind: str) -> set[tuple[str, str]]:
        """(namespace, job name) of every job (owner of `kind`) with a pod bound to `node`."""
        found: set[tuple[str, str]] = set()
        for (namespace, _label), store in list(self.pods.items()):
            for pod in store:
                if pod["spec"].get("nodeName") != node:
                    continue
                for owner in pod["metadata"].get("ownerReferences") or []:
                    if owner.get("kind") == kind:
                        found.add((namespace, str(owner.get("name"))))
        return found

    def view(
        self,
        namespace: str,
        name: str,
        latest: tuple[str, observed.Progress] | None = None,
        scrape: observed.ScrapeHealth | None = None,
    ) -> View:
        """A copy of what the store holds for one pass of one job; `latest` is rank 0's newest
        scrape (pod name, progress) not yet seen by a pass, `scrape` how scrapes went."""
        return View(
            pods=list(self.pods.get(job_key(namespace, name), ())),
            nodes=self.nodes(),
            used=self.usage.totals(),
            progress=latest[1] if latest else None,
            progress_pod=latest[0] if latest else "",
            scrape=scrape,
            lease_lost=self.lease_lost,
            lease_quiet=self.lease_quiet,
            lease_renewed=self.lease_renewed,
        )
