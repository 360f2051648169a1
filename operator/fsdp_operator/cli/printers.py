"""`-o`: the output formats `kubectl get` users type, for FSDPJobs.

table and wide are rich tables (views.py); name, json, yaml, jsonpath=TEMPLATE and
custom-columns=SPEC print plain text for scripts, read from the objects as the API server
sent them. Pure: objects in, text out.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
from typing import Any

import yaml

from fsdp_operator.cli import jsonpath
from fsdp_operator.types import api


class Format(enum.StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"
    NAME = "name"
    JSONPATH = "jsonpath"
    CUSTOM_COLUMNS = "custom-columns"


TEMPLATED = (Format.JSONPATH, Format.CUSTOM_COLUMNS)
CHOICES = [f.value for f in Format if f not in TEMPLATED] + [f"{f.value}=" for f in TEMPLATED]
"""What `-o` accepts, as the shell completes it."""


@dataclasses.dataclass(frozen=True)
class Output:
    """One `-o` value: the format, and the template jsonpath= and custom-columns= carry."""

    format: Format
    template: str = ""

    @property
    def is_table(self) -> bool:
        return self.format in (Format.TABLE, Format.WIDE)


def parse(value: str) -> Output:
    """`-o VALUE` (argparse's type): a format, or `jsonpath=...` / `custom-columns=...`."""
    name, eq, template = value.partition("=")
    try:
        chosen = Format(name)
    except ValueError:
        chosen = None
    if chosen is None or (chosen in TEMPLATED) != bool(eq) or (eq and not template.strip()):
        raise argparse.ArgumentTypeError(
            f"-o {value!r}: allowed are {', '.join(CHOICES[:5])}, jsonpath=TEMPLATE "
            "(e.g. jsonpath='{.status.phase}') and custom-columns=HEADER:PATH,... "
            "(e.g. custom-columns=NAME:.metadata.name,STEP:.status.step)"
        )
    if chosen is Format.CUSTOM_COLUMNS:
        _columns(template)  # refused here, not after the API call
    return Output(chosen, template)


def complete_output(**_: Any) -> list[str]:
    """The shell's candidates for `-o` (argcomplete)."""
    return list(CHOICES)


def name(job: dict[str, Any]) -> str:
    """`-o name`: the object as kubectl names it (`fsdpjob.fsdpoperator.io/NAME`)."""
    return f"{api.KIND.lower()}.{api.GROUP}/{job['metadata']['name']}"


def as_list(jobs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several jobs as one document, the shape `kubectl get -o json` prints."""
    return {"apiVersion": "v1", "kind": "List", "items": jobs, "metadata": {}}


def text(jobs: list[dict[str, Any]], output: Output, *, single: bool) -> str:
    """Every non-table format: `single` (one job asked for by name) prints the object itself,
    as kubectl does; otherwise a List (json, yaml, jsonpath) or one line a job."""
    doc = jobs[0] if single and jobs else as_list(jobs)
    if output.format is Format.NAME:
        return "".join(name(j) + "\n" for j in jobs)
    if output.format is Format.JSON:
        return json.dumps(doc, indent=2) + "\n"
    if output.format is Format.YAML:
        return str(yaml.safe_dump(doc, sort_keys=False))
    if output.format is Format.JSONPATH:
        return jsonpath.render(output.template, doc)
    return custom_columns(jobs, output.template)


def _columns(spec: str) -> list[tuple[str, str]]:
    """`NAME:.metadata.name,STEP:.status.step` -> [(header, path)]."""
    columns = []
    for part in spec.split(","):
        header, colon, path = part.partition(":")
        if not colon or not header or not path.strip():
            raise argparse.ArgumentTypeError(
                f"custom-columns: {part!r} is not HEADER:PATH "
                "(e.g. custom-columns=NAME:.metadata.name,PHASE:.status.phase)"
            )
        columns.append((header, path.strip()))
    return columns


def custom_columns(jobs: list[dict[str, Any]], spec: str, *, header: bool = True) -> str:
    """`-o custom-columns=SPEC`: a header row, then one row a job; `<none>` where a path
    selects nothing; columns three spaces apart, as kubectl aligns them."""
    columns = _columns(spec)
    rows = [[h for h, _ in columns]] if header else []
    for job in jobs:
        cells = []
        for _, path in columns:
            found = jsonpath.evaluate(job, path.removeprefix("{").removesuffix("}"))
            cells.append(",".join(jsonpath.text(v) for v in found) or "<none>")
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))] if rows else []
    return "".join(
        "   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n" for r in rows
    )
