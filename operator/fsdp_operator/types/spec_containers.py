"""The team's own parts of a worker pod: init containers and native sidecars, `envFrom`,
pod-level DRA claims, pull secrets, topology spread and the security-context fields a
Pod Security "restricted" namespace allows.

Apart from spec_pod.py (the template's scheduling, volumes and env) because these are the
parts a platform plugs into every training pod, each with the rule that keeps it inside
"restricted": never privileged, no uid or gid 0, no privilege escalation, no capability but
NET_BIND_SERVICE unless a runtime profile grants it. Each rule lives twice, as a pattern or CEL
rule in the CRD and as a Python check whose message names the field, the value and what is
allowed. Callers read these models as api.<Name>. No I/O, no clock, no kopf.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
from pydantic import Field

from fsdp_operator.types import kubetypes
from fsdp_operator.types.spec_rules import (
    DNS_LABEL_PATTERN,
    IMAGE_PATTERN,
    NAME_PATTERN,
    SpecModel,
    cel,
    rules,
)

if TYPE_CHECKING:
    from fsdp_operator.types import api

NO_VAR_EXPANSION = "!self.contains('$(')"
RESERVED_ENV_PREFIX = "FSDP_"  # the worker reads this prefix (FSDP_WORKER_CONFIG_FILE, ...)
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
WORKER_CONTAINER = "worker"  # names.CONTAINER_NAME: the operator's
RESERVED_PREFIX = "fsdp-"
MAX_ID = 2**31 - 1
ENV_PREFIX_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
PROFILE_ONLY_PREFIXES = ("rdma/", "hugepages-")  # spec_profile.PROFILE_ONLY_RESOURCES


class SidecarCapability(enum.StrEnum):
    """What a team's container may add: NET_BIND_SERVICE (restricted allows it), and the
    capabilities a runtime profile may grant (spec_pod.Capability), under that profile only."""

    NET_BIND_SERVICE = "NET_BIND_SERVICE"
    IPC_LOCK = "IPC_LOCK"
    SYS_NICE = "SYS_NICE"


RESTRICTED_CAPABILITIES = (SidecarCapability.NET_BIND_SERVICE.value,)


def reserved_name(
    *, pattern: str, max_length: int, prefix: str, description: str
) -> Any:  # a FieldInfo
    """A name field that may not start with the operator's `prefix`: CEL at admission."""
    message = f"names starting with {prefix} are reserved for the operator"
    rule = cel(f"!self.startsWith('{prefix}')", message)
    return Field(
        pattern=pattern,
        max_length=max_length,
        description=description,
        json_schema_extra=rules(rule),
    )


def refuse_reserved(name: str, *, kind: str, prefix: str) -> str:
    """The same rule in the operator's check (the model also reads specs the CRD never saw)."""
    if name.startswith(prefix):
        raise ValueError(
            f"{kind} name {name!r}: names starting with {prefix!r} are reserved for the"
            " operator; choose another name"
        )
    return name


class EnvVar(kubetypes.EnvVar):
    """A container's env var: Kubernetes' EnvVar without `$(VAR)` expansion or the operator's
    names."""

    name: str = reserved_name(
        pattern=ENV_NAME_PATTERN,
        max_length=128,
        prefix=RESERVED_ENV_PREFIX,
        description=f"Variable name; names starting with {RESERVED_ENV_PREFIX} are reserved.",
    )
    value: str | None = Field(
        None,
        max_length=4096,
        description="The value, as written: it must not contain '$(' (Kubernetes would expand "
        "it). Or set valueFrom.",
        json_schema_extra=rules(
            cel(NO_VAR_EXPANSION, "value must not contain '$(' (variable expansion)")
        ),
    )

    @pydantic.field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        return refuse_reserved(name, kind="env", prefix=RESERVED_ENV_PREFIX)

    @pydantic.field_validator("value")
    @classmethod
    def _no_expansion(cls, value: str | None) -> str | None:
        if value is not None and "$(" in value:
            raise ValueError(f"env value {value!r} must not contain '$(' (variable expansion)")
        return value


def checked(value: str, *, field: str, pattern: str, allowed: str, max_length: int) -> str:
    """`value` if it matches `pattern`; else a refusal naming the field, the value and what is
    allowed (pydantic's own pattern message gives neither the value nor the words)."""
    if len(value) > max_length or not re.fullmatch(pattern, value):
        raise ValueError(f"{field}={value!r} is not allowed: {allowed} (<= {max_length})")
    return value


def _pattern(
    pattern: str, max_length: int, description: str, *, optional: bool = False
) -> Any:  # a FieldInfo
    """A string field the CRD checks by pattern and the model by `checked`."""
    return Field(
        None if optional else ...,
        description=description,
        json_schema_extra={"pattern": pattern, "maxLength": max_length},
    )


NAME_WORDS = "a lowercase DNS name ([a-z0-9] and '-', starting and ending alphanumeric)"


def _nonzero_id(value: int | None, *, field: str) -> int | None:
    if value is not None and not 1 <= value <= MAX_ID:
        raise ValueError(
            f"{field}={value} is not allowed: ids 1..{MAX_ID} (0 is root's, which Pod Security"
            ' "restricted" forbids)'
        )
    return value


def _id_field(description: str) -> Any:  # a FieldInfo
    return Field(None, ge=1, le=MAX_ID, description=description)


_NOT_ROOT = rules(cel("self == true", "runAsNonRoot may only be true (restricted)"))


class Capabilities(SpecModel):
    """Capabilities a team's container adds; every other one stays dropped (drop: ALL)."""

    add: list[str] = Field(
        default_factory=list,
        max_length=len(SidecarCapability),
        description="NET_BIND_SERVICE; IPC_LOCK and SYS_NICE only with spec.runtimeProfile "
        "granting them.",
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            **rules(
                cel(
                    f"self.all(c, c in {[str(c) for c in SidecarCapability]})",
                    "capabilities.add may name only NET_BIND_SERVICE, or IPC_LOCK and SYS_NICE"
                    " under a runtime profile granting them",
                )
            ),
        },
    )

    @pydantic.field_validator("add")
    @classmethod
    def _known(cls, caps: list[str]) -> list[str]:
        allowed = [str(c) for c in SidecarCapability]
        for cap in caps:
            if cap not in allowed:
                raise ValueError(
                    f"capabilities.add={cap!r} is not allowed: a team's container may add"
                    " NET_BIND_SERVICE, or IPC_LOCK and SYS_NICE where spec.runtimeProfile grants"
                    ' them (Pod Security "restricted" drops every other capability)'
                )
        return caps


class ContainerSecurity(SpecModel):
    """The security-context fields of a team's container a restricted namespace allows."""

    run_as_user: int | None = _id_field("uid of this container; not 0.")
    run_as_group: int | None = _id_field("Its primary gid; not 0.")
    run_as_non_root: bool | None = Field(
        None, description="Only true (the pod's is true).", json_schema_extra=_NOT_ROOT
    )
    privileged: bool | None = Field(
        None,
        description="Only false.",
        json_schema_extra=rules(cel("self == false", "privileged may only be false")),
    )
    allow_privilege_escalation: bool | None = Field(
        None,
        description="Only false (the operator sets false).",
        json_schema_extra=rules(
            cel("self == false", "allowPrivilegeEscalation may only be false (restricted)")
        ),
    )
    read_only_root_filesystem: bool | None = Field(
        None, description="Unset: true, as the worker's; false lets the image write its root."
    )
    capabilities: Capabilities | None = None

    @pydantic.field_validator("run_as_user", "run_as_group", mode="before")
    @classmethod
    def _ids(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        if isinstance(value, int):
            _nonzero_id(value, field=f"securityContext.{_camel(info.field_name)}")
        return value

    @pydantic.model_validator(mode="after")
    def _restricted(self) -> ContainerSecurity:
        _refuse_root(self.run_as_non_root)
        if self.privileged:
            raise ValueError(
                "securityContext.privileged=true is not allowed: no team container is"
                ' privileged (Pod Security "restricted"); only false'
            )
        if self.allow_privilege_escalation:
            raise ValueError(
                "securityContext.allowPrivilegeEscalation=true is not allowed (restricted);"
                " only false"
            )
        return self


def _camel(name: str | None) -> str:
    head, *rest = (name or "").split("_")
    return head + "".join(part.title() for part in rest)


def _refuse_root(run_as_non_root: bool | None) -> None:
    if run_as_non_root is False:
        raise ValueError(
            "securityContext.runAsNonRoot=false is not allowed: pods run as non-root"
            ' (Pod Security "restricted"); only true'
        )


class PodSecurity(SpecModel):
    """`template.spec.securityContext`: the pod-level ids a restricted namespace allows. The
    rest (seccomp RuntimeDefault, runAsNonRoot) stays the operator's."""

    run_as_user: int | None = Field(
        None, ge=1, le=MAX_ID, description="uid of every container (default 1000); not 0."
    )
    run_as_group: int | None = Field(
        None, ge=1, le=MAX_ID, description="Primary gid (default 1000); not 0."
    )
    fs_group: int | None = Field(
        None,
        ge=1,
        le=MAX_ID,
        description="Group owning the pod's volumes (default 1000; the gang key is readable "
        "by it); not 0.",
    )
    supplemental_groups: list[Annotated[int, Field(ge=1, le=MAX_ID)]] = Field(
        default_factory=list, max_length=32, description="More gids; not 0."
    )
    run_as_non_root: bool | None = Field(
        None, description="Only true (the operator sets it).", json_schema_extra=_NOT_ROOT
    )

    @pydantic.field_validator("run_as_user", "run_as_group", "fs_group", mode="before")
    @classmethod
    def _ids(cls, value: Any, info: pydantic.ValidationInfo) -> Any:
        if isinstance(value, int):
            _nonzero_id(value, field=f"securityContext.{_camel(info.field_name)}")
        return value

    @pydantic.field_validator("supplemental_groups", mode="before")
    @classmethod
    def _groups(cls, value: Any) -> Any:
        for gid in value if isinstance(value, list) else []:
            if isinstance(gid, int):
                _nonzero_id(gid, field="securityContext.supplementalGroups[]")
        return value

    @pydantic.model_validator(mode="after")
    def _restricted(self) -> PodSecurity:
        _refuse_root(self.run_as_non_root)
        return self

    def to_api(self) -> dict[str, Any]:
        """The fields set, as the pod's securityContext takes them."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True)


class EnvSource(SpecModel):
    """A ConfigMap or Secret (in the job's namespace) whose keys become variables."""

    name: str = _pattern(NAME_PATTERN, 253, "The object's name.")
    optional: bool | None = Field(
        None, description="true: the pod starts without it (and its variables)."
    )

    @pydantic.field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return checked(name, field="name", pattern=NAME_PATTERN, allowed=NAME_WORDS, max_length=253)


class EnvFrom(SpecModel):
    """`envFrom`: every key of one ConfigMap or Secret as a variable, after a prefix. The
    operator's own variables (FSDP_*, and those it sets) win over a key of the same name."""

    config_map_ref: EnvSource | None = None
    secret_ref: EnvSource | None = None
    prefix: str | None = Field(
        None,
        description="Put before every key; not FSDP_ (the worker's prefix).",
        json_schema_extra={
            "pattern": ENV_PREFIX_PATTERN,
            "maxLength": 64,
            **rules(cel("!self.startsWith('FSDP_')", "prefix FSDP_ is the operator's")),
        },
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel(
                "has(self.configMapRef) != has(self.secretRef)",
                "set exactly one of configMapRef and secretRef",
            )
        )
    )

    @pydantic.model_validator(mode="after")
    def _one(self) -> EnvFrom:
        if (self.config_map_ref is None) == (self.secret_ref is None):
            raise ValueError("envFrom: set exactly one of configMapRef and secretRef")
        if self.prefix is not None:
            words = "a variable-name prefix ([A-Za-z_][A-Za-z0-9_]*), not FSDP_"
            checked(
                self.prefix,
                field="prefix",
                pattern=ENV_PREFIX_PATTERN,
                allowed=words,
                max_length=64,
            )
            if self.prefix.startswith("FSDP_"):
                raise ValueError(f"envFrom.prefix={self.prefix!r} is not allowed: {words}")
        return self


class PullSecret(SpecModel):
    """A Secret of the job's namespace the kubelet pulls images with (a team's registry)."""

    name: str = _pattern(NAME_PATTERN, 253, "The Secret's name.")

    @pydantic.field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return checked(name, field="name", pattern=NAME_PATTERN, allowed=NAME_WORDS, max_length=253)


class PodClaim(SpecModel):
    """`template.spec.resourceClaims[]`: a DRA ResourceClaim of the pod (GPUs, an NVL72
    compute domain), by name or made per pod from a template; a container's
    `resources.claims[].name` names it."""

    name: str = _pattern(DNS_LABEL_PATTERN, 63, "The claim's name in the pod.")
    resource_claim_name: str | None = _pattern(
        NAME_PATTERN, 253, "A ResourceClaim to share.", optional=True
    )
    resource_claim_template_name: str | None = _pattern(
        NAME_PATTERN, 253, "A ResourceClaimTemplate: a claim of its own per pod.", optional=True
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel(
                "has(self.resourceClaimName) != has(self.resourceClaimTemplateName)",
                "set exactly one of resourceClaimName and resourceClaimTemplateName",
            )
        )
    )

    @pydantic.model_validator(mode="after")
    def _one(self) -> PodClaim:
        checked(
            self.name, field="name", pattern=DNS_LABEL_PATTERN, allowed=NAME_WORDS, max_length=63
        )
        given = [n for n in (self.resource_claim_name, self.resource_claim_template_name) if n]
        if len(given) != 1:
            raise ValueError(
                f"resourceClaims {self.name!r}: set exactly one of resourceClaimName and"
                " resourceClaimTemplateName"
            )
        checked(given[0], field="claim", pattern=NAME_PATTERN, allowed=NAME_WORDS, max_length=253)
        return self


class Container(SpecModel):
    """An init container, or with restartPolicy Always a native sidecar (log shipper, data
    prefetch, a FUSE mount's helper): it starts before the worker, runs beside it, never
    counts as a rank, and its crash or exit is not a rank failure. Held to the worker's
    restricted security context unless it sets the fields allowed here."""

    name: str = _pattern(DNS_LABEL_PATTERN, 63, "Container name; not worker, not fsdp-*.")
    image: str = _pattern(IMAGE_PATTERN, 512, "Its image (a runtime profile's registries apply).")
    image_pull_policy: str | None = Field(
        None,
        description="Always, IfNotPresent or Never (unset: the kubelet's default).",
        json_schema_extra={"enum": ["Always", "IfNotPresent", "Never"]},
    )
    command: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=64,
        description="Its entrypoint (no shell unless it names one); every $ is literal: "
        "Kubernetes' $(VAR) expansion is escaped.",
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=256, description="Its arguments, literal as command."
    )
    working_dir: str | None = Field(
        None, max_length=1024, pattern=r"^/", description="An absolute directory to start in."
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="Variables, as the worker's env (no FSDP_*, no $( in values).",
    )
    env_from: list[EnvFrom] = Field(
        default_factory=list,
        max_length=16,
        description="ConfigMaps and Secrets whose keys become its variables.",
    )
    resources: kubetypes.ResourceRequirements = Field(
        default_factory=kubetypes.ResourceRequirements,
        description="Its own requests and limits (not under rdma/ or hugepages-, the "
        "worker's); claims name template.spec.resourceClaims.",
    )
    volume_mounts: list[kubetypes.VolumeMount] = Field(
        default_factory=list,
        max_length=64,
        description="Mounts of template.spec.volumes (the operator's own are the worker's).",
    )
    restart_policy: str | None = Field(
        None,
        description="Always: a native sidecar (runs beside the worker). Unset: an init "
        "container that runs to completion before the worker starts.",
        json_schema_extra={"enum": ["Always"]},
    )
    security_context: ContainerSecurity | None = None

    @pydantic.model_validator(mode="after")
    def _check(self) -> Container:
        checked(
            self.name, field="name", pattern=DNS_LABEL_PATTERN, allowed=NAME_WORDS, max_length=63
        )
        if self.name == WORKER_CONTAINER or self.name.startswith(RESERVED_PREFIX):
            raise ValueError(
                f"name={self.name!r} is not allowed: {WORKER_CONTAINER} and names starting with"
                f" {RESERVED_PREFIX} are the operator's"
            )
        image_words = "an image reference of [A-Za-z0-9._/:@-], no spaces or shell"
        checked(
            self.image, field="image", pattern=IMAGE_PATTERN, allowed=image_words, max_length=512
        )
        if self.restart_policy not in (None, "Always"):
            raise ValueError(f"restartPolicy={self.restart_policy!r}: only Always (a sidecar)")
        if self.image_pull_policy not in (None, "Always", "IfNotPresent", "Never"):
            raise ValueError(
                f"imagePullPolicy={self.image_pull_policy!r}: Always, IfNotPresent or Never"
            )
        _profile_only_resources(self)
        return self

    @property
    def sidecar(self) -> bool:
        """A native sidecar: restartPolicy Always."""
        return self.restart_policy == "Always"

    @property
    def added_capabilities(self) -> list[str]:
        caps = self.security_context.capabilities if self.security_context else None
        return list(caps.add) if caps else []


def _profile_only_resources(container: Container) -> None:
    parts = (container.resources.requests or {}, container.resources.limits or {})
    for key in (k for part in parts for k in part):
        if key.startswith(PROFILE_ONLY_PREFIXES):
            raise ValueError(
                f"resources: {key} is not allowed in container {container.name!r}: resources"
                " under rdma/ and hugepages- are the worker's (spec.resources), from a runtime"
                " profile"
            )


def refusal(spec: api.FSDPJobSpec, *, granted: Sequence[str] = ()) -> str:
    """Why the job's own containers may not run as asked ("" when they may): a
    resources.claims name no template.spec.resourceClaims declares, or a capability beyond
    NET_BIND_SERVICE that `granted` (its runtime profile's) does not hold."""
    pod = spec.template.spec
    declared = sorted(c.name for c in pod.resource_claims)
    owners = [("spec.resources", spec.resources)]
    owners += [
        (f"initContainers[{i}].resources", c.resources) for i, c in enumerate(pod.init_containers)
    ]
    for field, resources in owners:
        for claim in resources.claims or []:
            if claim.name not in declared:
                return (
                    f"{field}.claims: {claim.name!r} is not one of"
                    f" spec.template.spec.resourceClaims {declared} (a claim is declared for the"
                    " pod, then named by its containers)"
                )
    allowed = [*RESTRICTED_CAPABILITIES, *granted]
    for index, container in enumerate(pod.init_containers):
        extra = [c for c in container.added_capabilities if c not in allowed]
        if extra:
            where = "no spec.runtimeProfile" if not granted else "the runtime profile grants"
            return (
                f"spec.template.spec.initContainers[{index}].securityContext.capabilities.add:"
                f" {extra[0]} is not allowed: NET_BIND_SERVICE, or what spec.runtimeProfile"
                f" grants ({where}{'' if not granted else ' ' + ', '.join(granted)})"
            )
    return ""
