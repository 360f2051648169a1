"""What every config document's models share: camelCase on the wire, unknown fields refused,
frozen (ConfigModel); the CEL rules they attach to the generated CRD (k8s_rules); the shapes a
user's string may take where it becomes a path (SafePath); and Kubernetes resource quantities.

Apart from config.py (the training config and the document) and config_checkpoint.py
(`spec.checkpoint`) because both build on it, and so do the operator's spec and status models.
Torch-free and numpy-free: the operator image imports it. It must not read the clock, the
environment or the disk.
"""

from __future__ import annotations

import decimal
import re
from typing import Annotated, Any

import pydantic
import pydantic.alias_generators
from pydantic import Field

# Names a user may put in a config that later become paths are restricted to this shape so that
# nothing can smuggle `$(VAR)` expansion, shell syntax or `..` (config.FACTORY_PATTERN does the
# same for module references).
SAFE_PATH_PATTERN = r"^/([A-Za-z0-9._-]+/?)*$"
MAX_PATH_LENGTH = 255


class ConfigModel(pydantic.BaseModel):
    """Base for config models: camelCase on the wire, unknown fields are errors."""

    model_config = pydantic.ConfigDict(
        alias_generator=pydantic.alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


def k8s_rules(*rules: tuple[str, ...]) -> dict[str, Any]:
    """CEL rules (rule, message[, fieldPath]) for the generated CRD.

    The models' Python validators enforce the same rules for the operator and the worker.
    """
    out = []
    for rule in rules:
        doc = {"rule": rule[0], "message": rule[1]}
        if len(rule) > 2:
            doc["fieldPath"] = rule[2]
        out.append(doc)
    return {"x-kubernetes-validations": out}


def _no_dotdot(value: str | None) -> str | None:
    if value is not None and any(part == ".." for part in value.split("/")):
        raise ValueError(f"path {value!r} must not contain '..'")
    if value == "/":
        raise ValueError("path must not be '/'")
    return value


SafePath = Annotated[
    str,
    Field(
        pattern=SAFE_PATH_PATTERN,
        max_length=MAX_PATH_LENGTH,
        json_schema_extra=k8s_rules(
            (
                "!self.contains('/../') && !self.endsWith('/..') && self != '/'",
                "must be an absolute path without '..' segments, and not '/'",
            )
        ),
    ),
    pydantic.AfterValidator(_no_dotdot),
]


QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes resource quantity: `8`, `500m`, `4Gi`."""


_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[A-Za-z]*)$")
_SUFFIX: dict[str, decimal.Decimal] = {
    key: decimal.Decimal(value)
    for key, value in {
        "": "1",
        "n": "1e-9",
        "u": "1e-6",
        "m": "1e-3",
        "k": "1e3",
        "M": "1e6",
        "G": "1e9",
        "T": "1e12",
        "P": "1e15",
        "E": "1e18",
        "Ki": str(2**10),
        "Mi": str(2**20),
        "Gi": str(2**30),
        "Ti": str(2**40),
        "Pi": str(2**50),
        "Ei": str(2**60),
    }.items()
}


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity (`8`, `500m`, `4Gi`, `1e3`) as a number."""
    match = _QUANTITY.match(str(value))
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.group(1), match.group(2)
    if suffix in _SUFFIX:
        return float(decimal.Decimal(number) * _SUFFIX[suffix])
    if re.fullmatch(r"[eE][+-]?[0-9]+", suffix):  # a decimal exponent
        return float(decimal.Decimal(number + suffix))
    raise ValueError(f"not a quantity: {value!r} (unknown suffix {suffix!r})")
