"""Pods the scheduler does not place: why, in the scheduler's own words, and what that means.

The PodScheduled=False message of the attempt's pending pods ("0/3 nodes are available: 3
Insufficient nvidia.com/gpu", 'persistentvolumeclaim "ckpt" not found') reaches the job's
PodsScheduled condition and a Warning Event as soon as it is seen, before the pending timeout
(detect.py) restarts the job smaller. A claim that does not exist is the spec's problem, not
the cluster's: no smaller gang would schedule, so at the timeout the job fails (InvalidSpec)
instead of shrinking. A checkpoint claim that is not ReadWriteMany under a multi-pod gang is
named too (claim_shared). Pure: the draft in, the draft changed; no I/O, no clock reads, no
kopf.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence

from fsdp_operator.policy import conditions, decision
from fsdp_operator.types import observed

PODS_SCHEDULED = "PodsScheduled"  # condition: whether the scheduler placed the attempt's pods
CLAIM_SHARED = "VolumeClaimShared"  # condition: whether every pod's node can mount the claim
_CLAIM_MISSING = re.compile(r'persistentvolumeclaim "([^"]+)" not found', re.IGNORECASE)
_CLAIM_UNBOUND = re.compile(r"unbound immediate persistentvolumeclaims", re.IGNORECASE)
_DEVICES = re.compile(r"cannot allocate all claims|resourceclaim .* not found", re.IGNORECASE)


class Problem(enum.StrEnum):
    """What keeps the pods off the nodes (the condition's reason)."""

    CLAIM_NOT_FOUND = "VolumeClaimNotFound"  # the spec names a claim that does not exist
    CLAIM_UNBOUND = "VolumeClaimUnbound"  # no volume binds the claim (class, provisioner)
    DEVICES = "DevicesNotAllocated"  # DRA: no node's driver has the devices the claims ask
    UNSCHEDULABLE = "Unschedulable"  # capacity, selectors, taints: the scheduler says which


def problem(message: str) -> Problem:
    """The kind of the scheduler's reason, from its words."""
    if _CLAIM_MISSING.search(message):
        return Problem.CLAIM_NOT_FOUND
    if _CLAIM_UNBOUND.search(message):
        return Problem.CLAIM_UNBOUND
    if _DEVICES.search(message):
        return Problem.DEVICES
    return Problem.UNSCHEDULABLE


def stuck(pods: Sequence[observed.PodView]) -> list[observed.PodView]:
    """The pods the scheduler has not placed (a pod Kueue still gates is queued, not stuck)."""
    return [
        p
        for p in pods
        if p.phase is observed.PodPhase.PENDING and not p.gated and (p.unschedulable or not p.node)
    ]


def blocker(pods: Sequence[observed.PodView]) -> observed.PodView | None:
    """The stuck pod whose reason says most: a missing claim first (it is the spec's, and
    no wait cures it), then an unbound one, then the first pod with any reason."""
    said = [p for p in stuck(pods) if p.scheduler_message]
    order = list(Problem)
    said.sort(key=lambda p: order.index(problem(p.scheduler_message)))
    return said[0] if said else None


def reason(pods: Sequence[observed.PodView]) -> str:
    """`pod NAME: THE SCHEDULER'S WORDS`, or "" when no stuck pod has any."""
    pod = blocker(pods)
    return f"pod {pod.name}: {pod.scheduler_message}" if pod is not None else ""


def advice(kind: Problem) -> str:
    """What to do about it, after the scheduler's words."""
    if kind is Problem.CLAIM_NOT_FOUND:
        return (
            "; create the claim, or name an existing one in spec.template's volumes (a smaller "
            "gang would not schedule either: at failurePolicy.pendingTimeoutSeconds the job "
            "fails instead of shrinking)"
        )
    if kind is Problem.CLAIM_UNBOUND:
        return "; no volume binds the claim: check its storageClassName and the provisioner"
    if kind is Problem.DEVICES:
        return (
            "; no node's DRA driver has free devices that template.spec.resourceClaims ask for: "
            "check the claims' DeviceClass and that a driver publishes them (kubectl get "
            "resourceslices)"
        )
    return ""


def report(d: decision.Draft, obs: observed.Observed, pods: Sequence[observed.PodView]) -> None:
    """Say in PodsScheduled (and once per kind in a Warning Event) why pods wait for a node;
    turn it True once they are placed. A job whose pods always scheduled never gets it."""
    old = next((c for c in d.status.conditions if c.type == PODS_SCHEDULED), None)
    pod = blocker(pods)
    if pod is None:
        if old is not None and old.status == "False" and not stuck(pods):
            msg = f"every pod of attempt {d.status.attempt} is placed"
            conditions.set_condition(
                d, obs, kind=PODS_SCHEDULED, true=True, reason="Scheduled", msg=msg
            )
        return
    kind = problem(pod.scheduler_message)
    count = len(stuck(pods))
    msg = f"{count} pod(s) not scheduled; {reason(pods)}{advice(kind)}"
    if old is None or old.status != "False" or old.reason != kind.value:
        d.emit(kind.value, msg, warning=True)
    if old is None or old.message != msg or old.status != "False":
        conditions.set_condition(
            d, obs, kind=PODS_SCHEDULED, true=False, reason=kind.value, msg=msg
        )


def claim_shared(d: decision.Draft, obs: observed.Observed) -> None:
    """Say in VolumeClaimShared (and once in a Warning Event) that checkpoint.claimName is not
    ReadWriteMany while a multi-pod gang waits on its nodes: the kubelets cannot attach it on
    all of them (Multi-Attach), and the pods stay ContainerCreating, which no timeout sees.
    The claim is read only then (run/gather.py); a single-node cluster, where a ReadWriteOnce
    claim serves every pod, never gets here: its pods run."""
    claim = obs.claim
    old = next((c for c in d.status.conditions if c.type == CLAIM_SHARED), None)
    if claim is not None and claim.shared and old is not None and old.status == "False":
        msg = f'checkpoint.claimName "{claim.name}" is ReadWriteMany'
        conditions.set_condition(
            d, obs, kind=CLAIM_SHARED, true=True, reason="ReadWriteMany", msg=msg
        )
    if claim is None or not claim.found or claim.shared:
        return
    modes = ", ".join(claim.access_modes) or "no access modes"
    msg = (
        f'checkpoint.claimName "{claim.name}" is {modes}: pods on different nodes cannot all '
        "mount it (the kubelet reports Multi-Attach and they stay ContainerCreating); give "
        "the job a ReadWriteMany claim"
    )
    if old is None or old.status != "False":
        d.emit("VolumeClaimNotShared", msg, warning=True)
        conditions.set_condition(
            d, obs, kind=CLAIM_SHARED, true=False, reason="NotReadWriteMany", msg=msg
        )
