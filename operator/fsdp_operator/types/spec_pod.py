"""`spec.template` of an FSDPJob: the pod fields a user may set, and the names that stay the
operator's (its env prefix, its volumes, confinement annotations).

Apart from api.py because the pod template is a world of its own, typed as Kubernetes types it
(kubetypes.py), with the restrictions Pod Security "restricted" and the operator add; the
runtime profile (spec_profile.py) shares its env variable and capability types. Callers read
these models as api.<Name>. No I/O, no clock, no kopf.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from typing import Annotated

import pydantic
from pydantic import Field

from fsdp_operator.types import kubetypes, spec_containers, spec_security
from fsdp_operator.types.spec_containers import (
    ENV_NAME_PATTERN as ENV_NAME_PATTERN,
)
from fsdp_operator.types.spec_containers import (
    NO_VAR_EXPANSION as NO_VAR_EXPANSION,
)
from fsdp_operator.types.spec_containers import (
    RESERVED_ENV_PREFIX as RESERVED_ENV_PREFIX,
)
from fsdp_operator.types.spec_containers import (
    EnvVar as EnvVar,
)
from fsdp_operator.types.spec_rules import (
    DNS_LABEL_PATTERN,
    KEYS_RULE,
    NAME_PATTERN,
    SpecModel,
    cel,
    check_keys,
    rules,
)

LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
RESERVED_VOLUME_PREFIX = "fsdp-"  # the operator's own volumes
# Annotations that loosen a container's confinement: Pod Security "baseline" forbids them.
CONFINEMENT_ANNOTATIONS = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
# The generated Volume holds exactly the sources Pod Security "restricted" allows.
VOLUME_SOURCES = tuple(name for name in kubetypes.Volume.model_fields if name != "name")


def mount_problem(
    field: str, mount: kubetypes.VolumeMount, declared: Collection[str], owner: str
) -> str:
    """What is wrong with a mount at `field` ("" when nothing): it must name one of `owner`'s
    volumes (`declared`) and sit at an absolute path without '..'. One rule for a job's own
    mounts (render/podmerge.py) and a runtime profile's (spec_profile_pod.py)."""
    if mount.name not in declared:
        return f"{field}.name={mount.name!r} is not one of {owner} {sorted(declared)}"
    path = mount.mountPath
    if not path.startswith("/") or ".." in path.split("/"):
        return f"{field}.mountPath={path!r} must be an absolute path without '..'"
    return ""


# What the API server would refuse when it creates the pod (core/v1 validation), said at
# admission of the FSDPJob instead of in its status after the operator's dry run.
_TOLERATION_RULES = (
    cel(
        "self.all(t, !has(t.operator) || t.operator in ['Exists', 'Equal'])",
        "tolerations[].operator must be Exists or Equal",
    ),
    cel(
        "self.all(t, !has(t.effect) || "
        "t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])",
        "tolerations[].effect must be NoSchedule, PreferNoSchedule or NoExecute",
    ),
    cel(
        "self.all(t, (has(t.key) && t.key != '') || (has(t.operator) && t.operator == 'Exists'))",
        "a toleration without a key must have operator Exists",
    ),
    cel(
        "self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')",
        "a toleration with operator Exists has no value",
    ),
    cel(
        "self.all(t, !has(t.tolerationSeconds) || (has(t.effect) && t.effect == 'NoExecute'))",
        "tolerations[].tolerationSeconds needs effect NoExecute",
    ),
)


_ONE_SOURCE = " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in VOLUME_SOURCES) + " <= 1"


class Volume(kubetypes.Volume):
    """A pod volume of one of the sources Pod Security "restricted" allows (no hostPath, ...)."""

    name: str = spec_containers.reserved_name(
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        prefix=RESERVED_VOLUME_PREFIX,
        description=f"Volume name; names starting with {RESERVED_VOLUME_PREFIX} are reserved.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(cel(_ONE_SOURCE, "a volume may have at most one source"))
    )

    @pydantic.field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        return spec_containers.refuse_reserved(name, kind="volume", prefix=RESERVED_VOLUME_PREFIX)

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> Volume:
        given = [k for k in VOLUME_SOURCES if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"volume {self.name!r} has sources {given}; at most one is allowed")
        return self


LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
_CONFINEMENT_RULE = cel(
    "!self.exists(k, "
    + " || ".join(f"k.startsWith('{prefix}')" for prefix in CONFINEMENT_ANNOTATIONS)
    + ")",
    "AppArmor and seccomp annotations are the operator's (it sets RuntimeDefault)",
)


class Capability(enum.StrEnum):
    """A capability a runtime profile may grant: what GPU networking needs, nothing more."""

    IPC_LOCK = "IPC_LOCK"  # RDMA: pin (register) memory for InfiniBand/RoCE verbs
    SYS_NICE = "SYS_NICE"  # NUMA binding and thread priorities of data-loader and NCCL threads


class PodOverrides(SpecModel):
    """`spec.template.spec`: the pod fields a user may set, as Kubernetes types them.

    Anything else in the pod is the operator's (seccomp, the worker's command, ports,
    hostname).
    """

    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels a node must have to run a worker pod.",
        json_schema_extra=rules(KEYS_RULE),
    )
    tolerations: list[kubetypes.Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Taints the worker pods tolerate (e.g. those of GPU nodes).",
        json_schema_extra=rules(*_TOLERATION_RULES),
    )
    affinity: kubetypes.Affinity | None = Field(
        None,
        description="Node and pod affinity of the worker pods. The operator adds its own "
        "rules: one worker pod per node, and none on nodes excluded after a failure.",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=64,
        description='More volumes for the worker pods, of the sources Pod Security "restricted" '
        "allows (no hostPath), one source each.",
    )
    volume_mounts: list[kubetypes.VolumeMount] = Field(
        default_factory=list,
        max_length=64,
        description="Where the worker container mounts those volumes; not at /dev/shm, /tmp, "
        "the termination log or checkpoint.root, which the operator mounts.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="More environment variables of the worker container, after the operator's "
        "own.",
    )
    termination_grace_period_seconds: int = Field(
        120,
        ge=1,
        le=86_400,
        description="Time a worker gets on SIGTERM to finish its step and save a checkpoint.",
    )
    priority_class_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="PriorityClass of the worker pods; the system-* classes are refused (they "
        "would let training preempt the pods that keep nodes and the cluster running).",
        json_schema_extra=rules(
            cel("!self.startsWith('system-')", "the system-* priority classes are reserved")
        ),
    )
    scheduler_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="Scheduler that places the worker pods; unset: the cluster's default.",
    )
    env_from: list[spec_containers.EnvFrom] = Field(
        default_factory=list,
        max_length=16,
        description="ConfigMaps and Secrets whose keys become variables of the worker "
        "container; its env, and the operator's own variables, win over a key of the same name.",
    )
    init_containers: list[spec_containers.Container] = Field(
        default_factory=list,
        max_length=16,
        description="The team's init containers (run to completion before the worker) and "
        "native sidecars (restartPolicy: Always: run beside it). Neither is a rank: a "
        "sidecar's crash or exit is not a rank failure (a SidecarRestarted Event and condition "
        "say it). Held to the worker's restricted security context.",
    )
    topology_spread_constraints: list[kubetypes.TopologySpreadConstraint] = Field(
        default_factory=list,
        max_length=8,
        description="How the worker pods spread over zones, racks or NVLink domains (the "
        "operator's one-pod-per-node rule stays).",
        json_schema_extra=rules(
            cel(
                "self.all(c, c.maxSkew >= 1 && c.whenUnsatisfiable in"
                " ['DoNotSchedule', 'ScheduleAnyway'])",
                "topologySpreadConstraints[]: maxSkew >= 1, whenUnsatisfiable DoNotSchedule or"
                " ScheduleAnyway",
            )
        ),
    )
    resource_claims: list[spec_containers.PodClaim] = Field(
        default_factory=list,
        max_length=16,
        description="DRA ResourceClaims of every worker pod (GPUs, a compute domain); "
        "spec.resources.claims and a container's resources.claims name them.",
    )
    image_pull_secrets: list[spec_containers.PullSecret] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets of the job's namespace to pull the images with (a team's own "
        "registry), beside those of spec.runtimeProfile.",
    )
    security_context: spec_security.PodSecurity | None = Field(
        None,
        description="uid, gid, fsGroup and supplemental groups of the pod (default 1000); "
        "never 0. Seccomp and runAsNonRoot stay the operator's.",
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=len(Capability),
        description="Linux capabilities added to the worker container (all others stay "
        "dropped). Only with spec.runtimeProfile, and only those its profile grants.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @pydantic.field_validator("priority_class_name")
    @classmethod
    def _not_system(cls, name: str | None) -> str | None:
        if name is not None and name.startswith("system-"):
            raise ValueError(
                f"priorityClassName {name!r}: the system-* priority classes are reserved for"
                " the pods that keep nodes and the cluster running"
            )
        return name

    @pydantic.model_validator(mode="after")
    def _containers(self) -> PodOverrides:
        names = [c.name for c in self.init_containers]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"initContainers: name {twice[0]!r} is used twice; names are unique")
        claims = {c.name for c in self.resource_claims}
        if len(claims) < len(self.resource_claims):
            raise ValueError("resourceClaims: every claim needs a name of its own")
        return self

    @pydantic.field_validator("node_selector")
    @classmethod
    def _selector_keys(cls, values: dict[str, str]) -> dict[str, str]:
        return check_keys(values, what="nodeSelector")


class TemplateMetadata(SpecModel):
    """`spec.template.metadata`: labels and annotations the user adds to the job's objects."""

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels added to every worker pod and to the job's headless Service. Keys "
        "under fsdpoperator.io/ and the operator's own label keys are dropped.",
        json_schema_extra=rules(KEYS_RULE),
    )
    annotations: dict[str, Annotated[str, Field(max_length=65_536)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations added to every worker pod. Keys under fsdpoperator.io/ are "
        "dropped; AppArmor and seccomp ones are refused (the operator sets RuntimeDefault).",
        json_schema_extra=rules(KEYS_RULE, _CONFINEMENT_RULE),
    )

    @pydantic.field_validator("labels")
    @classmethod
    def _label_keys(cls, values: dict[str, str]) -> dict[str, str]:
        return check_keys(values, what="label")

    @pydantic.field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, values: dict[str, str]) -> dict[str, str]:
        for key in values:
            if key.startswith(CONFINEMENT_ANNOTATIONS):
                raise ValueError(
                    f"annotation {key!r} sets a container's AppArmor or seccomp profile, which"
                    " Pod Security forbids users to loosen; the operator sets RuntimeDefault"
                )
        return check_keys(values, what="annotation")


class PodTemplate(SpecModel):
    """`spec.template`: pod overrides merged into every worker pod."""

    metadata: TemplateMetadata = Field(
        default_factory=TemplateMetadata,
        description="Labels and annotations for the worker pods.",
    )
    spec: PodOverrides = Field(
        default_factory=PodOverrides,
        description="The pod fields a user may set, as Kubernetes types them. The rest of the "
        "pod (security context, command, ports, hostname) is the operator's.",
    )
