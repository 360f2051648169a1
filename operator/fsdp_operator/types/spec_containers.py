"""The team's own parts of a worker pod: init containers and native sidecars, `envFrom`,
pod-level DRA claims and pull secrets.

Apart from spec_pod.py (the template's scheduling, volumes and env) because these are the
parts a platform plugs into every training pod, each with the rule that keeps it inside Pod
Security "restricted"; the security-context fields and capabilities those rules allow live in
spec_security.py. Each rule lives twice, as a pattern or CEL rule in the CRD and as a Python
check whose message names the field, the value and what is allowed. Callers read these models
as api.<Name>. No I/O, no clock, no kopf.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

import pydantic
from pydantic import Field

from fsdp_operator.types import kubetypes, spec_security
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
ENV_PREFIX_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
PROFILE_ONLY_PREFIXES = ("rdma/", "hugepages-")  # spec_profile.PROFILE_ONLY_RESOURCES


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
    security_context: spec_security.ContainerSecurity | None = None

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
    allowed = [*spec_security.RESTRICTED_CAPABILITIES, *granted]
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
