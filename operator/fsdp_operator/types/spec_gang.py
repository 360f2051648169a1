"""`spec.gangScheduling` (of an FSDPJob, or of its FSDPRuntimeProfile): which gang scheduler's
PodGroup each attempt's pods belong to, so none of them is placed until all of them can be.

Beside Kueue (queueing.py), which admits a gang's quota; these place it. Two schedulers are
known: scheduler-plugins' Coscheduling plugin (a kube-scheduler built with it, run as a second
scheduler) and Volcano. Each has its own PodGroup API and its own way of naming a pod's group
(`api_of`, `member_keys`). What the operator makes of them is rendered in render/podgroup.py.
No I/O, no clock, no kopf.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import TYPE_CHECKING

import pydantic
from pydantic import Field

from fsdp_operator.types.spec_rules import NAME_PATTERN, SpecModel, cel, rules

if TYPE_CHECKING:
    from fsdp_operator.types import api


class GangKind(enum.StrEnum):
    """The gang schedulers whose PodGroup the operator makes."""

    COSCHEDULING = "Coscheduling"  # scheduler-plugins (sigs.k8s.io/scheduler-plugins)
    VOLCANO = "Volcano"  # volcano.sh


DEFAULT_SCHEDULER = {
    GangKind.COSCHEDULING: "scheduler-plugins-scheduler",
    GangKind.VOLCANO: "volcano",
}
"""The pods' schedulerName when neither gangScheduling nor the pod template names one: the
names those projects' own install manifests give their schedulers."""

COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
VOLCANO_ANNOTATION = "scheduling.k8s.io/group-name"
MEMBER_KEYS = frozenset({COSCHEDULING_LABEL, VOLCANO_ANNOTATION})
"""The keys that make a pod a member of a PodGroup: set by the operator only (a pod template's
own are dropped while gangScheduling is on, so no pod joins a group by hand beside it)."""


@dataclasses.dataclass(frozen=True)
class PodGroupApi:
    """Where a scheduler's PodGroups are served."""

    group: str
    version: str
    plural: str = "podgroups"
    kind: str = "PodGroup"

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"


API = {
    GangKind.COSCHEDULING: PodGroupApi("scheduling.x-k8s.io", "v1alpha1"),
    GangKind.VOLCANO: PodGroupApi("scheduling.volcano.sh", "v1beta1"),
}


class GangScheduling(SpecModel):
    """A gang scheduler's PodGroup for each attempt: minMember is the attempt's pods (spares
    are not members: they wait for no gang and hold none up)."""

    kind: GangKind = Field(
        description="Whose PodGroup: Coscheduling (scheduler-plugins, "
        "scheduling.x-k8s.io/v1alpha1) or Volcano (scheduling.volcano.sh/v1beta1)."
    )
    scheduler_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="The scheduler that runs the plugin (the pods' schedulerName). Unset: "
        "template.spec.schedulerName, else scheduler-plugins-scheduler (Coscheduling) or "
        "volcano (Volcano).",
    )
    schedule_timeout_seconds: int | None = Field(
        None,
        ge=1,
        le=86_400,
        description="Coscheduling only: how long the scheduler holds a partly placed gang "
        "before it lets all of its places go (the PodGroup's scheduleTimeoutSeconds). Unset: "
        "the plugin's permitWaitingTimeSeconds.",
    )
    queue: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="Volcano only: the Volcano Queue of the PodGroup. Unset: Volcano's default.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel(
                "!has(self.scheduleTimeoutSeconds) || self.kind == 'Coscheduling'",
                "scheduleTimeoutSeconds is Coscheduling's (kind: Coscheduling)",
                fieldPath=".scheduleTimeoutSeconds",
            ),
            cel(
                "!has(self.queue) || self.kind == 'Volcano'",
                "queue is Volcano's (kind: Volcano)",
                fieldPath=".queue",
            ),
        )
    )

    @pydantic.model_validator(mode="after")
    def _fields_of_kind(self) -> GangScheduling:
        if self.schedule_timeout_seconds is not None and self.kind is not GangKind.COSCHEDULING:
            raise ValueError(
                f"gangScheduling.scheduleTimeoutSeconds={self.schedule_timeout_seconds} is"
                f" Coscheduling's; kind={self.kind} has none (remove it, or kind: Coscheduling)"
            )
        if self.queue is not None and self.kind is not GangKind.VOLCANO:
            raise ValueError(
                f"gangScheduling.queue={self.queue!r} is Volcano's; kind={self.kind} has none"
                " (remove it, or kind: Volcano)"
            )
        return self

    @property
    def api(self) -> PodGroupApi:
        return API[self.kind]

    def scheduler(self, template_scheduler: str | None) -> str:
        """The pods' schedulerName: this one's, the template's, else the kind's default."""
        return self.scheduler_name or template_scheduler or DEFAULT_SCHEDULER[self.kind]

    def member_keys(self, group: str) -> tuple[dict[str, str], dict[str, str]]:
        """(labels, annotations) that make a pod a member of PodGroup `group`."""
        if self.kind is GangKind.COSCHEDULING:
            return {COSCHEDULING_LABEL: group}, {}
        return {}, {VOLCANO_ANNOTATION: group}


def scheduler_refusal(gang: GangScheduling | None, template_scheduler: str | None) -> str:
    """Why a job's two scheduler names disagree ("" when they do not)."""
    if gang is None or gang.scheduler_name is None or template_scheduler is None:
        return ""
    if gang.scheduler_name == template_scheduler:
        return ""
    return (
        f"gangScheduling.schedulerName={gang.scheduler_name!r} and"
        f" template.spec.schedulerName={template_scheduler!r} disagree: the pods have one"
        " scheduler (set one of them, or both the same)"
    )


SCHEDULER_RULE = cel(
    "!has(self.gangScheduling) || !has(self.gangScheduling.schedulerName) ||"
    " !has(self.template.spec.schedulerName) ||"
    " self.gangScheduling.schedulerName == self.template.spec.schedulerName",
    "gangScheduling.schedulerName and template.spec.schedulerName disagree: the pods have one"
    " scheduler (set one of them, or both the same)",
    fieldPath=".gangScheduling.schedulerName",
)


def effective(
    spec: api.FSDPJobSpec, profile: api.RuntimeProfileSpec | None
) -> GangScheduling | None:
    """The gang scheduling a job's pods get: its own, else its runtime profile's, else none."""
    if spec.gang_scheduling is not None:
        return spec.gang_scheduling
    return profile.gang_scheduling if profile is not None else None
