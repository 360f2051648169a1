"""The security-context fields a team's container and the worker pod may set, and the
capabilities a team's container may add: only what a Pod Security "restricted" namespace allows
(never privileged, no uid or gid 0, no privilege escalation, no capability but NET_BIND_SERVICE
unless a runtime profile grants it).

Apart from spec_containers.py (the containers themselves) because these are the rules that keep
every part of the pod inside "restricted". Each lives twice, as a bound or CEL rule in the CRD
and as a Python check whose message names the field, the value and what is allowed. No I/O, no
clock, no kopf.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any

import pydantic
from pydantic import Field

from fsdp_operator.types.spec_rules import SpecModel, cel, rules

MAX_ID = 2**31 - 1


class SidecarCapability(enum.StrEnum):
    """What a team's container may add: NET_BIND_SERVICE (restricted allows it), and the
    capabilities a runtime profile may grant (spec_pod.Capability), under that profile only."""

    NET_BIND_SERVICE = "NET_BIND_SERVICE"
    IPC_LOCK = "IPC_LOCK"
    SYS_NICE = "SYS_NICE"


RESTRICTED_CAPABILITIES = (SidecarCapability.NET_BIND_SERVICE.value,)


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
