"""`fsdpctl`: what happened to my training job, and what it cost.

Read-only views over FSDPJob status and Events (`list`, `describe`), over the evidence the
operator keeps of failed attempts (`why`, `logs`), plus `suspend`/`resume`. This module parses
the command line (parser.py) and dispatches; views.py and why.py render the status, read once
through the operator's models (documents.py); complete.py answers kubectl's completion.
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

from fsdp_operator.cli import cluster, parser
from fsdp_operator.cli.complete import kubectl_complete_main as kubectl_complete_main
from fsdp_operator.cli.views import describe as describe
from fsdp_operator.cli.views import list_jobs as list_jobs
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
        scope = None if args.all_namespaces else namespace
        if args.output in ("json", "yaml"):
            _dump({"items": cluster.jobs(custom, scope)}, args.output)
            return 0
        list_jobs(custom, scope, console, wide=args.output == "wide")
        return 0
    if args.command == "describe":
        if args.output != "table":
            job = cluster.job_or_none(custom, namespace, args.name)
            if job is None:
                return 1
            _dump(job, args.output)
            return 0
        describe(custom, kubernetes.client.CoreV1Api(client), namespace, args.name, console)
        return 0
    if args.command == "why":
        return why(custom, namespace, args.name, console)
    if args.command == "logs":
        core = kubernetes.client.CoreV1Api(client)
        return logs(custom, core, namespace, args.name, args.attempt, args.rank, console)
    return _suspend_or_resume(custom, namespace, args, console)


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
