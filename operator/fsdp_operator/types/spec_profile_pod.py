"""The pod fragments a runtime profile adds to every worker pod of its jobs: pod annotations,
volumes (hostPath among them), mounts of those volumes in the worker container, native sidecars
(a fabric's receive-datapath daemon) and the host's network.

Apart from spec_profile.py (what a profile lets a job ask for) because these are what the
cluster admin adds on their own authority, beyond Pod Security "restricted": no tenant can write
a profile, and a job's template still gets none of them (spec_pod.py refuses hostPath,
hostNetwork and privileged containers). The chart's admission policy lets an operator pod have
them only as its profile spells them. Callers read these models as api.<Name>. No I/O, no
clock, no kopf.
"""

from __future__ import annotations

import enum
import re
from typing import Any

import pydantic
from pydantic import Field

from fsdp_operator.types import kubetypes, spec_containers, spec_pod, spec_security
from fsdp_operator.types.spec_rules import SpecModel, cel, check_keys, rules

ABSOLUTE_PATH_PATTERN = r"^/[^\x00]*$"
CAPABILITY_PATTERN = r"^[A-Z_]{1,32}$"
OPERATOR_PREFIX = "fsdpoperator.io/"  # names.PREFIX (api.GROUP's), which imports this module


class HostPathType(enum.StrEnum):
    """Kubernetes' hostPath types: what must exist at the path (unset: nothing is checked)."""

    DIRECTORY_OR_CREATE = "DirectoryOrCreate"
    DIRECTORY = "Directory"
    FILE_OR_CREATE = "FileOrCreate"
    FILE = "File"
    SOCKET = "Socket"
    CHAR_DEVICE = "CharDevice"
    BLOCK_DEVICE = "BlockDevice"


class HostPath(SpecModel):
    """A directory or file of the node (the fabric's NCCL plugin, its libraries)."""

    path: str = Field(
        max_length=4096,
        pattern=ABSOLUTE_PATH_PATTERN,
        description="An absolute path on the node, without '..'.",
    )
    type: HostPathType | None = Field(None, description="What must exist there.")

    @pydantic.field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        if not path.startswith("/") or ".." in path.split("/"):
            raise ValueError(f"hostPath.path={path!r}: an absolute path without '..'")
        return path


_SOURCES = (*spec_pod.VOLUME_SOURCES, "hostPath")
_ONE_SOURCE = " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in _SOURCES) + " == 1"


class ProfileVolume(spec_pod.Volume):
    """A pod volume of the profile: a source a job's template may have, or a hostPath."""

    hostPath: HostPath | None = None  # Kubernetes' name, as kubetypes.Volume's

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(cel(_ONE_SOURCE, "a profile's volume has exactly one source"))
    )

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> ProfileVolume:
        given = [k for k in _SOURCES if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"runtime profile volume {self.name!r} has sources {given}; exactly one is"
                f" allowed, of {list(_SOURCES)}"
            )
        return self


class SidecarCapabilities(SpecModel):
    """Capabilities the profile's sidecar adds (every other one stays dropped)."""

    add: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Capability names without CAP_, e.g. NET_ADMIN.",
        json_schema_extra={
            "x-kubernetes-list-type": "set",
            "items": {"type": "string", "pattern": CAPABILITY_PATTERN},
        },
    )

    @pydantic.field_validator("add")
    @classmethod
    def _names(cls, caps: list[str]) -> list[str]:
        for cap in caps:
            if not re.fullmatch(CAPABILITY_PATTERN, cap):
                raise ValueError(f"capabilities.add={cap!r}: a capability name such as NET_ADMIN")
        return caps


class SidecarSecurity(SpecModel):
    """The security context of a profile's sidecar: the admin's to set beyond "restricted"
    (a fabric's daemon may need to be privileged, or root with NET_ADMIN). Unset: the worker's
    restricted context."""

    privileged: bool | None = Field(None, description="true: a privileged container.")
    run_as_user: int | None = Field(
        None, ge=0, le=spec_security.MAX_ID, description="Its uid; 0 runs it as root."
    )
    run_as_group: int | None = Field(None, ge=0, le=spec_security.MAX_ID, description="Its gid.")
    read_only_root_filesystem: bool | None = Field(
        None, description="Unset: true, as the worker's."
    )
    capabilities: SidecarCapabilities | None = None

    def to_api(self) -> dict[str, Any]:
        """The container's securityContext: "restricted" unless a field here loosens it."""
        caps = self.capabilities.add if self.capabilities else []
        if self.privileged:  # the API server refuses privileged without escalation
            context: dict[str, Any] = {"privileged": True}
        else:
            context = {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], **({"add": sorted(caps)} if caps else {})},
            }
        context["readOnlyRootFilesystem"] = self.read_only_root_filesystem is not False
        if self.run_as_user is not None:
            context["runAsUser"] = self.run_as_user
            # the pod says runAsNonRoot; a root sidecar must say otherwise for itself
            context["runAsNonRoot"] = self.run_as_user != 0
        if self.run_as_group is not None:
            context["runAsGroup"] = self.run_as_group
        return context


class ProfileSidecar(spec_containers.Container):
    """A native sidecar (restartPolicy Always) the profile adds to every worker pod, before the
    team's own init containers: never a rank, its crash or exit not a rank failure. It mounts
    the profile's volumes only."""

    restart_policy: str | None = Field(
        "Always",
        description="Always (the default): a profile's containers are native sidecars.",
        json_schema_extra={"enum": ["Always"]},
    )
    security_context: SidecarSecurity | None = None  # type: ignore[assignment]

    @pydantic.field_validator("restart_policy")
    @classmethod
    def _always(cls, policy: str | None) -> str:
        if policy != "Always":
            raise ValueError(
                f"restartPolicy={policy!r}: a runtime profile's sidecar runs beside the worker;"
                " only Always"
            )
        return policy

    @property
    def added_capabilities(self) -> list[str]:
        caps = self.security_context.capabilities if self.security_context else None
        return list(caps.add) if caps else []


def check_annotations(values: dict[str, str]) -> dict[str, str]:
    """The profile's pod annotations: qualified keys, none of the operator's."""
    for key in values:
        if key.startswith(OPERATOR_PREFIX):
            raise ValueError(
                f"annotations: key {key!r} is the operator's (under {OPERATOR_PREFIX}); a"
                " profile may not set it"
            )
        if key.startswith(spec_pod.CONFINEMENT_ANNOTATIONS):
            raise ValueError(
                f"annotations: key {key!r} sets a container's AppArmor or seccomp profile;"
                " the operator sets RuntimeDefault"
            )
    return check_keys(values, what="annotation")


def check_fragments(
    *,
    volumes: list[ProfileVolume],
    mounts: list[kubetypes.VolumeMount],
    sidecars: list[ProfileSidecar],
) -> None:
    """Names are unique, and every mount (the worker's, a sidecar's) names a profile volume at
    an absolute path without '..'."""
    for what, given in (
        ("volumes", [v.name for v in volumes]),
        ("sidecars", [s.name for s in sidecars]),
    ):
        twice = sorted({n for n in given if given.count(n) > 1})
        if twice:
            raise ValueError(f"{what}: name {twice[0]!r} is used twice; names are unique")
    declared = sorted(v.name for v in volumes)
    owners = [("volumeMounts", mounts)]
    owners += [(f"sidecars[{i}].volumeMounts", s.volume_mounts) for i, s in enumerate(sidecars)]
    for field, listed in owners:
        for index, mount in enumerate(listed):
            problem = spec_pod.mount_problem(
                f"{field}[{index}]", mount, declared, "the profile's volumes"
            )
            if problem:
                raise ValueError(problem)
