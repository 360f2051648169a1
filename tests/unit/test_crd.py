"""The committed CRD is exactly what the spec model generates, and it is structural."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from fsdp_operator import api, crd

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_model() -> None:
    committed = (ROOT / "crds" / "fsdpjobs.yaml").read_text()
    assert committed == crd.render(), "run: python -m fsdp_operator.crd > crds/fsdpjobs.yaml"


def _int_or_string(node: dict[str, Any]) -> bool:
    """The one union a structural schema allows: Kubernetes' int-or-string (quantities)."""
    return bool(node.get("x-kubernetes-int-or-string")) and node["anyOf"] == [
        {"type": "integer"},
        {"type": "string"},
    ]


def _walk(node: Any, path: str = "") -> list[str]:
    """Paths of schema nodes that break structural-schema rules."""
    bad: list[str] = []
    if isinstance(node, dict):
        nested = "properties" in node or "items" in node or "additionalProperties" in node
        if nested and "type" not in node:
            bad.append(path or "/")
        for key in ("anyOf", "oneOf", "$ref", "$defs", "title", "const"):
            if key in node and not (key == "anyOf" and _int_or_string(node)):
                bad.append(f"{path}/{key}")
        for key, value in node.items():
            if key == "properties":  # a map of field names (one may be `items`) to schemas
                for name, prop in value.items():
                    bad.extend(_walk(prop, f"{path}/properties/{name}"))
            elif key not in ("x-kubernetes-validations", "default"):
                bad.extend(_walk(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            bad.extend(_walk(item, f"{path}[{i}]"))
    return bad


def test_schema_is_structural() -> None:
    schema = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert _walk(schema) == []


def test_every_example_validates_against_the_model() -> None:
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == api.KIND:
                api.FSDPJobSpec.model_validate(doc["spec"])


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"minReplicas": 5}, "minReplicas"),
        ({"training": {"globalBatchSize": 10, "microBatchSize": 4}}, "globalBatchSize"),
        ({"checkpoint": {"root": "/ckpt/../etc"}}, ".."),
        ({"template": {"spec": {"env": [{"name": "X", "value": "$(HOME)"}]}}}, "value"),
    ],
)
def test_model_rejects_what_the_crd_rejects(patch: dict[str, Any], field: str) -> None:
    doc = {"replicas": 4, "image": "w:1", **patch}
    with pytest.raises(pydantic.ValidationError, match=field.replace(".", r"\.")):
        api.FSDPJobSpec.model_validate(doc)
