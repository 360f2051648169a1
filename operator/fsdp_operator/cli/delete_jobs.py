"""`fsdpctl delete`: as kubectl deletes, the jobs named or selected, then (unless
`--wait=false`) until each is gone. Its pods go with it: the API server's garbage collector
deletes what the job owns; a checkpoint on the claim stays (the claim is the tenant's)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubernetes.client.exceptions import ApiException

from fsdp_operator.cli import cluster, wait
from fsdp_operator.types import api


def delete(
    custom: Any, namespace: str, args: argparse.Namespace, clock: wait.Clock | None = None
) -> int:
    """0 when every job named or selected was deleted (and, waiting, is gone); 1 when one did
    not exist or the wait ran out."""
    if not args.names and not args.selector:
        print("error: name a job, or select jobs with -l", file=sys.stderr)
        return 1
    if args.names and args.selector:  # as kubectl: which would be meant is not clear
        print("error: name jobs or select them with -l, not both", file=sys.stderr)
        return 1
    names = list(args.names) or sorted(
        j["metadata"]["name"] for j in cluster.jobs(custom, namespace, args.selector)
    )
    if not names:
        print(f"No resources found in {namespace} namespace.", file=sys.stderr)
        return 0
    deleted = [name for name in names if _delete_one(custom, namespace, name)]
    gone = True
    if args.wait and deleted:
        until = argparse.Namespace(
            names=deleted,
            selector=None,
            wait_for=wait.WaitFor(wait.Kind.DELETE),
            timeout=args.timeout,
        )
        gone = wait.wait(custom, namespace, until, clock, say=False) == 0
    return 0 if gone and len(deleted) == len(names) else 1


def _delete_one(custom: Any, namespace: str, name: str) -> bool:
    """Deletes one job (its owned pods go in the background, as kubectl's default); False,
    said as kubectl says it, when there is no such job."""
    try:
        custom.delete_namespaced_custom_object(
            api.GROUP, api.VERSION, namespace, api.PLURAL, name, propagation_policy="Background"
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
        print(f'Error from server (NotFound): {api.PLURAL} "{name}" not found', file=sys.stderr)
        return False
    print(f'{api.KIND.lower()}.{api.GROUP} "{name}" deleted')
    return True
