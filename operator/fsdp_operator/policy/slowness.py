"""The slow rank rank 0 names (fsdp_worker.telemetry.pace): shown in status.slowRank with its
pod and node, said in a SlowRank Event when first named and SlowRankCleared when it goes.

The worker judges (a rank's compute per step over a window, against the other ranks'); this
policy only tells the user (straggler.py swaps a node out when a spare stands by). Pure: the
draft in, the draft changed.
"""

from __future__ import annotations

from fsdp_operator.policy import decision
from fsdp_operator.types import observed, status

SLOWDOWN_DIGITS = 2  # status keeps 2.04, not 2.0371...: fewer status writes, same news


def judge(d: decision.Draft, obs: observed.Observed) -> None:
    """Name, update or clear status.slowRank from rank 0's latest report."""
    s, prog = d.status, obs.progress
    shown = s.slow_rank
    if shown is not None and (shown.attempt != s.attempt or s.phase in status.TERMINAL_PHASES):
        _clear(d, f"attempt {shown.attempt} ended")
        shown = None
    if prog is None or s.phase in status.TERMINAL_PHASES:
        return  # nothing read this pass: keep what was seen
    if prog.slow_rank is None:
        if shown is not None:
            _clear(d, f"rank {shown.rank} keeps pace again ({_ratio(prog.slowdown)})")
        return
    named = _named(obs, prog.slow_rank, prog.slowdown or 0.0, s.step)
    if shown is None or not _same_pod(obs, shown, named):
        if shown is not None:
            _clear(d, f"rank {shown.rank} keeps pace again; rank {named.rank} is now slowest")
        s.slow_rank = named
        d.emit("SlowRank", _words(named), warning=True)
        return
    # The same pod's ranks share its node: whichever of them rank 0 names the slowest now, the
    # node has stayed slow since it was first named (straggler.py counts from since_step).
    s.slow_rank = shown.model_copy(
        update={
            "rank": named.rank,
            "slowdown": named.slowdown,
            "pod": named.pod or shown.pod,
            "node": named.node,
        }
    )


def _same_pod(obs: observed.Observed, shown: status.SlowRank, named: status.SlowRank) -> bool:
    """Whether the newly named rank is one of the shown rank's pod (pod rank = global rank //
    nprocPerNode): two ranks of one slow node take turns at being the slowest."""
    per_pod = obs.spec.nproc_per_node
    return shown.rank // per_pod == named.rank // per_pod


def _named(obs: observed.Observed, rank: int, slowdown: float, step: int | None) -> status.SlowRank:
    """The named rank with the pod that holds it: pod rank = global rank // nprocPerNode."""
    s = obs.status
    pod_rank = rank // obs.spec.nproc_per_node
    pod = next((p for p in obs.attempt_pods(s.attempt) if p.rank == pod_rank), None)
    return status.SlowRank(
        rank=rank,
        pod=pod.name if pod is not None else "",
        node=(pod.node or "") if pod is not None else "",
        slowdown=round(slowdown, SLOWDOWN_DIGITS),
        since=obs.now,
        attempt=s.attempt,
        since_step=step,
    )


def _words(named: status.SlowRank) -> str:
    where = f"pod {named.pod or '?'} on node {named.node or '?'}"
    return (
        f"rank {named.rank} ({where}) computes {named.slowdown:.2f}x as long per step as the "
        "other ranks' median: the whole gang runs at its pace (look at the node: CPU "
        "throttling, a slow or hot GPU, a noisy neighbour)"
    )


def _ratio(slowdown: float | None) -> str:
    return f"slowest now {slowdown:.2f}x the median" if slowdown is not None else "none named"


def _clear(d: decision.Draft, why: str) -> None:
    d.status.slow_rank = None
    d.emit("SlowRankCleared", f"no rank is slow now: {why}")
