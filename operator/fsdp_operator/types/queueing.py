"""Kueue: an FSDPJob that names a LocalQueue waits its turn as one plain pod group.

A job joins Kueue the way Jobs and JobSets do, by the label `kueue.x-k8s.io/queue-name` on the
FSDPJob (and optionally `kueue.x-k8s.io/priority-class`, a WorkloadPriorityClass). Each
attempt's pods then carry Kueue's plain-pod-group keys: the queue and priority labels, the
group's name, and its total count. Kueue's webhook gates them (`kueue.x-k8s.io/admission`)
until the group's Workload, named like the group, is admitted as a whole; the operator reads
gated pods as Queued, not as pods that failed to schedule. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from fsdp_operator.types import names

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ROLE_HASH_ANNOTATION = "kueue.x-k8s.io/role-hash"
ROLE = "worker"
"""The group's one role (Kueue's PodSet name). Given, not left to Kueue's webhook: it hashes
the pod spec, and each attempt's differs (its affinity names the attempt, its excluded nodes),
so a next attempt's pods would not count as replacements of the group's and stay gated."""
ADMISSION_GATE = "kueue.x-k8s.io/admission"
KUEUE_KEYS = frozenset(
    {QUEUE_LABEL, PRIORITY_LABEL, GROUP_LABEL, GROUP_COUNT_ANNOTATION, ROLE_HASH_ANNOTATION}
)
"""Kueue's keys the operator sets on worker pods itself (a pod template's own are dropped)."""

TERMINATION_TARGET = "TerminationTarget"
"""The pod condition Kueue sets before it deletes a pod group it evicts (preemption, a
waitForPodsReady timeout): the pods' end is Kueue's, not the job's failure."""

KEEPS_GROUP = frozenset({"Crash", "OOMKilled", "Hang", "RendezvousTimeout", "Preempted"})
"""Causes (status.Cause values) after which the next attempt at the same size replaces the
pods of the same pod group, keeping its admission: no requeue, no quota gap another job could
take (after Kueue's own eviction, Preempted, the group's Workload keeps its requeue state: its
backoff and backoffLimitCount count the job's evictions, not each new group's). After a lost
node or an eviction an old pod may still count as active to Kueue (its node cannot report it
ended); after a resize or a suspension the group's size or time is over: those start a new
group, and the old one's Workload is deleted (its quota released)."""

TOPOLOGY_PREFIX = "kueue.x-k8s.io/podset-"
"""Topology-aware scheduling asks, as annotations on the FSDPJob (as on a Job's pod template):
e.g. `kueue.x-k8s.io/podset-required-topology: <node label of a rack or block>` puts every
rank in one such domain. The operator copies them onto each attempt's pods."""

WORKLOAD_API = ("kueue.x-k8s.io", "v1beta2", "workloads")


def spares_refusal(queue: Queue, spares: int) -> str:
    """Why spare pods cannot be kept under a queue ("" when there are none)."""
    if not spares:
        return ""
    return (
        f"spec.spares={spares} is not allowed under a Kueue queue (label {QUEUE_LABEL}="
        f"{queue.name}): Kueue admits the attempt's pods as one pod group of spec.replicas "
        "pods, and a standby pod outside that group would never be admitted. Remove "
        "spec.spares, or the queue label"
    )


@dataclasses.dataclass(frozen=True)
class Queue:
    """The LocalQueue (and priority) an FSDPJob asked for by its labels."""

    name: str
    job_name: str
    priority_class: str | None = None
    topology: tuple[tuple[str, str], ...] = ()  # the job's TOPOLOGY_PREFIX annotations

    @classmethod
    def of(
        cls,
        job_name: str,
        *labels: Mapping[str, str] | None,
        annotations: Mapping[str, str] | None = None,
    ) -> Queue | None:
        """From the FSDPJob's labels (then its pod template's) and its topology annotations;
        None when they name no queue: Kueue is not involved."""
        topology = tuple(
            sorted((k, v) for k, v in (annotations or {}).items() if k.startswith(TOPOLOGY_PREFIX))
        )
        for found in labels:
            name = (found or {}).get(QUEUE_LABEL, "")
            if name:
                priority = (found or {}).get(PRIORITY_LABEL) or None
                return cls(name, job_name, priority_class=priority, topology=topology)
        return None

    def group(self, attempt: int) -> str:
        """A new pod group (and Kueue Workload), for the gang `attempt` starts."""
        return names.pod_group(self.job_name, attempt=attempt)

    def pod_keys(self, *, group: str, count: int) -> tuple[dict[str, str], dict[str, str]]:
        """(labels, annotations) that make an attempt's `count` pods Kueue's pod group
        `group` (a new one, or the previous attempt's: its replacement pods)."""
        labels = {QUEUE_LABEL: self.name, GROUP_LABEL: group}
        if self.priority_class:
            labels[PRIORITY_LABEL] = self.priority_class
        notes = {**dict(self.topology), GROUP_COUNT_ANNOTATION: str(count)}
        return labels, {**notes, ROLE_HASH_ANNOTATION: ROLE}


@dataclasses.dataclass(frozen=True)
class Admission:
    """Kueue's word on a pod group's Workload, from its conditions."""

    admitted: bool
    reason: str = ""  # of QuotaReserved (e.g. Pending) or Admitted
    message: str = ""  # e.g. "couldn't assign flavors to pod set ...: insufficient quota ..."
    cluster_queue: str = ""


def eviction_words(condition: Mapping[str, Any]) -> str:
    """A pod's TerminationTarget condition -> "<reason>: <message>" ("" when not set)."""
    if condition.get("status") != "True":
        return ""
    reason = str(condition.get("reason") or "Evicted")
    message = str(condition.get("message") or "")
    return f"{reason}: {message}"[:300] if message else reason


def admission_of(workload: Mapping[str, Any] | None) -> Admission | None:
    """A Workload object (as the API returns it) -> its admission; None when there is none."""
    if not workload:
        return None
    conditions = {c.get("type"): c for c in (workload.get("status") or {}).get("conditions") or []}
    admitted = conditions.get("Admitted") or {}
    reserved = conditions.get("QuotaReserved") or {}
    is_admitted = admitted.get("status") == "True"
    said = admitted if is_admitted or not reserved else reserved
    queue = ((workload.get("status") or {}).get("admission") or {}).get("clusterQueue", "")
    return Admission(
        admitted=is_admitted,
        reason=str(said.get("reason") or ""),
        message=str(said.get("message") or "")[:512],
        cluster_queue=str(queue),
    )
