"""`fsdpctl`: what happened to my training job, and what it cost.

The command line: commands, flags and their choices, and the job-name argument the shell
completes from the namespace's FSDPJobs. Parsing only: cli/__init__.py dispatches.
"""

from __future__ import annotations

import argparse
from typing import Any

import kubernetes

from fsdp_operator.cli import cluster
from fsdp_operator.io import kube


def build(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument(
        "-n",
        "--namespace",
        default=None,
        help="default: the kubeconfig context's namespace, else 'default'",
    )
    parser.add_argument("--kubeconfig", default=None, help="default: $KUBECONFIG or ~/.kube/config")
    parser.add_argument("--context", default=None, help="default: the current context")
    sub = parser.add_subparsers(dest="command", required=True)
    listing = sub.add_parser("list", help="every FSDPJob with phase, step, checkpoint and restarts")
    listing.add_argument("-A", "--all-namespaces", action="store_true")
    listing.add_argument(
        "-o", "--output", choices=("table", "wide", "json", "yaml"), default="table"
    )
    describing = sub.add_parser("describe", help="one job: failures, their cost, its Events")
    _job_name(describing)
    describing.add_argument("-o", "--output", choices=("table", "json", "yaml"), default="table")
    for verb in ("suspend", "resume"):
        _job_name(sub.add_parser(verb, help=f"{verb} a job (its pods save first)"))
    _job_name(sub.add_parser("why", help="each failed attempt: cause, where, diagnosis"))
    logs_p = sub.add_parser("logs", help="the last log lines a failed attempt's pods left")
    _job_name(logs_p)
    logs_p.add_argument("--attempt", type=int, help="default: the newest with evidence kept")
    logs_p.add_argument("--rank", type=int, help="global rank: only the pod that ran it")
    sub.add_parser("version", help="this fsdpctl, the API it reads and the worker contract")
    completing = sub.add_parser(
        "completion",
        help="the shell code that completes commands, flags and job names",
        description='e.g. in ~/.bashrc: eval "$(fsdpctl completion bash)"',
    )
    completing.add_argument("shell", choices=("bash", "zsh", "fish"))
    return parser


def _job_name(parser: argparse.ArgumentParser) -> None:
    """The job-name argument; the shell completes it from the namespace's FSDPJobs."""
    name = parser.add_argument("name")
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
