"""What every spec model of the API shares: the wire conventions, CEL rules attached to the
schema, and the name and key patterns both CRDs check.

Apart from api.py because the FSDPJob spec (api.py), its pod template (spec_pod.py) and the
FSDPRuntimeProfile spec (spec_profile.py) all build on it. A rule lives here twice on purpose,
in one place: as a CEL string the API server checks at admission and as the Python check the
operator runs on what it reads. No I/O, no clock, no kopf.
"""

from __future__ import annotations

import re
from typing import Any

from fsdp_worker.contract import config_base

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class SpecModel(config_base.ConfigModel):
    """Spec models share the worker config's wire conventions (camelCase, extra=forbid)."""


def cel(rule: str, message: str, **extra: str) -> dict[str, str]:
    """One CEL rule of the schema (x-kubernetes-validations), with its message."""
    return {"rule": rule, "message": message, **extra}


def rules(*given: dict[str, str]) -> dict[str, Any]:
    """`given` rules as a schema's json_schema_extra."""
    return {"x-kubernetes-validations": list(given)}


KEYS_RULE = cel(
    f"self.all(k, k.size() <= 316 && k.matches(r'{QUALIFIED_NAME_PATTERN}'))",
    "keys must be qualified names: [prefix/]name, name of [A-Za-z0-9-_.] (<= 63),"
    " prefix a DNS subdomain",
)


def check_keys(values: dict[str, str], *, what: str) -> dict[str, str]:
    for key in values:
        name = key.rsplit("/", 1)[-1]
        if len(key) > 316 or len(name) > 63 or not re.fullmatch(QUALIFIED_NAME_PATTERN, key):
            raise ValueError(
                f"{what} key {key!r} is not a qualified name ([prefix/]name, name <= 63"
                " characters of [A-Za-z0-9-_.], prefix a DNS subdomain)"
            )
    return values
