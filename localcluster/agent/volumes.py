"""Pod volumes as local directories, and each container's bind mounts onto them.

emptyDir lives in the pod's directory under the agent's state dir (``medium: Memory`` under
``memory_root``, on the host's /dev/shm tmpfs, so a /dev/shm volume behaves like one); a
persistentVolumeClaim maps to ``<state>/pvc/<namespace>/<claim>`` shared by every pod that
names it (read-write-many, as a shared checkpoint volume needs); hostPath is the host path
itself. configMap, downwardAPI and projected volumes (the service-account volume the API server
injects) are written out as files once, when the pod starts. Secret volumes are not supported.
The launcher does the mounting; this module only decides what goes where and fills the
directories.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localcluster.agent import expand

JSON = dict[str, Any]
TokenRequest = Callable[[JSON, JSON], str]
"""(pod, serviceAccountToken projection source) -> a token bound to the pod."""


class VolumeError(ValueError):
    """A volume cannot be set up on a process node."""


def _write_files(root: Path, files: dict[str, str]) -> None:
    for rel, content in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)


def _config_map_files(
    pod: JSON, source: JSON, *, configmaps: expand.ConfigMapLookup
) -> dict[str, str]:
    data = configmaps(pod["metadata"]["namespace"], source["name"])
    if data is None:
        if source.get("optional"):
            return {}
        raise VolumeError(f"configMap {source['name']!r} not found")
    if items := source.get("items"):
        return {item["path"]: data[item["key"]] for item in items if item["key"] in data}
    return dict(data)


def _downward_files(pod: JSON, source: JSON) -> dict[str, str]:
    return {
        item["path"]: expand.field_ref(pod, item["fieldRef"]["fieldPath"])
        for item in source.get("items", [])
        if "fieldRef" in item
    }


def _projected_files(
    pod: JSON, volume: JSON, *, configmaps: expand.ConfigMapLookup, token: TokenRequest
) -> dict[str, str]:
    files: dict[str, str] = {}
    for source in volume.get("sources", []):
        if "configMap" in source:
            files |= _config_map_files(pod, source["configMap"], configmaps=configmaps)
        elif "downwardAPI" in source:
            files |= _downward_files(pod, source["downwardAPI"])
        elif "serviceAccountToken" in source:
            files[source["serviceAccountToken"]["path"]] = token(pod, source["serviceAccountToken"])
        else:
            raise VolumeError(f"projected source {next(iter(source))!r} is not supported")
    return files


def prepare(
    pod: JSON,
    *,
    pod_dir: Path,
    pvc_root: Path,
    memory_root: Path,
    configmaps: expand.ConfigMapLookup,
    token: TokenRequest,
) -> dict[str, Path]:
    """Create every volume of the pod; volume name -> host directory (or file for hostPath)."""
    dirs: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes", []):
        name = volume["name"]
        local = pod_dir / "volumes" / name
        if "emptyDir" in volume:
            if (volume["emptyDir"] or {}).get("medium") == "Memory":
                local = memory_root / name
            local.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in volume:
            local = Path(volume["hostPath"]["path"])
            if volume["hostPath"].get("type", "") in ("", "DirectoryOrCreate"):
                local.mkdir(parents=True, exist_ok=True)
        elif claim := volume.get("persistentVolumeClaim"):
            local = pvc_root / pod["metadata"]["namespace"] / claim["claimName"]
            local.mkdir(parents=True, exist_ok=True)
        elif "configMap" in volume:
            _write_files(local, _config_map_files(pod, volume["configMap"], configmaps=configmaps))
        elif "downwardAPI" in volume:
            _write_files(local, _downward_files(pod, volume["downwardAPI"]))
        elif "projected" in volume:
            files = _projected_files(pod, volume["projected"], configmaps=configmaps, token=token)
            _write_files(local, files)
        else:
            kind = next((k for k in volume if k != "name"), "?")
            raise VolumeError(f"volume {name!r}: {kind} volumes are not supported")
        if not local.exists():
            local.mkdir(parents=True)
        dirs[name] = local
    return dirs


def container_mounts(
    container: JSON, *, volumes: dict[str, Path], termination_file: Path
) -> list[JSON]:
    """The launcher's mount list: each volumeMount, then the termination-message file."""
    mounts = []
    for mount in container.get("volumeMounts", []):
        if mount["name"] not in volumes:
            raise VolumeError(f"volumeMount {mount['name']!r} names no volume of the pod")
        source = volumes[mount["name"]]
        if sub := mount.get("subPath"):
            if os.path.isabs(sub) or ".." in Path(sub).parts:
                raise VolumeError(f"volumeMount subPath {sub!r} must stay inside the volume")
            source = source / sub
            source.mkdir(parents=True, exist_ok=True)
        mounts.append(
            {
                "source": str(source),
                "target": mount["mountPath"],
                "readOnly": bool(mount.get("readOnly")),
            }
        )
    termination_file.touch()
    path = container.get("terminationMessagePath") or "/dev/termination-log"
    mounts.append({"source": str(termination_file), "target": path, "readOnly": False})
    return mounts
