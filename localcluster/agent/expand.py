"""Pure pod-spec interpretation: ``$(VAR)`` expansion, container environment, argv.

Ported from Kubernetes' ``third_party/forked/golang/expansion`` and the kubelet's env rules so
a container here sees what it would see under a real kubelet. No I/O: config-map lookups are
passed in as a function. Secrets are not resolved (the project's pods hold none).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

JSON = dict[str, Any]
ConfigMapLookup = Callable[[str, str], "dict[str, str] | None"]
"""(namespace, name) -> the ConfigMap's data, or None when it does not exist."""


class EnvError(ValueError):
    """A container's environment cannot be built (the kubelet's CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: ``$$`` escapes, unknown references stay as written."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            read, is_var, advance = _read_name(text[cursor + 1 :])
            if is_var:
                out.append(env.get(read, f"$({read})"))
            else:
                out.append(read)
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _read_name(rest: str) -> tuple[str, bool, int]:
    if rest[0] == "$":
        return "$", False, 1
    if rest[0] == "(":
        end = rest.find(")", 1)
        if end != -1:
            return rest[1:end], True, end + 1
        return "$(", False, 1
    return "$" + rest[0], False, 1


_SUBSCRIPT = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: JSON, path: str) -> str:
    """The downward-API value of ``fieldRef.fieldPath`` for this pod."""
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status", {})
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
        "status.podIPs": ",".join(p["ip"] for p in status.get("podIPs", [])),
        "status.hostIPs": ",".join(p["ip"] for p in status.get("hostIPs", [])),
    }
    if path in simple:
        return str(simple[path] or "")
    if match := _SUBSCRIPT.match(path):
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    raise EnvError(f"fieldRef.fieldPath {path!r} is not supported by the process node")


def _value_from(pod: JSON, source: JSON, *, configmaps: ConfigMapLookup) -> str | None:
    namespace = pod["metadata"]["namespace"]
    if "fieldRef" in source:
        return field_ref(pod, source["fieldRef"]["fieldPath"])
    if ref := source.get("configMapKeyRef"):
        data = configmaps(namespace, ref["name"])
        if data is not None and ref["key"] in data:
            return data[ref["key"]]
        if ref.get("optional"):
            return None
        raise EnvError(f"configMapKeyRef {ref['name']}/{ref['key']} not found")
    kind = next(iter(source), "?")
    raise EnvError(f"env valueFrom.{kind} is not supported by the process node")


def container_env(
    pod: JSON, container: JSON, *, base: Mapping[str, str], configmaps: ConfigMapLookup
) -> dict[str, str]:
    """The process environment: ``base`` (image-like defaults), envFrom, then env in order."""
    env = dict(base)
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            raise EnvError("envFrom supports configMapRef only on the process node")
        data = configmaps(pod["metadata"]["namespace"], ref["name"])
        if data is None and not ref.get("optional"):
            raise EnvError(f"envFrom configMap {ref['name']} not found")
        for key, value in (data or {}).items():
            env[source.get("prefix", "") + key] = value
    for var in container.get("env", []):
        if "valueFrom" in var:
            resolved = _value_from(pod, var["valueFrom"], configmaps=configmaps)
            if resolved is not None:
                env[var["name"]] = resolved
        else:
            env[var["name"]] = expand(var.get("value", ""), env)
    return env


def container_argv(container: JSON, env: Mapping[str, str]) -> list[str]:
    """command + args, expanded; with no image there is no entrypoint to fall back on."""
    argv = [*container.get("command", []), *container.get("args", [])]
    if not argv:
        raise EnvError(
            f"container {container['name']!r}: command or args is required on a process node "
            "(the image, and so its entrypoint, is ignored)"
        )
    return [expand(part, env) for part in argv]
