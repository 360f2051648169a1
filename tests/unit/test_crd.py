"""The committed CRD is what the models generate: structural, and every field it owns described."""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from fsdp_operator.render import crd
from fsdp_operator.types import api, kubetypes, status

ROOT = Path(__file__).resolve().parents[2]


def test_committed_crd_matches_the_model() -> None:
    committed = (ROOT / "crds" / "fsdpjobs.yaml").read_text()
    assert committed == crd.render(), "run: python -m fsdp_operator.render.crd > crds/fsdpjobs.yaml"
    committed = (ROOT / "crds" / "fsdpruntimeprofiles.yaml").read_text()
    wanted = "run: python -m fsdp_operator.render.crd --profile > crds/fsdpruntimeprofiles.yaml"
    assert committed == crd.render(profile=True), wanted
    chart = ROOT / "charts" / "fsdp-operator" / "crds"
    assert sorted(p.name for p in chart.iterdir()) == sorted(
        p.name for p in (ROOT / "crds").iterdir()
    )


def test_committed_api_reference_matches_the_crd() -> None:
    committed = (ROOT / "docs" / "api.md").read_text()
    wanted = "run: python -m fsdp_operator.render.crd --reference > docs/api.md"
    assert committed == crd.reference(), wanted


def _fields(node: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every property below `node` with its schema, by path (`items[].field` for lists)."""
    out = []
    for name, child in (node.get("properties") or {}).items():
        out.append((f"{prefix}{name}", child))
        inner = child.get("items") if child.get("type") == "array" else child
        mark = "[]" if inner is not child else ""
        out += _fields(inner or {}, f"{prefix}{name}{mark}.")
    return out


def _paths(node: dict[str, Any]) -> list[str]:
    return [path for path, _ in _fields(node)]


def test_the_api_reference_has_a_row_for_every_field_and_every_rule() -> None:
    text = crd.reference()
    root = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for part in ("spec", "status"):
        section = text.split(f"## {part}\n", 1)[1].split("\n## ", 1)[0]
        fields = _paths(root["properties"][part])
        assert len(fields) > 50
        for field in fields:
            assert f"| `{field}`" in section, f"{part}.{field} has no row"
    rules = [
        check["message"]
        for node in _nodes(root)
        for check in node.get("x-kubernetes-validations") or []
    ]
    assert len(rules) >= 15
    for message in rules:
        assert " ".join(message.split()) in text, message


def _nodes(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, list):
        return [n for item in node for n in _nodes(item)]
    if not isinstance(node, dict):
        return []
    return [node] + [n for value in node.values() for n in _nodes(value)]


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


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The pydantic models a field's type mentions: `X`, `X | None`, `list[X]`, `dict[str, X]`."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _object_schema(node: dict[str, Any]) -> dict[str, Any] | None:
    """The object schema inside a property: itself, a list's items or a map's values."""
    while "properties" not in node:
        inner = node.get("items", node.get("additionalProperties"))
        if not isinstance(inner, dict):
            return None
        node = inner
    return node


def _declared_by(model: type[pydantic.BaseModel], name: str) -> type[Any]:
    """The class whose body declares field `name` (a subclass may redeclare an upstream one)."""
    return next(k for k in model.__mro__ if name in inspect.get_annotations(k))


def _undescribed(node: dict[str, Any], model: type[pydantic.BaseModel], path: str) -> list[str]:
    """Paths of the fields under `node` (the schema of `model`) that this project owns and that
    have no description.

    Ownership is read from the models, not from a list of paths: a field belongs to the project
    unless the class that declares it lives in kubetypes (generated from the upstream OpenAPI
    document, which this project does not write). So `env[].name` and `env[].value`, which
    api.EnvVar redeclares, are checked, while `env[].valueFrom` and everything under
    `resources`, `tolerations` or `affinity` are not; a kubetypes type added later is skipped
    without touching this test, and a project field added anywhere is checked.
    """
    fields = {field.alias or name: (name, field) for name, field in model.model_fields.items()}
    missing: list[str] = []
    for key, prop in node.get("properties", {}).items():
        name, field = fields[key]
        if _declared_by(model, name).__module__ == kubetypes.__name__:
            continue
        if not prop.get("description"):
            missing.append(f"{path}.{key}")
        inner = _object_schema(prop)
        for nested in _models_in(field.annotation):
            if inner is not None:
                missing.extend(_undescribed(inner, nested, f"{path}.{key}"))
    return missing


# Fields still without a description, each with where to write it. The test fails when one is
# described (remove it here) as well as when another goes undescribed.


def test_every_field_the_project_owns_is_described() -> None:
    root = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    missing = _undescribed(root["properties"]["spec"], api.FSDPJobSpec, "spec")
    missing += _undescribed(root["properties"]["status"], status.FSDPJobStatus, "status")
    assert missing == [], f"{len(missing)} fields without a description: {', '.join(missing)}"


def test_crd_has_no_yaml_anchors() -> None:
    """A default shared between two places must not reach readers as `&id001` / `*id001`."""
    rendered = crd.render()
    assert "&id" not in rendered
    assert "*id" not in rendered


def test_status_times_are_rfc3339_and_an_older_operators_numbers_still_read() -> None:
    schema = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    props = _fields(schema["status"])
    times = {path for path, p in props if p.get("format") == "date-time"}
    assert {
        "started",
        "lastProgressTime",
        "lastCheckpoint.time",
        "history[].timeline.firstStep",
        "goodput.since",
        "excludedNodes[].until",
    } <= times
    assert all(p.get("type") == "string" for path, p in props if path in times)
    assert not [path for path, p in props if "unix" in p.get("description", "")]

    at = 1_796_283_000.123456
    s = status.FSDPJobStatus(
        started=at,
        last_checkpoint=status.CheckpointRef(
            path="/ckpt/step-10", step=10, world_size=2, time=at + 1
        ),
    )
    raw = s.model_dump(mode="json", by_alias=True, exclude_none=True)
    assert raw["started"] == "2026-12-03T07:30:00.123456Z"
    assert raw["lastCheckpoint"]["time"] == "2026-12-03T07:30:01.123456Z"
    back = status.FSDPJobStatus.model_validate(raw)
    assert back.started == pytest.approx(at, abs=1e-6)
    assert back.model_dump(mode="json", by_alias=True, exclude_none=True) == raw  # stable
    # an upgrade: the status an operator before 0.2 wrote (unix seconds) is read as it was
    assert status.FSDPJobStatus.model_validate({**raw, "started": 1.5e9}).started == 1.5e9
    for bad, says in (("yesterday", "not an RFC 3339 time"), ("2026-12-03T07:30:00", "time zone")):
        with pytest.raises(pydantic.ValidationError, match=says):
            status.FSDPJobStatus.model_validate({"started": bad})


def test_an_optional_tier_stays_unset_unless_asked() -> None:
    """checkpoint.memory means "off" when absent: the CRD must not default it on (the API
    server would fill it into every job, and the rule that it needs inPlaceRestarts would then
    refuse every job without them)."""
    schema = crd.build()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    ckpt = schema["spec"]["properties"]["checkpoint"]
    assert "default" not in ckpt["properties"]["memory"]
    assert "memory" not in ckpt["default"] and ckpt["default"]["intervalSteps"] == 500
    assert "x-fsdp-unset-by-default" not in json.dumps(crd.build())


def _column_value(obj: dict[str, Any], path: str) -> Any:
    for key in path.strip(".").split("."):
        obj = obj.get(key) if isinstance(obj, dict) else None  # type: ignore[assignment]
    return obj


def test_kubectl_get_shows_progress_and_wide_adds_attempt_goodput_queue_message() -> None:
    columns = crd.build()["spec"]["versions"][0]["additionalPrinterColumns"]
    by_name = {c["name"]: c for c in columns}
    default = [c["name"] for c in columns if not c.get("priority")]
    wide = [c["name"] for c in columns if c.get("priority") == 1]
    assert default == [
        "Phase",
        "Reason",
        "World",
        "Step",
        "Progress",
        "Checkpoint",
        "Restarts",
        "Age",
    ]
    assert wide == ["Attempt", "Goodput", "Remaining", "Queue", "Message"]
    # Each column reads a field a job's status really carries, with the column's type.
    job = status.FSDPJobStatus(
        phase=status.Phase.RUNNING,
        attempt=3,
        step=650,
        message="attempt 3",
        queue=status.QueueStatus(name="team-a", pod_group="g"),
        goodput=status.Goodput(since=0.0, fraction=0.93),
        progress=status.Progress(percent=65.0, estimated_seconds_remaining=700),
    )
    obj = {"status": job.model_dump(mode="json", by_alias=True)}
    seen = {n: _column_value(obj, by_name[n]["jsonPath"]) for n in [*wide, "Progress"]}
    assert seen == {
        "Attempt": 3,
        "Goodput": 0.93,
        "Remaining": 700,
        "Queue": "team-a",
        "Message": "attempt 3",
        "Progress": 65.0,
    }
    kinds = {"integer": int, "number": float, "string": str}
    for name, value in seen.items():
        assert isinstance(value, kinds[by_name[name]["type"]]), name
