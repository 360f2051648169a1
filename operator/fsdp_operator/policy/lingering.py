"""A gang whose rank 0 ended well and whose other pods did not end: the job succeeded.

Rank 0's trainer returns only after the last checkpoint is written and sealed (the marker is
written once every rank saved), so a pod still running long after rank 0's pod exited 0 is
stuck in its exit, not training (seen under load: node rank 1's pod ran on for minutes and the
job never finished). Past deadlines.EXIT_GRACE_SECONDS those pods are deleted as the job succeeds,
their log tails kept first (as a failed attempt's are: evidence.py), and a Warning Event names
them. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import deadlines, decision, failure, finish
from fsdp_operator.types import observed, status


def succeeded_without(
    d: decision.Draft, obs: observed.Observed, late: list[observed.PodView]
) -> decision.Draft:
    s = d.status
    pods = ", ".join(p.name for p in late)
    first = min(late, key=lambda p: p.rank)
    why = (
        f"{pods} still ran {deadlines.EXIT_GRACE_SECONDS:.0f}s after rank 0's pod exited 0: "
        "training is over, so they are deleted"
    )
    told = status.Failure(
        cause=status.Cause.HANG,
        rank=first.rank,
        pod=first.name,
        node=first.node,
        message=why,
        time=obs.now,
    )
    wanted = failure.collect(obs, told)
    if wanted is not None:  # their log tails first, in the attempt's ConfigMap
        d.collect = dataclasses.replace(wanted, hang=False, drop=(), told=told)
        why += f"; their last log lines are kept: fsdpctl logs <job> --attempt {s.attempt}"
    d.emit("PodsDidNotExit", why, warning=True)
    d.delete += [decision.PodDelete(p.name, force=decision.node_gone(obs, p)) for p in late]
    msg = f"rank 0's pod of attempt {s.attempt} exited 0; {len(late)} pods did not exit"
    return finish.finish(d, obs, None, msg)
