"""Generate `kubetypes.py` (pydantic models of Kubernetes pod parts) from the upstream OpenAPI.

`python -m hack.kubegen [OPENAPI_JSON] > operator/fsdp_operator/types/kubetypes.py` reads
`api/openapi-spec/v3/api__v1_openapi.json` of the pinned `k8s.io/kubernetes` module (found in
the Go module cache when no path is given) and writes one pydantic model per schema reachable
from the pod parts a user may set. A test regenerates and compares, so the committed file is
always the pinned release's types and never hand-edited.

A few narrowings are applied (KEEP_PROPERTIES, DROP_PROPERTIES): a `Volume` keeps only the
sources Pod Security "restricted" allows; an ephemeral volume's template metadata keeps only
labels and annotations (pod validation refuses the rest); cross-namespace pod affinity and
`subPathExpr` are left out. Defaults are dropped: the API server fills them when the pod is
created. This module reads one file and writes text; it never talks to a cluster.
"""

from __future__ import annotations

import json
import keyword
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

KUBE_VERSION = "v1.37.2"
ROOTS = (
    "io.k8s.api.core.v1.Affinity",
    "io.k8s.api.core.v1.Toleration",
    "io.k8s.api.core.v1.EnvVar",
    "io.k8s.api.core.v1.EnvFromSource",
    "io.k8s.api.core.v1.ResourceRequirements",
    "io.k8s.api.core.v1.Volume",
    "io.k8s.api.core.v1.VolumeMount",
    "io.k8s.api.core.v1.TopologySpreadConstraint",
    "io.k8s.api.core.v1.PodResourceClaim",
)
# Pod Security "restricted": the only volume sources a restricted pod may use.
RESTRICTED_VOLUME_SOURCES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
KEEP_PROPERTIES: dict[str, tuple[str, ...]] = {
    "io.k8s.api.core.v1.Volume": ("name", *RESTRICTED_VOLUME_SOURCES),
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta": ("labels", "annotations"),
}
# Fields left out on purpose: cross-namespace pod affinity (a reference into other teams'
# namespaces, which quota admins may forbid) and subPathExpr (Kubernetes expands `$(VAR)` in it).
DROP_PROPERTIES: dict[str, tuple[str, ...]] = {
    "io.k8s.api.core.v1.PodAffinityTerm": ("namespaces", "namespaceSelector"),
    "io.k8s.api.core.v1.VolumeMount": ("subPathExpr",),
}
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_RESERVED = {"copy", "dict", "json", "schema", "validate", "construct", "fields"}

HEADER = '''"""Kubernetes {version} pod parts as pydantic models. GENERATED: do not edit.

Written by `python -m hack.kubegen` from the upstream OpenAPI v3 document
(k8s.io/kubernetes {version}, api/openapi-spec/v3/api__v1_openapi.json);
tests/unit/test_kubetypes.py fails when this file drifts from it. `Volume` keeps only the
sources Pod Security "restricted" allows; `ObjectMeta` only labels and annotations (an
ephemeral volume's template); PodAffinityTerm has no namespaces/namespaceSelector and
VolumeMount no subPathExpr.
Pure data: no I/O.
"""

from __future__ import annotations

from typing import Annotated, Any

import pydantic
from pydantic import Field

QUANTITY_PATTERN = (
    r"^(\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\\+|-)?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))))?$"
)
# A resource quantity: `8`, `500m`, `4Gi`. The CRD types it as Kubernetes' int-or-string.
Quantity = Annotated[
    int | Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=64)],
    pydantic.WithJsonSchema(
        {{
            "anyOf": [{{"type": "integer"}}, {{"type": "string"}}],
            "pattern": QUANTITY_PATTERN,
            "x-kubernetes-int-or-string": True,
        }}
    ),
]


class KubeModel(pydantic.BaseModel):
    """Field names are the API's own; unknown fields are errors, as `kubectl --validate` does."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def to_api(self) -> dict[str, Any]:
        """The object as the API server takes it (unset fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)
'''


def find_openapi(version: str = KUBE_VERSION) -> Path:
    """The pinned module's core/v1 OpenAPI document, from the Go module cache.

    The control-plane build puts the module there; when it is not (a cleaned cache), `go mod
    download` fetches it from the Go module proxy.
    """
    found = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@{version}"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "GOFLAGS": "-mod=mod"},
    ).stdout
    return Path(json.loads(found)["Dir"]) / "api/openapi-spec/v3/api__v1_openapi.json"


def _short(ref: str) -> str:
    return ref.rsplit(".", 1)[-1]


def _ref_of(node: dict[str, Any]) -> str | None:
    if "$ref" in node:
        return str(node["$ref"]).rsplit("/", 1)[-1]
    for option in node.get("allOf", []):
        if "$ref" in option:
            return str(option["$ref"]).rsplit("/", 1)[-1]
    return None


def _schema(schemas: dict[str, Any], name: str) -> dict[str, Any]:
    node = dict(schemas[name])
    props = dict(node.get("properties", {}))
    keep = KEEP_PROPERTIES.get(name, tuple(props))
    drop = DROP_PROPERTIES.get(name, ())
    node["properties"] = {k: v for k, v in props.items() if k in keep and k not in drop}
    node["required"] = [r for r in node.get("required", []) if r in node["properties"]]
    return node


def reachable(schemas: dict[str, Any], roots: tuple[str, ...] = ROOTS) -> list[str]:
    """Schema names reachable from `roots`, dependencies first (a stable order)."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for prop in _schema(schemas, name).get("properties", {}).values():
            for node in (prop, prop.get("items") or {}, prop.get("additionalProperties") or {}):
                if isinstance(node, dict) and (ref := _ref_of(node)) is not None:
                    visit(ref)
        order.append(name)

    for root in roots:
        visit(root)
    return order


def _type(prop: dict[str, Any]) -> str:
    ref = _ref_of(prop)
    if ref == QUANTITY:
        return "Quantity"
    if ref is not None:
        return _short(ref)
    kind = prop.get("type")
    if kind == "array":
        return f"list[{_type(prop['items'])}]"
    if kind == "object":
        extra = prop.get("additionalProperties")
        return f"dict[str, {_type(extra)}]" if isinstance(extra, dict) else "dict[str, Any]"
    return {"string": "str", "integer": "int", "boolean": "bool", "number": "float"}[str(kind)]


def _first_sentence(text: str) -> str:
    line = " ".join(text.split())
    found = re.search(r"\.\s+[A-Z]", line)
    cut = found.start() if found else -1
    return (line if cut < 0 else line[: cut + 1]).replace('"""', "'''").replace("\\", "/")


def _field(name: str, prop: dict[str, Any], *, required: bool) -> str:
    kind = _type(prop)
    attr = name
    if keyword.iskeyword(name) or name in _RESERVED:
        attr = f"{name}_"
    args = [] if required else ["None"]
    if attr != name:
        args.append(f'alias="{name}"')
    annotation = kind if required else f"{kind} | None"
    if not args:
        return f"    {attr}: {annotation}"
    if required:
        return f"    {attr}: {annotation} = Field({', '.join(args)})"
    default = "None" if len(args) == 1 else f"Field({', '.join(args)})"
    return f"    {attr}: {annotation} = {default}"


def _class(schemas: dict[str, Any], name: str) -> str:
    node = _schema(schemas, name)
    doc = _first_sentence(node.get("description", _short(name)))
    required = set(node.get("required", []))
    lines = [f"class {_short(name)}(KubeModel):"]
    lines += textwrap.wrap(
        f'"""{doc} ({name})"""', 96, initial_indent="    ", subsequent_indent="    "
    )
    props = node.get("properties", {})
    if props:
        lines.append("")
    for prop_name in sorted(props, key=lambda p: (p not in required, p)):
        lines.append(_field(prop_name, props[prop_name], required=prop_name in required))
    return "\n".join(lines)


def render(document: dict[str, Any], *, version: str = KUBE_VERSION) -> str:
    schemas = document["components"]["schemas"]
    names = [n for n in reachable(schemas) if n != QUANTITY]
    classes = [_class(schemas, n) for n in names]
    # Free-form objects (FieldsV1) have no properties and are not reached once trimmed.
    return HEADER.format(version=version) + "\n\n" + "\n\n\n".join(classes) + "\n"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else find_openapi()
    sys.stdout.write(render(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
