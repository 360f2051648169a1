"""`fsdpctl events JOB`: every Event about the job, oldest first, as `kubectl events --for
fsdpjob/JOB` lists them (describe shows only the newest 20); `-w` then prints each new one."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml
from rich.console import Console
from rich.text import Text

from fsdp_operator.cli import cluster, views


def events(
    core: Any,
    namespace: str,
    args: argparse.Namespace,
    console: Console,
    *,
    timeout_seconds: int | None = None,
) -> int:
    """The job's Events in the -o format; with --watch, then each one added or repeated."""
    listed = cluster.event_list(core, namespace, args.name)
    found = sorted(listed["items"], key=cluster.event_time)
    if args.output != "table":
        _write({"apiVersion": "v1", "kind": "List", "items": found, "metadata": {}}, args.output)
    elif found or not args.watch:
        console.print(_table(found) if found else Text(f"No events about {namespace}/{args.name}."))
    if args.watch:
        since = (listed.get("metadata") or {}).get("resourceVersion")
        for event in cluster.watch_events(
            core, namespace, args.name, since=since, timeout_seconds=timeout_seconds
        ):
            if args.output == "table":
                console.print(_table([event], header=False))
            else:  # each one a document of its own, as kubectl's watch writes them
                _write(event, args.output)
    return 0


def _write(doc: dict[str, Any], output: str) -> None:
    """One document as JSON, or as YAML opened by `---` (a watch writes one after another)."""
    if output == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write("---\n" + yaml.safe_dump(doc, sort_keys=False))
    sys.stdout.flush()


def _table(found: list[dict[str, Any]], *, header: bool = True) -> Any:
    """Time, type, reason, repeat count and message: one row an Event."""
    shown = views.table("", ("last seen", "type", "reason", "count", "message"), wide=("message",))
    shown.show_header = header
    for e in found:
        shown.add_row(
            cluster.event_time(e),
            Text(e.get("type", "")),
            Text(e.get("reason", "")),
            str(e.get("count") or 1),
            Text(e.get("message", "")),
        )
    return shown
