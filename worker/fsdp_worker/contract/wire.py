"""Documents on the wire: each is one pydantic model, parsed once at the edge.

Every env or JSON document the operator, the keepers and the ranks exchange (resume rules, the
gang, the reliability record, checkpoint markers and memory seals, termination records) and the
operator's settings are pydantic models or dataclasses: their fields say once what the document
holds. This module holds what they share: `parse` (JSON in, the model out, or one error that
names the field, the value and what is allowed) and `to_doc` (the model as the JSON object it
is on the wire, by its wire names).

Torch-free: the operator imports it. It parses JSON only and never unpickles anything.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any, TypeVar

import pydantic
import pydantic.alias_generators
import pydantic.errors

T = TypeVar("T")

CAMEL = pydantic.ConfigDict(
    alias_generator=pydantic.alias_generators.to_camel, populate_by_name=True
)
"""The config of a document whose keys are camelCase (the env documents the operator writes);
Python code names its fields in snake_case. Unknown keys are ignored: a document of a later
release may say more."""

MAX_SHOWN = 200
"""A value in an error is cut here: a marker's whole manifest is no help in one line."""


def parse(kind: type[T], raw: str | bytes, *, what: str, error: type[Exception] = ValueError) -> T:
    """`raw` as a `kind`, strictly: JSON of exactly the field types (no "3" for 3, no true for
    1). `error` names `what` (the variable or the file), the field, the value and what is
    allowed."""
    try:
        return _adapter(kind).validate_json(raw, strict=True)
    except pydantic.ValidationError as exc:
        raise error(describe(exc, kind=kind, what=what, raw=raw)) from None


def validate(
    kind: type[T], doc: object, *, what: str, strict: bool, error: type[Exception] = ValueError
) -> T:
    """An already decoded document (a dict of JSON values, or env strings when not `strict`)
    as a `kind`; `error` as `parse`'s."""
    try:
        return _adapter(kind).validate_python(doc, strict=strict)
    except pydantic.ValidationError as exc:
        raise error(describe(exc, kind=kind, what=what, raw=doc)) from None


def parse_or_none(kind: type[T], raw: str | bytes) -> T | None:
    """`parse`, for advice (a report, a record): None where it does not parse."""
    try:
        return _adapter(kind).validate_json(raw, strict=True)
    except pydantic.ValidationError:
        return None


def validate_or_none(kind: type[T], doc: object) -> T | None:
    """`validate` (strict), for advice: None where `doc` is not a `kind`."""
    try:
        return _adapter(kind).validate_python(doc, strict=True)
    except pydantic.ValidationError:
        return None


def to_doc(obj: object, *, drop_none: Collection[str] = ()) -> dict[str, Any]:
    """`obj` as its JSON object, by wire names; the keys in `drop_none` left out when null
    (fields a later release added, which an older document does not have)."""
    doc: dict[str, Any] = _adapter(type(obj)).dump_python(obj, mode="json", by_alias=True)
    return {k: v for k, v in doc.items() if not (k in drop_none and v is None)}


_ADAPTERS: dict[type[Any], pydantic.TypeAdapter[Any]] = {}
"""One adapter per document type, built at its first use (a race builds one twice, no harm)."""


def _adapter(kind: type[T]) -> pydantic.TypeAdapter[T]:
    found = _ADAPTERS.get(kind)
    if found is None:
        found = _ADAPTERS[kind] = pydantic.TypeAdapter(kind)
    return found


def describe(exc: pydantic.ValidationError, *, kind: type[Any], what: str, raw: object) -> str:
    """One line per error (the first three): the field, its value, what is allowed."""
    try:
        schema = _adapter(kind).json_schema(by_alias=True)
    except pydantic.errors.PydanticUserError:  # a type JSON schema has no words for
        schema = {}
    lines = [_line(error, schema=schema, what=what, raw=raw) for error in exc.errors()[:3]]
    return "; ".join(lines)


def _line(error: Any, *, schema: Mapping[str, Any], what: str, raw: object) -> str:
    loc = tuple(error["loc"])
    where = ".".join(str(part) for part in loc)
    kind = error["type"]
    if kind == "json_invalid":
        return f"{what}={_shown(raw)} is not JSON: {error['ctx']['error']}"
    if kind in ("value_error", "assertion_error"):
        return f"{what}: {where + ': ' if where else ''}{error['msg'].split(', ', 1)[-1]}"
    if not loc:
        return f"{what}={_shown(raw)} must be a JSON object"
    allowed = _words(_field(schema, loc), schema.get("$defs", {}))
    if kind == "missing":
        return f"{what}: {where} is missing: it must be {allowed}"
    return f"{what}: {where}={_shown(error['input'])} must be {allowed}"


def _shown(value: object) -> str:
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "..."


def _field(schema: Mapping[str, Any], loc: tuple[Any, ...]) -> Mapping[str, Any]:
    """The JSON schema of the field at `loc` ({} where the path leaves the schema)."""
    defs, node = schema.get("$defs", {}), schema
    for part in loc:
        node = _deref(node, defs)
        branches = [_deref(b, defs) for b in node.get("anyOf", [node])]
        node = next((b for b in branches if _child(b, part) is not None), {})
        node = _child(node, part) or {}
    return node


def _child(node: Mapping[str, Any], part: Any) -> Mapping[str, Any] | None:
    """The schema one step down: a named property, else a map's values or a list's items."""
    properties: Mapping[str, Any] = node.get("properties", {})
    if isinstance(part, str) and part in properties:
        found: Mapping[str, Any] = properties[part]
        return found
    inner = node.get("additionalProperties") or node.get("items")
    return inner if isinstance(inner, dict) else None


def _deref(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref", "")
    return defs.get(ref.rsplit("/", 1)[-1], node) if ref else node


_TYPES = {
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
    "null": "null",
}


def _words(node: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    """What a JSON schema allows, in words: "a whole number >= 0 or null"."""
    node = _deref(node, defs)
    if "anyOf" in node:
        return " or ".join(_words(branch, defs) for branch in node["anyOf"])
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    words = _TYPES.get(node.get("type", ""), "a valid value")
    bounds = {
        "minimum": ">=",
        "exclusiveMinimum": ">",
        "maximum": "<=",
        "exclusiveMaximum": "<",
    }
    words += "".join(f" {op} {node[key]}" for key, op in bounds.items() if key in node)
    if "pattern" in node:
        words += f" matching {node['pattern']}"
    least = node.get("minProperties") or node.get("minItems")
    if least == 1:
        words = "a non-empty " + words.split(" ", 1)[-1]
    elif least:
        words += f" of at least {least} entries"
    return words
