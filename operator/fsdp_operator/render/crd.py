"""Generate the FSDPJob and FSDPRuntimeProfile CRDs from the pydantic models (api.py, status.py).

`python -m fsdp_operator.render.crd > crds/fsdpjobs.yaml` writes the committed file (`--profile >
crds/fsdpruntimeprofiles.yaml` the runtime profiles' CRD), and
`python -m fsdp_operator.render.crd --reference > docs/api.md` the field reference read from it; a
test fails when either drifts. This module turns pydantic's JSON Schema into a Kubernetes
structural schema: refs inlined, nullables dropped, exclusive bounds rewritten, free-form
objects marked to preserve unknown fields. It must not talk to a cluster.
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

import yaml

from fsdp_operator.types import api, status

_DROP = {"title"}
_INT_OR_STRING = "x-kubernetes-int-or-string"  # the one union Kubernetes allows: anyOf int|str
_UNSET = "x-fsdp-unset-by-default"  # internal: an Optional field whose default is None


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_inline(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = dict(defs[node["$ref"].rsplit("/", 1)[-1]])
        extra = {k: v for k, v in node.items() if k != "$ref"}
        return _inline({**target, **extra}, defs)
    return {k: _inline(v, defs) for k, v in node.items() if k not in _DROP}


def _free_form(node: dict[str, Any]) -> None:
    """dict[str, Any] becomes an object that keeps unknown fields; `extra=forbid` is implied."""
    extra = node.get("additionalProperties")
    if extra is False:
        del node["additionalProperties"]
    elif node.get("type") == "object" and (
        extra is True or (extra is None and "properties" not in node)
    ):
        node.pop("additionalProperties", None)
        node["x-kubernetes-preserve-unknown-fields"] = True


def _structural(node: Any) -> Any:
    """Rewrite one inlined JSON Schema node (recursively) into Kubernetes' dialect."""
    if isinstance(node, list):
        return [_structural(n) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "anyOf" in node and not node.get(_INT_OR_STRING):  # Optional[X] -> X (absent is null)
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"unsupported union in schema: {options}")
        node = {**options[0], **node}
    if node.get("default", 0) is None:
        del node["default"]
        node[_UNSET] = True  # absent means off (checkpoint.memory): never given a default
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(bound), int | float) and not isinstance(node[bound], bool):
            node[limit] = node.pop(bound)
            node[bound] = True
    if "maxLength" in node and node.get("type") in ("object", "array"):
        node["maxProperties" if node["type"] == "object" else "maxItems"] = node.pop("maxLength")
    _free_form(node)
    out = {k: _structural(v) if k != "x-kubernetes-validations" else v for k, v in node.items()}
    if "properties" in out:
        out["properties"] = {k: _structural(v) for k, v in node["properties"].items()}
    return out


def _default_objects(node: dict[str, Any]) -> dict[str, Any]:
    """Give optional nested objects a default holding their own defaults, recursively.

    The API server then fills every defaulted field, so CEL rules (which it also checks against
    the defaults themselves) can read them without `has()` guards.
    """
    required = set(node.get("required", []))
    for name, prop in node.get("properties", {}).items():
        if prop.get("type") == "object" and "properties" in prop:
            _default_objects(prop)
            # Copies: a default shared with the property it came from would be written as a
            # YAML anchor and alias (&id001, *id001), which readers of the CRD should not meet.
            defaults = {
                k: copy.deepcopy(v["default"])
                for k, v in prop["properties"].items()
                if "default" in v
            }
            # Kubernetes types carry no defaults: an absent affinity stays absent. Neither does
            # an object whose own default is None: unset is its meaning.
            if name not in required and "default" not in prop and defaults and not prop.get(_UNSET):
                prop["default"] = defaults
    return node


def _strip(node: Any) -> Any:
    if isinstance(node, list):
        return [_strip(n) for n in node]
    if not isinstance(node, dict):
        return node
    return {k: _strip(v) if k != "default" else v for k, v in node.items() if k != _UNSET}


def schema_of(model: type[Any], *, default_objects: bool = False) -> dict[str, Any]:
    """The model's JSON Schema in Kubernetes' structural dialect; `default_objects`: optional
    nested objects get their own defaults as a default (_default_objects)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    node = dict(_structural(_inline(raw, defs)))
    return dict(_strip(_default_objects(node) if default_objects else node))


def _printer_columns() -> list[dict[str, Any]]:
    """`kubectl get` columns. Progress is in the default view (priority 0): how far a job is
    is the first question about it, and one number fits beside Step. As in kubectl's own wide
    views (a Deployment's CONTAINERS, IMAGES), `-o wide` (priority 1) adds after Age what
    explains a job: its attempt, goodput, time to finish, Kueue queue and message (last: long)."""
    cols = [
        ("Phase", "string", ".status.phase", "Lifecycle phase", 0),
        ("Reason", "string", ".status.reason", "Why it is in its phase, in one word", 0),
        ("World", "integer", ".status.worldSize", "Ranks in the current attempt", 0),
        ("Step", "integer", ".status.step", "Last completed training step", 0),
        ("Progress", "number", ".status.progress.percent", "Percent of training.steps done", 0),
        ("Checkpoint", "integer", ".status.lastCheckpoint.step", "Newest complete checkpoint", 0),
        ("Restarts", "integer", ".status.restarts.total", "Restarts, all budgets", 0),
        ("Age", "date", ".metadata.creationTimestamp", "", 0),
        ("Attempt", "integer", ".status.attempt", "The current (or last) attempt", 1),
        ("Goodput", "number", ".status.goodput.fraction", "Productive share of wall time", 1),
        (
            "Remaining",
            "integer",
            ".status.progress.estimatedSecondsRemaining",
            "Estimated wall seconds to the last step",
            1,
        ),
        ("Queue", "string", ".status.queue.name", "Kueue LocalQueue the job waits in", 1),
        ("Message", "string", ".status.message", "Details of the phase", 1),
    ]
    return [
        {
            "name": n,
            "type": t,
            "jsonPath": p,
            **({"description": d} if d else {}),
            **({"priority": priority} if priority else {}),
        }
        for n, t, p, d, priority in cols
    ]


def build() -> dict[str, Any]:
    """The FSDPJob CRD as a dict."""
    spec_schema = schema_of(api.FSDPJobSpec, default_objects=True)
    status_schema = schema_of(status.FSDPJobStatus)
    root = {
        "type": "object",
        "description": "FSDPJob runs a PyTorch FSDP2 training job and restarts it from its "
        "newest complete checkpoint after failures.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    version = {"subresources": {"status": {}}, "additionalPrinterColumns": _printer_columns()}
    names = {
        "kind": api.KIND,
        "plural": api.PLURAL,
        "singular": api.SINGULAR,
        "shortNames": api.SHORT_NAMES,
        "categories": api.CATEGORIES,
    }
    return _definition(names, scope="Namespaced", root=root, version=version)


def build_profile() -> dict[str, Any]:
    """The FSDPRuntimeProfile CRD: cluster-scoped, spec only (the cluster admin's)."""
    root = {
        "type": "object",
        "description": "FSDPRuntimeProfile, the cluster admin's: what the worker pods of "
        "FSDPJobs naming it (spec.runtimeProfile) may have beyond Pod Security restricted, in "
        "which namespaces, and what they get.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": schema_of(api.RuntimeProfileSpec, default_objects=True),
        },
    }
    columns = [
        {"name": "Namespaces", "type": "string", "jsonPath": ".spec.namespaces"},
        {"name": "Capabilities", "type": "string", "jsonPath": ".spec.capabilities"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    names = {
        "kind": api.PROFILE_KIND,
        "plural": api.PROFILE_PLURAL,
        "singular": api.PROFILE_SINGULAR,
        "shortNames": api.PROFILE_SHORT_NAMES,
        "categories": api.CATEGORIES,
    }
    return _definition(
        names, scope="Cluster", root=root, version={"additionalPrinterColumns": columns}
    )


def _definition(
    names: dict[str, Any], *, scope: str, root: dict[str, Any], version: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{names['plural']}.{api.GROUP}"},
        "spec": {
            "group": api.GROUP,
            "scope": scope,
            "names": names,
            "versions": [
                {
                    "name": api.VERSION,
                    "served": True,
                    "storage": True,
                    **version,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


def render(profile: bool = False) -> str:
    """crds/fsdpjobs.yaml, or with `profile` crds/fsdpruntimeprofiles.yaml."""
    flag = " --profile" if profile else ""
    source = "operator/fsdp_operator/types/api.py"
    header = f"# Generated by `python -m fsdp_operator.render.crd{flag}` from {source}.\n"
    header += "# Do not edit by hand: tests/unit/test_crd.py fails when this file drifts.\n"
    doc = build_profile() if profile else build()
    return header + yaml.safe_dump(doc, sort_keys=False, width=100)


def _type(node: dict[str, Any]) -> str:
    """A schema node's type as a reader says it: `[]string`, `map[string]integer`, quantity."""
    if node.get(_INT_OR_STRING):
        return "integer or string"
    kind = str(node.get("type", "any"))
    if kind == "array":
        return "[]" + _type(node.get("items") or {})
    if kind == "object" and "properties" not in node:
        values = node.get("additionalProperties")
        return f"map[string]{_type(values)}" if isinstance(values, dict) else "object (free-form)"
    return kind


def _limits(node: dict[str, Any]) -> str:
    """Default, bounds, enum and pattern of one field, as the API server enforces them."""
    said = []
    if "default" in node and not isinstance(node["default"], dict):
        said.append(f"default `{json.dumps(node['default'])}`")
    for key, word in (
        ("minimum", ">="),
        ("maximum", "<="),
        ("minLength", "length >="),
        ("maxLength", "length <="),
        ("minItems", "items >="),
        ("maxItems", "items <="),
    ):
        if key in node:
            said.append(f"{word} {node[key]}")
    if "enum" in node:
        said.append("one of " + ", ".join(f"`{v}`" for v in node["enum"]))
    if "pattern" in node:
        said.append(f"pattern `{node['pattern']}`")
    return "; ".join(said)


def _words(text: str) -> str:
    return " ".join(text.split())


def _cell(text: str) -> str:
    """Text for a Markdown table cell (GitHub's tables take `\\|` for a pipe, code spans too)."""
    return _words(text).replace("|", "\\|")


def _rule_lines(path: str, node: dict[str, Any]) -> list[str]:
    return [
        f"- `{path}`: {_words(check['message'])} (`{_words(check['rule'])}`)"
        for check in node.get("x-kubernetes-validations") or []
    ]


def _fields(node: dict[str, Any], path: str, out: list[str], rules: list[str]) -> None:
    """One table row per field under `node`, depth first; CEL rules gathered per object."""
    rules += _rule_lines(path or ".", node)
    required = set(node.get("required") or [])
    for name, child in (node.get("properties") or {}).items():
        field = f"{path}.{name}" if path else name
        shown = f"`{field}`" + (" (required)" if name in required else "")
        row = [shown, _type(child), _cell(child.get("description", "")), _cell(_limits(child))]
        out.append("| " + " | ".join(row) + " |")
        inner = child.get("items") if child.get("type") == "array" else child
        if inner is not child:  # a list's own rules (its items' come with them)
            rules += _rule_lines(field, child)
        if isinstance(inner, dict) and (
            "properties" in inner or inner.get("x-kubernetes-validations")
        ):
            _fields(inner, field + ("[]" if inner is not child else ""), out, rules)


def reference() -> str:
    """docs/api.md: every field of spec and status with its type, meaning and limits."""
    version = build()["spec"]["versions"][0]
    root = version["schema"]["openAPIV3Schema"]
    columns = version["additionalPrinterColumns"]
    lines = [
        f"# {api.KIND} API reference ({api.GROUP}/{api.VERSION})",
        "",
        "Generated by `python -m fsdp_operator.render.crd --reference` from the CRD (which the",
        "models in operator/fsdp_operator/types/api.py and status.py generate);",
        "tests/unit/test_crd.py fails when it drifts. Limits are enforced by the API server at",
        "admission; the rules under each table are its CEL checks. docs/architecture.md says what",
        "the operator does with each field.",
        "",
        f"Short names: {', '.join(api.SHORT_NAMES)}. Columns of `kubectl get "
        f"{api.PLURAL}`: {', '.join(c['name'] for c in columns if not c.get('priority'))}; "
        f"`-o wide` adds {', '.join(c['name'] for c in columns if c.get('priority'))}.",
    ]
    for part in ("spec", "status"):
        rows: list[str] = []
        rules: list[str] = []
        _fields(root["properties"][part], "", rows, rules)
        lines += ["", f"## {part}", "", _cell(root["properties"][part].get("description", ""))]
        lines += ["", "| field | type | description | limits |", "| --- | --- | --- | --- |"]
        lines += rows
        if rules:
            lines += ["", f"Rules checked at admission ({part}):", "", *rules]
    profile = build_profile()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rows, rules = [], []
    _fields(profile["properties"]["spec"], "", rows, rules)
    lines += [
        "",
        f"## {api.PROFILE_KIND} spec (cluster-scoped; short name {api.PROFILE_SHORT_NAMES[0]})",
        "",
        _cell(profile["description"]),
        "",
        "| field | type | description | limits |",
        "| --- | --- | --- | --- |",
        *rows,
    ]
    if rules:
        lines += ["", f"Rules checked at admission ({api.PROFILE_KIND} spec):", "", *rules]
    return "\n".join(line.rstrip() for line in lines) + "\n"


def main() -> None:
    args = sys.argv[1:]
    sys.stdout.write(reference() if args == ["--reference"] else render(args == ["--profile"]))


if __name__ == "__main__":
    main()
