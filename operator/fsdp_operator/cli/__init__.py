"""`fsdpctl`: what happened to my training job, and what it cost.

Read-only views over FSDPJob status and Events (`get`/`list`, `describe`), over the evidence
the operator keeps of failed attempts (`why`, `logs`), `events`, `wait`, plus `suspend`/`resume`
and `delete`; flags
and output formats as kubectl users type them. This module parses the command line (parser.py)
and dispatches; views.py and why.py render the status, read once through the operator's models
(documents.py); printers.py writes `-o` formats for scripts; complete.py answers kubectl's
completion.
Talks to the API only through kube.py's client loader; makes no decisions.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
from typing import Any

import argcomplete
import argcomplete.shell_integration
import kubernetes
import pydantic
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.text import Text

from fsdp_operator.cli import cluster, jsonpath, parser, printers, wait
from fsdp_operator.cli.complete import kubectl_complete_main as kubectl_complete_main
from fsdp_operator.cli.delete_jobs import delete as delete
from fsdp_operator.cli.job_events import events as events
from fsdp_operator.cli.views import describe as describe
from fsdp_operator.cli.views import list_jobs as list_jobs
from fsdp_operator.cli.views import print_jobs as print_jobs
from fsdp_operator.cli.why import logs as logs
from fsdp_operator.cli.why import why as why
from fsdp_operator.io import kube
from fsdp_operator.types import api
from fsdp_worker.contract import CONTRACT_VERSION as CONTRACT

_context_namespace = cluster.context_namespace


def _version() -> str:
    try:
        mine = importlib.metadata.version("fsdp-operator")
    except importlib.metadata.PackageNotFoundError:
        mine = "unknown"
    return f"fsdpctl {mine} (FSDPJob {api.GROUP}/{api.VERSION}, worker contract {CONTRACT})"


def _dump(doc: Any, fmt: str) -> None:
    """-o json|yaml: the objects as the API server holds them, for scripts."""
    if fmt == "json":
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        sys.stdout.write(yaml.safe_dump(doc, sort_keys=False))


def _refusal(exc: ApiException) -> str:
    """An API error in one line: a 403 says which permission is missing (the server names it)."""
    try:
        message = str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except ValueError:
        message = str(exc.reason)
    if exc.status == 403:
        return f"forbidden: {message} (ask for that permission, or use another --context)"
    if exc.status == 401:
        return f"not logged in to the cluster: {message}"
    return f"the API server answered {exc.status}: {message}"


def main(argv: list[str] | None = None, *, prog: str = "fsdpctl") -> int:
    command_line = parser.build(prog)
    argcomplete.autocomplete(command_line)  # answers the shell's completion request, then exits
    args = command_line.parse_args(argv)
    args.command = parser.ALIASES.get(args.command, args.command)
    if args.command == "version":
        print(_version())
        return 0
    if args.command == "completion":
        # for the `fsdpctl` executable; kubectl's own completion asks `kubectl_complete-fsdp`
        print(argcomplete.shell_integration.shellcode(["fsdpctl"], shell=args.shell))
        return 0
    try:
        return _run(args)
    except ApiException as exc:
        print(f"{prog}: {_refusal(exc)}", file=sys.stderr)
    except kubernetes.config.ConfigException as exc:
        print(f"{prog}: no usable kubeconfig: {exc}", file=sys.stderr)
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        print(f"{prog}: cannot reach the API server: {exc}", file=sys.stderr)
    except jsonpath.TemplateError as exc:
        print(f"{prog}: a JSONPath template: {exc}", file=sys.stderr)
    except pydantic.ValidationError as exc:  # a status the API server's schema would refuse
        print(f"{prog}: a document does not read as its model says: {exc}", file=sys.stderr)
    return 1


def kubectl_main() -> int:
    """`kubectl fsdp ...`: kubectl runs `kubectl-fsdp` from PATH as a plugin."""
    return main(prog="kubectl fsdp")


def _run(args: argparse.Namespace) -> int:
    client = kube.load_client(args.kubeconfig, context=args.context)
    custom = kubernetes.client.CustomObjectsApi(client)
    console = Console()
    namespace = args.namespace or cluster.context_namespace(args.kubeconfig, args.context)
    if args.command == "list":
        return get(custom, None if args.all_namespaces else namespace, args, console)
    if args.command == "wait":
        return wait.wait(custom, None if args.all_namespaces else namespace, args)
    if args.command == "describe":
        if args.output != "table":
            job = cluster.job_or_none(custom, namespace, args.name)
            if job is None:
                return 1
            _dump(job, args.output)
            return 0
        describe(custom, kubernetes.client.CoreV1Api(client), namespace, args.name, console)
        return 0
    if args.command == "delete":
        return delete(custom, namespace, args)
    if args.command == "events":
        return events(kubernetes.client.CoreV1Api(client), namespace, args, console)
    if args.command == "why":
        return why(custom, namespace, args.name, console)
    if args.command == "logs":
        core = kubernetes.client.CoreV1Api(client)
        return logs(custom, core, namespace, args.name, args.attempt, args.rank, console)
    return _suspend_or_resume(custom, namespace, args, console)


def get(custom: Any, scope: str | None, args: argparse.Namespace, console: Console) -> int:
    """`get`/`list`: the jobs in scope (those named, those the selector picks), in the -o
    format; then, with --watch, each change. 1 when a named job does not exist."""
    listed = cluster.job_list(custom, scope, args.selector)
    found = [j for j in listed["items"] if not args.names or j["metadata"]["name"] in args.names]
    for missing in sorted(set(args.names) - {j["metadata"]["name"] for j in found}):
        print(f'Error from server (NotFound): {api.PLURAL} "{missing}" not found', file=sys.stderr)
    _print(found, args, console, header=True)
    if args.watch:
        since = (listed.get("metadata") or {}).get("resourceVersion")
        watch_jobs(custom, scope, args, console, since=since)
    return 1 if len(found) < len(set(args.names)) else 0


def watch_jobs(
    custom: Any,
    scope: str | None,
    args: argparse.Namespace,
    console: Console,
    *,
    since: str | None,
    timeout_seconds: int | None = None,
) -> None:
    """`get --watch`: one row (or document) for each change after the list, until interrupted."""
    events = cluster.watch(
        custom, scope, selector=args.selector, since=since, timeout_seconds=timeout_seconds
    )
    for _, job in events:
        if not args.names or job["metadata"]["name"] in args.names:
            _print([job], args, console, header=False)


def _print(
    jobs: list[dict[str, Any]], args: argparse.Namespace, console: Console, *, header: bool
) -> None:
    """The jobs in the -o format: a table, or text for scripts (one job asked for by name
    prints as the object itself, as kubectl prints it)."""
    output: printers.Output = args.output
    if output.is_table:
        print_jobs(jobs, console, wide=output.format is printers.Format.WIDE, header=header)
        return
    if output.format is printers.Format.CUSTOM_COLUMNS:
        sys.stdout.write(printers.custom_columns(jobs, output.template, header=header))
        return
    single = len(args.names) == 1 or not header
    sys.stdout.write(printers.text(jobs, output, single=single))
    sys.stdout.flush()


def _suspend_or_resume(
    custom: Any, namespace: str, args: argparse.Namespace, console: Console
) -> int:
    """spec.suspend: the operator saves and stops the pods, or starts the next attempt."""
    custom.patch_namespaced_custom_object(
        api.GROUP,
        api.VERSION,
        namespace,
        api.PLURAL,
        args.name,
        {"spec": {"suspend": args.command == "suspend"}},
    )
    done = "suspended" if args.command == "suspend" else "resumed"
    console.print(Text(f"{namespace}/{args.name}: {done}"))
    return 0
