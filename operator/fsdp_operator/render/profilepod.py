"""A runtime profile's pod fragments in a worker pod: its annotations, volumes, the worker
container's mounts of them, its native sidecars and the host's network.

Part of the pure templating (templates.py builds the pod around it): dicts in, dicts out, no
I/O, no clock, no kopf. Every worker pod and every spare of a job naming the profile gets the
same fragments; a job under no profile gets none. Where the profile's parts and the job's would
collide (a volume or container name, a mount path), TemplateError names both: Kubernetes would
refuse the pod, and silently preferring one side would hide whose part went missing.
"""

from __future__ import annotations

import posixpath
from typing import Any

from fsdp_operator.render import podmerge, worker_container
from fsdp_operator.types import api, names

HOST_NETWORK_DNS = "ClusterFirstWithHostNet"  # a hostNetwork pod still resolves the Service


def check(spec: api.FSDPJobSpec, profile: api.RuntimeProfileSpec | None) -> None:
    """TemplateError when the job's own pod parts collide with its profile's."""
    if profile is None or spec.runtime_profile is None:
        return
    name, own = spec.runtime_profile, spec.template.spec
    _check_names(
        [v.name for v in own.volumes], [v.name for v in profile.volumes], name=name, kind="volume"
    )
    _check_names(
        [c.name for c in own.init_containers],
        [c.name for c in profile.sidecars],
        name=name,
        kind="container",
    )
    _check_mounts(spec, profile, name=name)


_FIELDS = {
    "volume": ("template.spec.volumes", "volumes"),
    "container": ("template.spec.initContainers", "sidecars"),
}


def _check_names(own: list[str], theirs: list[str], *, name: str, kind: str) -> None:
    """TemplateError naming both sides when a job's `kind` reuses a name of its profile's."""
    job_field, profile_field = _FIELDS[kind]
    mine = {n: i for i, n in enumerate(own)}
    for index, taken in enumerate(theirs):
        if taken in mine:
            raise podmerge.TemplateError(
                f"{job_field}[{mine[taken]}].name={taken!r} is also runtime profile {name!r}'s"
                f" {profile_field}[{index}]: rename the job's {kind}"
            )


def _check_mounts(spec: api.FSDPJobSpec, profile: api.RuntimeProfileSpec, *, name: str) -> None:
    reserved = podmerge.reserved_paths(spec)
    own = {
        posixpath.normpath(m.mountPath): i for i, m in enumerate(spec.template.spec.volume_mounts)
    }
    for index, mount in enumerate(profile.volume_mounts):
        path = posixpath.normpath(mount.mountPath)
        field = f"runtime profile {name!r}'s volumeMounts[{index}].mountPath={mount.mountPath!r}"
        clash = [r for r in reserved if podmerge.within(path, r) or podmerge.within(r, path)]
        if clash:
            raise podmerge.TemplateError(
                f"{field} overlaps {clash[0]!r}, which the operator mounts in the worker"
                " (/dev/shm, /tmp, the termination log, checkpoint.root): ask the cluster admin"
                " to mount it elsewhere, or move checkpoint.root"
            )
        if path in own:
            raise podmerge.TemplateError(
                f"{field} is also template.spec.volumeMounts[{own[path]}].mountPath: mount the"
                " job's volume elsewhere"
            )


def volumes(profile: api.RuntimeProfileSpec | None) -> list[dict[str, Any]]:
    """The profile's pod volumes (hostPath among them)."""
    return [volume.to_api() for volume in profile.volumes] if profile else []


def sidecars(profile: api.RuntimeProfileSpec | None) -> list[dict[str, Any]]:
    """The profile's native sidecars, each with the security context the admin gave it
    (unset: the worker's restricted one)."""
    rendered = []
    for sidecar in profile.sidecars if profile else []:
        own = sidecar.security_context or api.SidecarSecurity()
        rendered.append(worker_container.side_container(sidecar, context=own.to_api()))
    return rendered


def pod_fields(profile: api.RuntimeProfileSpec | None) -> dict[str, Any]:
    """hostNetwork (with the DNS policy that keeps cluster names resolving) when granted."""
    if profile is None or not profile.host_network:
        return {}
    return {"hostNetwork": True, "dnsPolicy": HOST_NETWORK_DNS}


def pod_annotations(
    profile: api.RuntimeProfileSpec | None, job_annotations: dict[str, str]
) -> dict[str, str]:
    """The job's annotations with the profile's over them: the admin's choices (a mesh opt-out,
    the networks a hostNetwork or multi-network pod joins) are not the tenant's to undo. The
    operator's own keys are set after, and win over both."""
    theirs = dict(profile.annotations) if profile else {}
    return {**job_annotations, **{k: v for k, v in theirs.items() if not names.is_operator_key(k)}}
