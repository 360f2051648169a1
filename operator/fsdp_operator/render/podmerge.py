"""Merging the user's pod-template overrides (volumes, affinity) with the operator's own.

Part of the pure templating (templates.py builds the pod around it): dicts in, dicts out, no
I/O, no clock, no kopf, no kubernetes client. A user override that would break what the
operator relies on raises TemplateError naming the field, the value and what is allowed.

Scheduling: one worker per node through a required pod anti-affinity on the job *and attempt*
labels; the attempt narrows it so the previous attempt's terminating pods do not block the
next attempt's placement. Nodes blamed for failures are excluded through a required node
affinity term added to every user nodeSelectorTerm (terms are ORed, so adding it to only one
would not exclude anything).
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Sequence
from typing import Any

from fsdp_operator.types import api, kubetypes, names, spec_pod
from fsdp_worker import contract
from fsdp_worker.contract import keeper

CHECKPOINT_VOLUME = "fsdp-checkpoint"
SHM_VOLUME = "fsdp-shm"  # NCCL and data-loader workers need more than the 64 MiB default
SHM_PATH = "/dev/shm"
MEMORY_VOLUME = (
    "fsdp-memory"  # checkpoint.memory: the memory tier (fsdp_worker.checkpointing.memtier)
)
TMP_VOLUME = "fsdp-tmp"  # the root filesystem is read-only; torch and Python write under /tmp
TMP_PATH = "/tmp"
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
GANG_KEY_VOLUME = "fsdp-gang-key"  # inPlaceRestarts: the attempt's key, for the keepers
GANG_KEY_ITEM = posixpath.basename(keeper.GANG_KEY_FILE)


class TemplateError(ValueError):
    """A spec the CRD accepted but the operator cannot turn into pods. Names field and value."""


def volumes(spec: api.FSDPJobSpec, *, shm_size: str | int | None = None) -> list[dict[str, Any]]:
    """The operator's volumes (shared memory, its size a runtime profile's `shm_size`; the
    checkpoint claim) then the user's."""
    _check_user_volumes(spec)
    shm: dict[str, Any] = {"medium": "Memory"}
    if shm_size is not None:
        shm["sizeLimit"] = str(shm_size)
    result: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "emptyDir": shm},
        {"name": TMP_VOLUME, "emptyDir": {}},
    ]
    if spec.checkpoint.memory is not None:
        memory = {"medium": "Memory", "sizeLimit": spec.checkpoint.memory.size_limit}
        result.append({"name": MEMORY_VOLUME, "emptyDir": memory})
    if spec.checkpoint.claim_name:
        result.append(
            {
                "name": CHECKPOINT_VOLUME,
                "persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name},
            }
        )
    return result + [volume.to_api() for volume in spec.template.spec.volumes]


def gang_key_volumes(spec: api.FSDPJobSpec, *, name: str) -> list[dict[str, Any]]:
    """With restarts in place: Secret `name` (the attempt's gang key), readable by the pod's
    group only (fsGroup); none otherwise."""
    if not spec.failure_policy.in_place_restarts:
        return []
    secret = {"secretName": name, "defaultMode": 0o440}
    return [{"name": GANG_KEY_VOLUME, "secret": secret}]


def volume_mounts(spec: api.FSDPJobSpec) -> list[dict[str, Any]]:
    """The worker container's mounts: the operator's then the user's."""
    mounts: list[dict[str, Any]] = [
        {"name": SHM_VOLUME, "mountPath": SHM_PATH},
        {"name": TMP_VOLUME, "mountPath": TMP_PATH},
    ]
    if spec.checkpoint.memory is not None:
        mounts.append({"name": MEMORY_VOLUME, "mountPath": contract.MEMORY_MOUNT})
    if spec.checkpoint.claim_name:
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.root})
    if spec.failure_policy.in_place_restarts:
        key = {"name": GANG_KEY_VOLUME, "mountPath": keeper.GANG_KEY_DIR, "readOnly": True}
        mounts.append(key)
    return mounts + [mount.to_api() for mount in spec.template.spec.volume_mounts]


def reserved_paths(spec: api.FSDPJobSpec) -> list[str]:
    """Where the operator mounts in the worker container: no one else's mount may overlap."""
    reserved = [SHM_PATH, TMP_PATH, contract.DEFAULT_TERMINATION_LOG, contract.MEMORY_MOUNT]
    reserved.append(keeper.GANG_KEY_DIR)
    if spec.checkpoint.claim_name:
        reserved.append(spec.checkpoint.root)
    return reserved


def _check_user_volumes(spec: api.FSDPJobSpec) -> None:
    overrides = spec.template.spec
    declared = {volume.name for volume in overrides.volumes}
    reserved = reserved_paths(spec)
    for index, mount in enumerate(overrides.volume_mounts):
        field = f"template.spec.volumeMounts[{index}]"
        problem = spec_pod.mount_problem(field, mount, declared, "template.spec.volumes")
        if problem:
            raise TemplateError(problem)
        path = mount.mountPath
        clash = [r for r in reserved if within(posixpath.normpath(path), r)]
        if clash:
            raise TemplateError(
                f"{field}.mountPath={path!r} overlaps {clash[0]!r}, which the operator mounts"
                " (checkpoint.claimName's volume, /dev/shm, /tmp, the termination log);"
                " mount elsewhere"
            )


def check_init_mounts(spec: api.FSDPJobSpec) -> None:
    """An init container or sidecar mounts only template.spec.volumes (the operator's own,
    the gang key's among them, are the worker's), at an absolute path without '..'."""
    declared = sorted(volume.name for volume in spec.template.spec.volumes)
    for index, container in enumerate(spec.template.spec.init_containers):
        for at, mount in enumerate(container.volume_mounts):
            field = f"template.spec.initContainers[{index}].volumeMounts[{at}]"
            if mount.name not in declared:
                raise TemplateError(
                    f"{field}.name={mount.name!r} is not one of template.spec.volumes {declared}"
                )
            path = mount.mountPath
            if not path.startswith("/") or ".." in path.split("/"):
                raise TemplateError(
                    f"{field}.mountPath={path!r} must be an absolute path without '..'"
                )


def within(path: str, root: str) -> bool:
    """`path` is `root` or under it."""
    root = posixpath.normpath(root)
    return path == root or path.startswith(root.rstrip("/") + "/")


def affinity(
    user: kubetypes.Affinity | None,
    *,
    job_name: str,
    attempt: int,
    excluded_nodes: Sequence[str],
) -> dict[str, Any]:
    """The user's affinity plus one-worker-per-node and the excluded nodes."""
    merged = user.to_api() if user is not None else {}
    anti = _section(merged, "podAntiAffinity", dict)
    required = _section(anti, "requiredDuringSchedulingIgnoredDuringExecution", list)
    required.append(
        {
            "labelSelector": {
                "matchLabels": names.attempt_selector_labels(job_name, attempt=attempt)
            },
            "topologyKey": HOSTNAME_TOPOLOGY,
        }
    )
    if excluded_nodes:
        node = _section(merged, "nodeAffinity", dict)
        selector = _section(node, "requiredDuringSchedulingIgnoredDuringExecution", dict)
        terms = _section(selector, "nodeSelectorTerms", list) or [{}]
        if not all(isinstance(term, dict) for term in terms):
            raise TemplateError(
                f"template.spec.affinity: nodeSelectorTerms={terms!r} must be objects"
            )
        exclude = {
            "key": "metadata.name",
            "operator": "NotIn",
            "values": sorted(set(excluded_nodes)),
        }
        selector["nodeSelectorTerms"] = [
            {**term, "matchFields": [*term.get("matchFields", []), copy.deepcopy(exclude)]}
            for term in terms
        ]
    return merged


def _section(parent: dict[str, Any], key: str, kind: type) -> Any:
    """parent[key], created empty when absent; TemplateError when the user's has another type."""
    if parent.get(key) is None:
        parent[key] = kind()
    value = parent[key]
    if not isinstance(value, kind):
        shape = "an object" if kind is dict else "a list"
        raise TemplateError(f"template.spec.affinity: {key}={value!r} must be {shape}")
    return value
