"""Swap a slow node out (failurePolicy.swapSlowNodes with spec.spares): when the rank rank 0
names slow (status.slowRank, slowness.py) stays named at SWAP_SLOWDOWN or more for two of its
verdicts in a row, and a running spare stands on another node, the attempt stops as planned.
The gang saves a checkpoint on SIGTERM (no step is lost: finish.planned_stop), the slow node is
kept out of the next attempts like a lost node but not charged as a failure (Cause.STRAGGLER),
and the next attempt lands on the node the spare stood on. Without a spare, or with the knob
off, the slow rank is only reported, and status.slowRank.kept says why it stayed.

Node rank 0 is swapped like any other: the whole gang is recreated, so no pod has to take over
the coordinator's or the store's place. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

from fsdp_operator.policy import conditions, decision, finish, restarts, spares
from fsdp_operator.types import observed, status
from fsdp_worker import contract

SWAP_SLOWDOWN = 1.5
"""Compute this many times the others' median swaps a node out (rank 0 names one from 1.3): a
node at two thirds of the speed or worse; nearer the line a gang restart costs about what the
swap wins back."""
CONFIRM_STEPS = contract.PACE_WINDOW_STEPS
"""Steps the rank stays named before it counts as persistently slow: rank 0 judges once per
window, so a second verdict in a row has kept it named (a jittery window, or the slow first
steps after a resume, make one verdict at most)."""


def swap(
    d: decision.Draft, obs: observed.Observed, tun: restarts.Tunables
) -> decision.Draft | None:
    """Stop the attempt to swap its slow node out; None: it runs on (status.slowRank.kept, and
    with swapSlowNodes a SlowNodeKept Event the first time, say why where the reason is not a
    passing one)."""
    s, slow = d.status, d.status.slow_rank
    if slow is None or not _persistent(s, slow) or _busy(d, obs):
        return None
    pod = _pod(obs, s, slow)
    if pod is None or pod.node is None:
        return None
    spare = spares.spare_for(obs, pod, s.attempt)
    why = _kept(obs, s, slow, spare=spare)
    if why or spare is None:
        _keep(d, slow, why, told=obs.spec.failure_policy.swap_slow_nodes)
        return None
    entry = decision.current_entry(s)
    assert entry is not None and s.step is not None  # _busy and _persistent
    entry.swap = status.Swap(
        rank=slow.rank,
        pod=pod.name,
        node=pod.node,
        slowdown=slow.slowdown,
        step=s.step,
        spare=spare.name,
        spare_node=spare.node or "",  # spare_for: a node other than the slow pod's
    )
    s.excluded_nodes = restarts.active_exclusions(s, now=obs.now, blame=pod.node, tun=tun)
    return finish.planned_stop(d, obs, status.Cause.STRAGGLER, swapped_words(entry.swap, slow))


def _persistent(s: status.FSDPJobStatus, slow: status.SlowRank) -> bool:
    """Named in this attempt for a second verdict in a row, and slow enough to swap."""
    return (
        slow.attempt == s.attempt
        and slow.since_step is not None
        and s.step is not None
        and s.step - slow.since_step >= CONFIRM_STEPS
        and slow.slowdown >= SWAP_SLOWDOWN
    )


def _busy(d: decision.Draft, obs: observed.Observed) -> bool:
    """Something is under way that a swap must not cut into: the attempt not running whole
    yet, a drain, a restart in place that has not trained again, a spare's takeover whose lost
    pod is still there, training past its last step, or a name conflict. At most one swap per
    attempt: one that swapped has stopped."""
    s = d.status
    entry = decision.current_entry(s)
    if entry is None or entry.ended is not None or entry.swap is not None:
        return True
    in_place = entry.restarts_in_place[-1] if entry.restarts_in_place else None
    replaced = set(s.spares.replaced) if s.spares is not None else set()
    return (
        s.phase is not status.Phase.RUNNING
        or not s.pods_created
        or s.drain
        or s.step is None
        or s.step >= obs.spec.training.steps
        or (in_place is not None and in_place.resumed is None)
        or any(p.name in replaced for p in obs.pods)
        or conditions.blocked(d, obs)
    )


def _pod(
    obs: observed.Observed, s: status.FSDPJobStatus, slow: status.SlowRank
) -> observed.PodView | None:
    """The running gang pod that holds the slow rank: pod rank = global rank // nprocPerNode."""
    node_rank = slow.rank // obs.spec.nproc_per_node
    return next(
        (
            p
            for p in obs.attempt_pods(s.attempt)
            if p.rank == node_rank and p.phase is observed.PodPhase.RUNNING and not p.deleting
        ),
        None,
    )


def _kept(
    obs: observed.Observed,
    s: status.FSDPJobStatus,
    slow: status.SlowRank,
    *,
    spare: observed.PodView | None,
) -> str:
    """Why a persistently slow rank's node stays ("": it goes)."""
    if not obs.spec.failure_policy.swap_slow_nodes:
        return "failurePolicy.swapSlowNodes is off"
    if not obs.spec.spares:
        return "no spare to swap it for (spec.spares is 0)"
    before = s.history[-2] if len(s.history) >= 2 else None
    if before is not None and before.swap is not None and before.swap.rank == slow.rank:
        return (
            f"rank {slow.rank} was swapped out of node {before.swap.node} in attempt "
            f"{before.attempt} and is slow again on another node: the slowness is the rank's "
            "(its data, its work), not the node's"
        )
    if spare is None:
        return "no spare was running on another node to swap it for"
    return ""


def _keep(d: decision.Draft, slow: status.SlowRank, why: str, *, told: bool) -> None:
    """Keep why the slow node stays; say it once (again when the reason changes) where the
    job asked for swaps (`told`): without swapSlowNodes the SlowRank Event was the news."""
    if slow.kept == why:
        return
    slow.kept = why
    if told:
        d.emit("SlowNodeKept", kept_words(slow), warning=True)


def kept_words(slow: status.SlowRank) -> str:
    return (
        f"rank {slow.rank} (pod {slow.pod or '?'} on node {slow.node or '?'}) computes "
        f"{slow.slowdown:.2f}x as long per step as the other ranks' median since step "
        f"{slow.since_step}; its node is not swapped out: {slow.kept}"
    )


def swapped_words(swapped: status.Swap, slow: status.SlowRank) -> str:
    return (
        f"swapped out: rank {swapped.rank} (pod {swapped.pod} on node {swapped.node}) computed "
        f"{swapped.slowdown:.2f}x as long per step as the other ranks' median from step "
        f"{slow.since_step} to step {swapped.step}; the gang saves a checkpoint now and starts "
        f"again without node {swapped.node}, on node {swapped.spare_node} where spare pod "
        f"{swapped.spare} stood"
    )
