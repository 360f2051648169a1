"""Pure templating of an attempt's PodGroup (spec.gangScheduling): scheduler-plugins'
Coscheduling or Volcano's, whose scheduler places none of the attempt's pods until it can place
minMember of them.

One per attempt, named like the attempt's Kueue pod group (`<job>-g<attempt>`), because its
size is the attempt's: a shrunk or regrown gang gets a new one and the old is deleted
(policy/podgroups.py decides, run/objects.py writes). minMember is the attempt's worker pods;
spares are not members (they carry no group key): a spare waits for no gang, so an unplaceable
spare never holds the gang back, and the scheduler places it as a lone pod. Owned by the job,
so the garbage collector deletes the last one with it.

Pure: no I/O, no clock, no kopf, no kubernetes client objects.
"""

from __future__ import annotations

from typing import Any

from fsdp_operator.render import templates
from fsdp_operator.types import api, names, spec_gang


def name(job: names.JobRef, *, attempt: int) -> str:
    """The PodGroup of the gang `attempt` started."""
    return names.pod_group(job.name, attempt=attempt)


def _spec(gang: spec_gang.GangScheduling, spec: api.FSDPJobSpec, members: int) -> dict[str, Any]:
    """minMember, and what else the kind's PodGroup takes from the job."""
    body: dict[str, Any] = {"minMember": members}
    if gang.kind is spec_gang.GangKind.COSCHEDULING:
        if gang.schedule_timeout_seconds is not None:
            body["scheduleTimeoutSeconds"] = gang.schedule_timeout_seconds
        return body
    if gang.queue is not None:
        body["queue"] = gang.queue
    if spec.template.spec.priority_class_name:
        body["priorityClassName"] = spec.template.spec.priority_class_name
    return body


def pod_group(
    job: names.JobRef,
    spec: api.FSDPJobSpec,
    *,
    gang: spec_gang.GangScheduling,
    attempt: int,
    members: int,
) -> dict[str, Any]:
    """The PodGroup of `attempt`'s gang of `members` worker pods."""
    where = gang.api
    return {
        "apiVersion": where.api_version,
        "kind": where.kind,
        "metadata": {
            "name": name(job, attempt=attempt),
            "namespace": job.namespace,
            "labels": {
                names.Label.APP_NAME.value: names.APP_NAME,
                names.Label.APP_INSTANCE.value: names.job_label_value(job.name),
                names.Label.APP_MANAGED_BY.value: names.MANAGER,
                names.Label.ATTEMPT.value: str(attempt),
                **names.selector_labels(job.name),
            },
            "ownerReferences": [templates.owner_reference(job)],
        },
        "spec": _spec(gang, spec, members),
    }
