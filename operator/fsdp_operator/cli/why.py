"""`fsdpctl why` and `logs`: each failed attempt, and the evidence the operator kept of it.

Reads status.history (as written: documents.py) and the evidence ConfigMaps run/evidence.py
keeps before the pods are deleted. Prints text, never rich markup: a worker's own words may hold
brackets. Makes no decisions.
"""

from __future__ import annotations

import sys
from typing import Any

from kubernetes.client.exceptions import ApiException
from rich.console import Console
from rich.text import Text

from fsdp_operator.cli import cluster, documents, views
from fsdp_operator.types import names, status

# Stops the operator made on purpose: not failures, so `why` does not list them.
_PLANNED = (
    status.Cause.RESIZE,
    status.Cause.SUSPENDED,
    status.Cause.PREEMPTED,
    status.Cause.STRAGGLER,
    None,
)

# (what to print first, the attempt, its failure as recorded)
_Failed = tuple[str, status.HistoryEntry, status.Failure | None]


def _failures(history: list[status.HistoryEntry]) -> list[_Failed]:
    """Every failure in the history, oldest first: restarts in place, then the attempt's end."""
    failed: list[_Failed] = []
    for h in history:
        for r in h.restarts_in_place or []:  # restarted in its pods: the attempt went on
            where = f"attempt {h.attempt}, restarted in place"
            cause = r.failure.cause if r.failure else None
            failed.append((f"{where} (generation {r.generation}): {cause}", h, r.failure))
        if h.failure or h.cause not in _PLANNED:
            said = (h.failure.cause if h.failure else None) or h.cause
            failed.append((f"attempt {h.attempt}: {said}", h, h.failure))
    return failed


def why(custom: Any, namespace: str, name: str, console: Console) -> int:
    """Each failed attempt, oldest first: what failed where and why, and where the evidence is.

    Reads status.history (not only lastFailure) so that a failure that repeats, or an earlier
    one that caused it, stays visible after the next attempt fails.
    """
    job = cluster.job_or_none(custom, namespace, name)
    if job is None:
        return 1
    nproc = documents.nproc_per_node(job)
    failed = _failures(documents.job_status(job).history or [])
    if not failed:
        console.print(Text(f"{namespace}/{name} has not failed"))
        return 0
    for head, h, f in failed:
        console.print(Text(head + (f" at step {f.step}" if f and f.step is not None else "")))
        if not f:  # an older operator recorded only the cause
            continue
        _print_failure(console, f)
        if ref := f.evidence_ref:
            rank = f" --rank {f.rank * nproc}" if f.rank is not None else ""
            console.print(
                Text(
                    f"  full evidence: configmap/{ref} in {namespace}; logs: "
                    f"fsdpctl -n {namespace} logs {name} --attempt {h.attempt}{rank}"
                )
            )
    return 0


def _print_failure(console: Console, f: status.Failure) -> None:
    """The blamed pod, its rank's own words, and the pods that failed only because it did."""
    if f.pod:
        exit_code = f" exit code {f.exit_code}" if f.exit_code is not None else ""
        console.print(
            Text(
                f"  first failing pod: {f.pod} (node rank {views.fmt(f.rank)}, "
                f"node {views.fmt(f.node)}){exit_code}"
            )
        )
    for key in ("phase", "message", "diagnosis", "evidence"):
        if said := getattr(f, key):
            console.print(Text(f"  {key}: " + str(said).replace("\n", "\n    ")))
    for said in f.symptoms or []:
        console.print(Text(f"  symptom: {said}"))


def logs(
    custom: Any,
    core: Any,
    namespace: str,
    name: str,
    attempt: int | None,
    rank: int | None,
    console: Console,
) -> int:
    """A failed attempt's last log lines, pod by pod, as the operator kept them before it
    deleted the pods; `rank` (a global rank) narrows them to the pod that ran it."""
    job = cluster.job_or_none(custom, namespace, name)
    if job is None:
        return 1
    history = documents.job_status(job).history or []
    if attempt is None:
        kept = [h.attempt for h in history if h.failure and h.failure.evidence_ref]
        if not kept:
            print(f"fsdpctl: no evidence kept for {namespace}/{name}", file=sys.stderr)
            return 1
        attempt = int(kept[-1])
    failure = next((h.failure for h in history if h.attempt == attempt), None)
    ref = (failure.evidence_ref if failure else None) or names.evidence_name(name, attempt=attempt)
    try:
        data = cluster.config_map_data(core, namespace, ref)
    except ApiException as exc:
        if exc.status != 404:
            raise
        print(
            f"fsdpctl: no evidence kept for attempt {attempt} of {name} "
            "(the operator keeps the newest 5 failed attempts)",
            file=sys.stderr,
        )
        return 1
    return _print_logs(console, data, name=name, attempt=attempt, rank=rank)


def _print_logs(
    console: Console, data: dict[str, str], *, name: str, attempt: int, rank: int | None
) -> int:
    """Each kept pod's log (or the one that ran `rank`), headed by who it was; 2 when that
    rank's log was not kept."""
    meta = documents.kept_failure(data.get("failure.json"))
    nproc = meta.nproc_per_node or 1
    pods = sorted(int(k[4:-4]) for k in data if k.startswith("log-") and k.endswith(".txt"))
    if rank is not None:
        if rank // nproc not in pods:
            have = ", ".join(_ranks(p, nproc) for p in pods) or "none"
            print(
                f"fsdpctl: attempt {attempt} of {name} kept no log of rank {rank}; "
                f"ranks kept: {have}",
                file=sys.stderr,
            )
            return 2
        pods = [rank // nproc]
    for p in pods:
        head = f"attempt {attempt}, pod {p} (ranks {_ranks(p, nproc)})"
        if meta.rank == p and meta.pod:
            head += f", {meta.pod}"
        if meta.first_pod == p:
            head += ", first error of the gang"
        console.print(Text(head, style="bold"))
        console.print(Text(data[f"log-{p}.txt"].rstrip("\n")), soft_wrap=True)
    return 0


def _ranks(pod: int, nproc: int) -> str:
    """The global ranks one pod ran: torchrun gives pod P ranks P*nproc .. (P+1)*nproc-1."""
    return f"{pod * nproc}-{(pod + 1) * nproc - 1}"
