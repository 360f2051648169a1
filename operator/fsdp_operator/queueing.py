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

from fsdp_operator import names

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
ADMISSION_GATE = "kueue.x-k8s.io/admission"
KUEUE_KEYS = frozenset({QUEUE_LABEL, PRIORITY_LABEL, GROUP_LABEL, GROUP_COUNT_ANNOTATION})
"""Kueue's keys the operator sets on worker pods itself (a pod template's own are dropped)."""

WORKLOAD_API = ("kueue.x-k8s.io", "v1beta2", "workloads")


@dataclasses.dataclass(frozen=True)
class Queue:
    """The LocalQueue (and priority) an FSDPJob asked for by its labels."""

    name: str
    job_name: str
    priority_class: str | None = None

    @classmethod
    def of(cls, job_name: str, *labels: Mapping[str, str] | None) -> Queue | None:
        """From the FSDPJob's labels (then its pod template's); None when they name no queue:
        Kueue is not involved."""
        for found in labels:
            name = (found or {}).get(QUEUE_LABEL, "")
            if name:
                priority = (found or {}).get(PRIORITY_LABEL) or None
                return cls(name=name, job_name=job_name, priority_class=priority)
        return None

    def group(self, attempt: int) -> str:
        """The pod group (and Kueue Workload) of the gang `attempt` starts."""
        return names.pod_group(self.job_name, attempt=attempt)

    def pod_keys(self, *, attempt: int, count: int) -> tuple[dict[str, str], dict[str, str]]:
        """(labels, annotations) that make one attempt's `count` pods one Kueue pod group."""
        labels = {QUEUE_LABEL: self.name, GROUP_LABEL: self.group(attempt)}
        if self.priority_class:
            labels[PRIORITY_LABEL] = self.priority_class
        return labels, {GROUP_COUNT_ANNOTATION: str(count)}


@dataclasses.dataclass(frozen=True)
class Admission:
    """Kueue's word on a pod group's Workload, from its conditions."""

    admitted: bool
    reason: str = ""  # of QuotaReserved (e.g. Pending) or Admitted
    message: str = ""  # e.g. "couldn't assign flavors to pod set ...: insufficient quota ..."
    cluster_queue: str = ""


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
