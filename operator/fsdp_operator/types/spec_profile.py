"""The FSDPRuntimeProfile: what a cluster admin lets the jobs of some namespaces have beyond
Pod Security "restricted" (capabilities, RDMA and hugepages resources, a runtime class,
registries, priority classes), and what it adds to their pods.

A profile is the cluster admin's: cluster-scoped, and no tenant role may write it. A job names
one in spec.runtimeProfile. The chart's admission policies check every FSDPJob that names one
and every pod the operator makes under one against it (the API server's
ValidatingAdmissionPolicy with the profile as its parameter); `RuntimeProfileSpec.refusal` is
the operator's own copy of the job-level check. Apart from api.py because it is a CRD of its
own, with another owner; callers read these models as api.<Name>. No I/O, no clock, no kopf.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import pydantic
from pydantic import Field

from fsdp_operator.types import kubetypes, spec_containers, spec_gang, spec_profile_pod
from fsdp_operator.types.spec_pod import Capability, EnvVar
from fsdp_operator.types.spec_rules import (
    DNS_LABEL_PATTERN,
    KEYS_RULE,
    NAME_PATTERN,
    SpecModel,
    cel,
    check_keys,
    rules,
)
from fsdp_worker.contract import config_base

if TYPE_CHECKING:
    from fsdp_operator.types import api

PROFILE_ONLY_RESOURCES = ("rdma/", "hugepages-")
"""Resource name prefixes only a profile grants (the chart's admissionPolicies default)."""
PROFILE_KIND = "FSDPRuntimeProfile"
PROFILE_PLURAL = "fsdpruntimeprofiles"
PROFILE_SINGULAR = "fsdpruntimeprofile"
PROFILE_SHORT_NAMES = ["fsdprp"]
RESTRICTED_PROFILE = "restricted"
"""The chart's own profile, which grants nothing: the admission policy's parameter for every
pod made under no profile (or under one the chart does not bind)."""
REGISTRY_PATTERN = (
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*$"
)
_OWN_RESOURCES = ("cpu", "memory", "ephemeral-storage")


class ProfileEnv(EnvVar):
    """A variable every worker pod under the profile gets (a job's own env wins)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel("has(self.value) && !has(self.valueFrom)", "a profile's env sets value only")
        )
    )

    @pydantic.model_validator(mode="after")
    def _value_only(self) -> ProfileEnv:
        if self.value is None or self.valueFrom is not None:
            raise ValueError(f"profile env {self.name!r}: set value (and no valueFrom)")
        return self


DnsLabel = Annotated[str, Field(max_length=63, pattern=DNS_LABEL_PATTERN)]
ObjectName = Annotated[str, Field(max_length=253, pattern=NAME_PATTERN)]


class RuntimeProfileSpec(SpecModel):
    """`spec` of an FSDPRuntimeProfile: what its jobs may have beyond restricted, and get."""

    namespaces: list[DnsLabel] = Field(
        default_factory=list,
        max_length=1024,
        description="The namespaces whose FSDPJobs may name this profile (empty: none).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=len(Capability),
        description="Capabilities a job may ask for in template.spec.capabilities.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    resources: dict[str, kubetypes.Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Resources added to every worker container's requests and limits, e.g. "
        "{rdma/ib: 1, hugepages-2Mi: 2Gi}. Names under rdma/ and hugepages- come only from a "
        "profile; a job may ask for at most these amounts. Not cpu, memory or "
        "ephemeral-storage (the job's own).",
        json_schema_extra=rules(
            KEYS_RULE,
            cel(
                "self.all(k, !(k in " + str(list(_OWN_RESOURCES)) + "))",
                "resources may not name cpu, memory or ephemeral-storage (the job's own)",
            ),
        ),
    )
    runtime_class_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="RuntimeClass of the worker pods (e.g. nvidia).",
    )
    shm_size: kubetypes.Quantity | None = Field(
        None,
        description="Size limit of the worker pods' /dev/shm (a memory-backed emptyDir; unset: "
        "no limit of its own, the pod's memory bounds it).",
    )
    env: list[ProfileEnv] = Field(
        default_factory=list,
        max_length=64,
        description="Variables every worker container gets, e.g. NCCL_IB_HCA, NCCL_SOCKET_IFNAME;"
        " a job's own env of the same name wins.",
    )
    image_registries: list[Annotated[str, Field(max_length=255, pattern=REGISTRY_PATTERN)]] = Field(
        default_factory=list,
        max_length=64,
        description="Registries (host[:port][/path]) a job's image must come from, matched "
        "as written: `registry.example.com/team` admits registry.example.com/team/<image>. "
        "Empty: any.",
    )
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets (in the job's namespace) the worker pods pull their image with.",
    )
    priority_class_names: list[ObjectName] = Field(
        default_factory=list,
        max_length=64,
        description="PriorityClasses a job may set in template.spec.priorityClassName. Empty: "
        "any (the system-* ones stay refused).",
    )
    gang_scheduling: spec_gang.GangScheduling | None = Field(
        None,
        description="The gang scheduler (and its PodGroup kind) of every job under the profile "
        "that sets no spec.gangScheduling of its own.",
    )
    annotations: dict[str, Annotated[str, Field(max_length=65_536)]] = Field(
        default_factory=dict,
        max_length=32,
        description="Annotations of every worker pod, e.g. a service mesh's opt-out or GKE's "
        "multi-network ones. They win over a job's own of the same key (a tenant may not turn "
        "the platform's choice back); the operator's own keys win over both and may not be set.",
        json_schema_extra=rules(
            KEYS_RULE,
            cel(
                "self.all(k, !k.startsWith('fsdpoperator.io/'))",
                "fsdpoperator.io/ is the operator's",
            ),
        ),
    )
    volumes: list[spec_profile_pod.ProfileVolume] = Field(
        default_factory=list,
        max_length=16,
        description="Volumes added to every worker pod, e.g. a fabric's libraries from the node "
        "(hostPath: allowed here only, since only the cluster admin writes a profile). A job's "
        "template.spec.volumes may not reuse their names.",
    )
    volume_mounts: list[kubetypes.VolumeMount] = Field(
        default_factory=list,
        max_length=16,
        description="Mounts of those volumes in every worker container (not at the operator's "
        "/dev/shm, /tmp, termination log or checkpoint root, nor where the job mounts its own).",
    )
    sidecars: list[spec_profile_pod.ProfileSidecar] = Field(
        default_factory=list,
        max_length=8,
        description="Native sidecars (restartPolicy Always) added to every worker pod before the "
        "job's own init containers, e.g. a fabric's receive-datapath daemon. Never ranks; "
        "their securityContext may go beyond restricted. They mount the profile's volumes only; "
        "a job's init container may not reuse their names.",
    )
    host_network: bool = Field(
        False,
        description="true: worker pods use the node's network (with dnsPolicy "
        "ClusterFirstWithHostNet, so they still resolve the job's Service). NetworkPolicies do "
        "not apply to such pods.",
    )

    @pydantic.field_validator("resources")
    @classmethod
    def _resources(cls, values: dict[str, Any]) -> dict[str, Any]:
        own = [k for k in values if k in _OWN_RESOURCES]
        if own:
            raise ValueError(f"resources may not name {own[0]!r} (the job's own)")
        check_keys({k: str(v) for k, v in values.items()}, what="resource")
        return values

    @pydantic.field_validator("annotations")
    @classmethod
    def _annotations(cls, values: dict[str, str]) -> dict[str, str]:
        return spec_profile_pod.check_annotations(values)

    @pydantic.model_validator(mode="after")
    def _fragments(self) -> RuntimeProfileSpec:
        spec_profile_pod.check_fragments(
            volumes=self.volumes, mounts=self.volume_mounts, sidecars=self.sidecars
        )
        return self

    def refusal(self, spec: api.FSDPJobSpec, *, namespace: str, name: str) -> str:
        """Why a job in `namespace` may not have `spec` under this profile ("" when it may).
        The chart's admission policy for FSDPJobs says the same at admission."""
        if namespace not in self.namespaces:
            return (
                f"spec.runtimeProfile={name!r}: namespace {namespace!r} is not one of the"
                f" profile's namespaces {self.namespaces}"
            )
        extra = [str(c) for c in spec.template.spec.capabilities if c not in self.capabilities]
        if extra:
            return (
                f"spec.template.spec.capabilities: {extra[0]} is not granted by runtime profile"
                f" {name!r} (it grants {[str(c) for c in self.capabilities]})"
            )
        images = [("spec.image", spec.image)] + [
            (f"spec.template.spec.initContainers[{i}].image", c.image)
            for i, c in enumerate(spec.template.spec.init_containers)
        ]
        for field, image in images:
            if self.image_registries and not any(
                image.startswith(r + "/") for r in self.image_registries
            ):
                return (
                    f"{field}={image!r} is not from a registry runtime profile {name!r}"
                    f" allows {self.image_registries}"
                )
        if refused := spec_containers.refusal(spec, granted=[str(c) for c in self.capabilities]):
            return refused
        wanted = spec.template.spec.priority_class_name
        if self.priority_class_names and wanted and wanted not in self.priority_class_names:
            return (
                f"spec.template.spec.priorityClassName={wanted!r} is not one runtime profile"
                f" {name!r} allows {self.priority_class_names}"
            )
        if spec.gang_scheduling is None and (
            refused := spec_gang.scheduler_refusal(
                self.gang_scheduling, spec.template.spec.scheduler_name
            )
        ):  # the profile's gang scheduling applies: its scheduler and the job's must agree
            return f"runtime profile {name!r}: {refused}"
        return resource_refusal(spec, granted=self.resources, profile=name)


def resource_refusal(
    spec: api.FSDPJobSpec, *, granted: dict[str, Any], profile: str | None = None
) -> str:
    """A profile-only resource (rdma/, hugepages-) the job asks for beyond its profile's."""
    asked = {**(spec.resources.requests or {}), **(spec.resources.limits or {})}
    for key, value in asked.items():
        if not key.startswith(PROFILE_ONLY_RESOURCES):
            continue
        if key not in granted:
            where = f"runtime profile {profile!r}" if profile else "no runtime profile"
            return (
                f"spec.resources: {key} comes only from a runtime profile, and {where}" " grants it"
            )
        if config_base.quantity(value) > config_base.quantity(granted[key]):
            return (
                f"spec.resources: {key}={value} exceeds runtime profile {profile!r}'s"
                f" {granted[key]}"
            )
    return ""


class FSDPRuntimeProfile(SpecModel):
    """The object as the operator reads it: only its spec matters."""

    spec: RuntimeProfileSpec
