"""`fsdpctl`: what happened to my training job, and what it cost.

The command line: commands, flags and their choices, and the job-name argument the shell
completes from the namespace's FSDPJobs. Parsing only: cli/__init__.py dispatches.
"""

from __future__ import annotations

import argparse
from typing import Any

import kubernetes

from fsdp_operator.cli import cluster, printers, wait
from fsdp_operator.io import kube
from fsdp_operator.types import api

ALIASES = {"get": "list"}
"""Verbs spelled as kubectl spells them, and the verb they are."""

_KINDS = (f"{api.KIND.lower()}/", f"{api.PLURAL}/", f"{api.KIND.lower()}.{api.GROUP}/")


def build(prog: str) -> argparse.ArgumentParser:
    """The whole command line. kubectl's global flags (-n, -A, --context, --kubeconfig) are on
    the top parser and on every command, so they go before the verb or anywhere after it."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    _global_flags(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True)

    def command(verb: str, **kwargs: Any) -> argparse.ArgumentParser:
        made = sub.add_parser(verb, **kwargs)
        _global_flags(made, top=False)
        return made

    _listing(
        command("list", aliases=["get"], help="FSDPJobs with phase, step, checkpoint, restarts")
    )
    describing = command("describe", help="one job: failures, their cost, its Events")
    _job_name(describing)
    describing.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    for verb in ("suspend", "resume"):
        _job_name(command(verb, help=f"{verb} a job (its pods save first)"))
    _job_name(command("why", help="each failed attempt: cause, where, diagnosis"))
    logs_p = command("logs", help="the last log lines a failed attempt's pods left")
    _job_name(logs_p)
    logs_p.add_argument("--attempt", type=int, help="default: the newest with evidence kept")
    logs_p.add_argument("--rank", type=int, help="global rank: only the pod that ran it")
    _waiting(command("wait", help="block until jobs meet a condition (as kubectl wait)"))
    _deleting(command("delete", help="delete jobs; their pods go with them (as kubectl delete)"))
    eventing = command("events", help="the job's Events, oldest first (as kubectl events --for)")
    _job_name(eventing)
    eventing.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    eventing.add_argument("-w", "--watch", action="store_true", help="then each new Event")
    command("version", help="this fsdpctl, the API it reads and the worker contract")
    completing = command(
        "completion",
        help="the shell code that completes commands, flags and job names",
        description='e.g. in ~/.bashrc: eval "$(fsdpctl completion bash)"',
    )
    completing.add_argument("shell", choices=("bash", "zsh", "fish"))
    return parser


def _global_flags(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """kubectl's global flags. On a command they default to SUPPRESS, so a flag given before
    the verb is not overwritten by the command's default."""
    unset: Any = argparse.SUPPRESS
    parser.add_argument(
        "-n",
        "--namespace",
        default=None if top else unset,
        help="default: the kubeconfig context's namespace, else 'default'",
    )
    parser.add_argument(
        "--kubeconfig",
        default=None if top else unset,
        help="default: $KUBECONFIG or ~/.kube/config",
    )
    parser.add_argument(
        "--context", default=None if top else unset, help="default: the current context"
    )
    parser.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        default=False if top else unset,
        help="every namespace (get, wait)",
    )


def _listing(listing: argparse.ArgumentParser) -> None:
    """`get`/`list`: names to pick, a label selector, -o, --watch."""
    names = listing.add_argument("names", nargs="*", type=job_ref, help="default: every job")
    names.completer = _complete_names  # type: ignore[attr-defined]  # argcomplete reads it
    _selector(listing)
    output = listing.add_argument(
        "-o",
        "--output",
        type=printers.parse,
        default=printers.Output(printers.Format.TABLE),
        metavar="FORMAT",
        help="table, wide, name, json, yaml, jsonpath=TEMPLATE, " "custom-columns=HEADER:PATH,...",
    )
    output.completer = printers.complete_output  # type: ignore[attr-defined]
    listing.add_argument(
        "-w", "--watch", action="store_true", help="after the list, print each change"
    )


def _waiting(waiting: argparse.ArgumentParser) -> None:
    """`wait`: names or a selector, --for, --timeout."""
    _names_or_selector(waiting)
    waiting.add_argument(
        "--for",
        dest="wait_for",
        type=wait.parse_for,
        required=True,
        help="condition=TYPE[=STATUS], jsonpath='{PATH}'[=VALUE] or delete",
    )
    waiting.add_argument(
        "--timeout", type=wait.parse_timeout, default=30.0, help="e.g. 30s (default), 5m, 1h"
    )


def _deleting(deleting: argparse.ArgumentParser) -> None:
    """`delete`: names or a selector; waits until they are gone unless --wait=false."""
    _names_or_selector(deleting)
    deleting.add_argument(
        "--wait",
        type=_switch,
        nargs="?",
        const=True,
        default=True,
        metavar="true|false",
        help="wait until each job is gone (default true, as kubectl)",
    )
    deleting.add_argument(
        "--timeout", type=wait.parse_timeout, default=60.0, help="of the wait, e.g. 60s (default)"
    )


def _switch(value: str) -> bool:
    """A kubectl boolean flag's value: true or false."""
    if value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise argparse.ArgumentTypeError(f"{value!r}: allowed are true and false")


def _names_or_selector(parser: argparse.ArgumentParser) -> None:
    """Jobs by name (the shell completes them), or by `-l`."""
    names = parser.add_argument("names", nargs="*", type=job_ref, help="or -l")
    names.completer = _complete_names  # type: ignore[attr-defined]  # argcomplete reads it
    _selector(parser)


def _selector(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-l", "--selector", default=None, help="label selector, e.g. team=nlp,tier!=dev"
    )


def job_ref(value: str) -> str:
    """A job as kubectl users name it: `NAME`, `fsdpjob/NAME`, `fsdpjobs/NAME`."""
    for kind in _KINDS:
        if value.startswith(kind):
            return value[len(kind) :]
    return value


def _job_name(parser: argparse.ArgumentParser) -> None:
    """The job-name argument; the shell completes it from the namespace's FSDPJobs."""
    name = parser.add_argument("name", type=job_ref)
    name.completer = _complete_names  # type: ignore[attr-defined]  # argcomplete reads it


def _complete_names(prefix: str, parsed_args: argparse.Namespace, **_: Any) -> list[str]:
    """Job names for the shell: nothing (never a traceback) when the cluster cannot say."""
    try:
        client = kube.load_client(parsed_args.kubeconfig, context=parsed_args.context)
        namespace = parsed_args.namespace or cluster.context_namespace(
            parsed_args.kubeconfig, parsed_args.context
        )
        jobs = cluster.jobs(kubernetes.client.CustomObjectsApi(client), namespace)
    except Exception:  # a completion must not fail the shell
        return []
    return [j["metadata"]["name"] for j in jobs if j["metadata"]["name"].startswith(prefix)]
