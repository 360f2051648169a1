"""Warm spares (spec.spares): keep them running beside the gang, and let one take a lost node's
place, or a frozen pod's, in a restart in place: only that pod goes, nothing is scheduled, no
image starts. What the gang's coordinator answers (run/keepers.py asks it) comes back through
`refused`. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import conditions, decision, restarts
from fsdp_operator.types import names, observed, status
from fsdp_worker import contract

SPARE_EXPECT_SECONDS = 5.0
"""Spares made this long ago and not seen yet are not made again (a surplus one is deleted)."""
REPLACED_LIMIT = 8  # pods status.spares.replaced keeps


def _running(p: observed.PodView) -> bool:
    return p.phase is observed.PodPhase.RUNNING


def _takeover_target(
    obs: observed.Observed, failure: status.Failure, pods: list[observed.PodView]
) -> tuple[observed.PodView, contract.FailureClass, str] | None:
    """The gang pod whose node rank a spare can take for this failure, the class the gang
    records it under, and why: a lost node's pod; for a hang, the one pod whose keeper the
    coordinator reports silent (observed.GangHealth: the pod frozen, its ranks unable to restart
    in place), not when several or none are (a hang of the ranks themselves restarts in place);
    node rank 0's running pod when the coordinator, its keeper, does not answer at all."""
    if failure.cause is status.Cause.NODE_LOST:
        lost = next((p for p in pods if p.name == failure.pod), None)
        why = f"NodeLost: node {failure.node} ({failure.message})"
        return (lost, contract.FailureClass.NODE_LOST, why) if lost is not None else None
    gang = obs.gang
    if failure.cause is not status.Cause.HANG or gang is None or gang.final:
        return None
    progress = failure.message.split("; not restarted in place")[0]
    if not gang.answered:
        frozen = next(
            (p for p in pods if p.rank == 0 and _running(p) and not decision.node_gone(obs, p)),
            None,
        )
        if frozen is None:
            return None
        coordinator = "node rank 0's keeper, the gang's coordinator,"
        if coordinator in progress:  # suspected early (policy/frozen.py): its words say it
            return frozen, contract.FailureClass.HANG, f"Hang: {progress} (pod {frozen.name})"
        why = f"Hang: {progress}; {coordinator} did not answer ({gang.error}; pod {frozen.name})"
        return frozen, contract.FailureClass.HANG, why
    if len(gang.silent) != 1:
        return None
    ((node, quiet),) = gang.silent.items()
    frozen = next((p for p in pods if p.rank == node), None)
    if frozen is None:
        return None
    silent = f"node rank {node}'s keeper silent for"
    if silent in progress:  # suspected early (policy/frozen.py): its words name the keeper
        return frozen, contract.FailureClass.HANG, f"Hang: {progress} (pod {frozen.name})"
    why = f"Hang: {progress}; {silent} {quiet:.0f}s (pod {frozen.name})"
    return frozen, contract.FailureClass.HANG, why


def spare_for(
    obs: observed.Observed, lost: observed.PodView, attempt: int
) -> observed.PodView | None:
    """The lowest-numbered running spare of `attempt` on a usable node other than the lost
    pod's."""
    return next(
        (
            p
            for p in sorted(obs.spares, key=lambda p: p.spare or 0)
            if p.attempt == attempt
            and _running(p)
            and not p.deleting
            and p.node not in (None, lost.node)
            and not decision.node_gone(obs, p)
        ),
        None,
    )


def take_over(
    d: decision.Draft, obs: observed.Observed, failure: status.Failure, tun: restarts.Tunables
) -> bool:
    """A lost node, or a pod frozen whole, whose place a running spare takes in a restart in
    place (spec.spares): only that pod goes; nothing is scheduled, no image starts. Node rank
    0's too (it hosted the gang's coordinator and torchrun's store): the spare becomes both,
    and the other pods' keepers follow it. Not past inPlaceRestarts, not a pod whose takeover
    was refused. True: this pass's failure is handled (or already was)."""
    s, sp = d.status, d.status.spares
    if sp is None or not obs.spec.spares:
        return False
    if failure.cause not in (status.Cause.NODE_LOST, status.Cause.HANG):
        return False
    pods = obs.attempt_pods(s.attempt)
    target = _takeover_target(obs, failure, pods)
    if failure.pod in sp.replaced or (target is not None and target[0].name in sp.replaced):
        d.again(1.0)  # taken over in an earlier pass; its deletion is under way
        return True
    if target is None:
        return False
    lost, cls, why = target
    found = _takeover(obs, s, sp, lost, pods=pods, failure=failure, cls=cls, why=why)
    if found is None:
        return False
    d.takeover, spare = found
    sp.takeovers += 1
    sp.replaced = [*sp.replaced, lost.name][-REPLACED_LIMIT:]
    if cls is contract.FailureClass.NODE_LOST:  # a frozen pod's node is not to blame
        s.excluded_nodes = restarts.active_exclusions(s, now=obs.now, blame=lost.node, tun=tun)
    d.emit(
        "SpareTakeover",
        f"{why}; spare pod {spare.name} (on {spare.node}) takes node rank {lost.rank}'s place "
        "in a restart in place",
        warning=True,
    )
    d.again(1.0)
    return True


def _takeover(
    obs: observed.Observed,
    s: status.FSDPJobStatus,
    sp: status.Spares,
    lost: observed.PodView,
    *,
    pods: list[observed.PodView],
    failure: status.Failure,
    cls: contract.FailureClass,
    why: str,
) -> tuple[decision.Takeover, observed.PodView] | None:
    """What the keepers are told for `lost`'s place, and the spare that takes it; None while
    no spare can (none running, an address missing, a follower unreachable, this pod's
    takeover refused before, or inPlaceRestarts spent)."""
    rank0 = next((p for p in pods if p.rank == 0 and _running(p)), None)
    spare = spare_for(obs, lost, s.attempt)
    entry = decision.current_entry(s)
    used = len(entry.restarts_in_place) if entry is not None else 0
    others = [p for p in pods if p.name not in (lost.name, *sp.replaced) and not p.deleting]
    reachable = True
    if lost.rank == 0:  # the spare is the coordinator now; the others' keepers follow it
        rank0 = spare
        reachable = {p.rank for p in others} == set(range(1, s.replicas or len(pods))) and all(
            p.ip and _running(p) for p in others
        )
    if (
        lost.rank is None
        or spare is None
        or spare.spare is None
        or rank0 is None
        or rank0.ip is None
        or spare.ip is None
        or not reachable
        or sp.refused == lost.name
        or used >= obs.spec.failure_policy.in_place_restarts
    ):
        return None
    node0 = lost.rank == 0
    told = decision.Takeover(
        spare=spare.name,
        index=spare.spare,
        node_rank=lost.rank,
        lost=lost.name,
        coordinator=f"{rank0.ip}:{names.GANG_PORT}",
        master=f"{rank0.ip}:{names.RENDEZVOUS_PORT}",
        followers=tuple(f"{p.ip}:{names.GANG_PORT}" for p in others) if node0 else (),
        generation=used,
        spare_at=f"{spare.ip}:{names.GANG_PORT}",
        failure={
            "class": cls.value,
            "message": failure.message if cls is contract.FailureClass.NODE_LOST else why,
            "time": failure.time,
            "rank": lost.rank * obs.spec.nproc_per_node,
            "pod": lost.name,
            "nodeName": lost.node,
            "detected": obs.now,
        },
    )
    return told, spare


def refused(d: decision.Decision, why: str) -> decision.Decision:
    """The gang's coordinator (or a keeper that was to follow the spare) refused the takeover,
    or did not answer: the status says so, in the pass's one patch, and the next pass
    recreates the gang as without spares. Nothing is handed over."""
    t = d.takeover
    assert t is not None
    s = d.status.model_copy(deep=True)
    sp = s.spares
    if sp is not None:
        sp.refused = t.lost
        sp.replaced = [name for name in sp.replaced if name != t.lost]
    said = f"{t.lost}: {why}; the gang is recreated"
    event = decision.Event(decision.EventType.WARNING, "SpareTakeoverRefused", said)
    return dataclasses.replace(d, status=s, events=(*d.events, event), takeover=None)


def keep(d: decision.Draft, obs: observed.Observed) -> None:
    """spec.spares running beside the attempt, once every pod of the gang has its node: a spare
    that ended or lost its node goes, a new one is made behind each that went or took a node's
    place. Not under Kueue (its pod group is the gang)."""
    s, sp = d.status, d.status.spares
    if sp is None or not s.pods_created or s.queue is not None:
        return
    if not all(p.node for p in obs.attempt_pods(s.attempt)):
        return  # a spare placed first could keep a gang pod off the node it needs
    live = []
    for p in obs.spares:
        gone = decision.node_gone(obs, p)
        if (
            p.attempt == s.attempt
            and p.phase not in decision.EXITED
            and not gone
            and not p.deleting
        ):
            live.append(p)
        elif not p.deleting or gone:
            d.delete.append(decision.PodDelete(p.name, force=gone))
    sp.running = sum(_running(p) for p in live)
    sp.pending = len(live) - sp.running
    surplus = sorted(live, key=lambda p: p.spare or 0)[obs.spec.spares :]
    d.delete += [decision.PodDelete(p.name) for p in surplus]  # one made twice (a slow watch)
    made = sp.last_created is not None and obs.now - sp.last_created < SPARE_EXPECT_SECONDS
    missing = obs.spec.spares - len(live)
    if missing > 0 and not made and not conditions.blocked(d, obs):
        d.spares = list(range(sp.next_index, sp.next_index + missing))
        sp.next_index += missing
        sp.last_created = obs.now
        sp.pending += missing
