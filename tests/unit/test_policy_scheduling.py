"""Pods the scheduler does not place (policy/scheduling.py, detect.py's pending timeout): the
scheduler's own reason reaches the PodsScheduled condition and a Warning Event at once, and the
failure, the phase message and lastFailure at the timeout; a claim that does not exist fails
the job as a spec problem instead of shrinking it.

No cluster and no clock: each row is the pods' PodScheduled messages and what a user sees.
"""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.policy import decide, scheduling
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import NOW, condition, observe, pods, running_status

NO_GPU = (
    "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are "
    "available: 3 No preemption victims found for incoming pod."
)
NO_CLAIM = (
    '0/3 nodes are available: persistentvolumeclaim "ckpt" not found. preemption: 0/3 nodes '
    "are available: 3 Preemption is not helpful for scheduling."
)
UNBOUND = (
    "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims. preemption: "
    "0/3 nodes are available: 3 Preemption is not helpful for scheduling."
)
NO_DEVICE = (  # DRA: no node's driver publishes a device the pod's claims ask for
    "0/3 nodes are available: 3 cannot allocate all claims. preemption: 0/3 nodes are "
    "available: 3 Preemption is not helpful for scheduling."
)
TIMEOUT = 50  # make_spec's failurePolicy.pendingTimeoutSeconds


def stuck(message: str) -> dict[str, Any]:
    """A pod the scheduler left Pending, with its PodScheduled message."""
    return {
        "phase": ob.PodPhase.PENDING,
        "node": None,
        "unschedulable": True,
        "scheduler_message": message,
    }


def pending_for(seconds: float, **ranks: dict[str, Any]) -> ob.Observed:
    """Attempt 1, created `seconds` ago, with the pods `ranks` says are stuck."""
    status = running_status(phase=st.Phase.PENDING, attempt_started=NOW - seconds)
    return observe(status=status, pods=pods(**ranks), progress=None)


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (NO_GPU, scheduling.Problem.UNSCHEDULABLE),
        (NO_CLAIM, scheduling.Problem.CLAIM_NOT_FOUND),
        (UNBOUND, scheduling.Problem.CLAIM_UNBOUND),
        (NO_DEVICE, scheduling.Problem.DEVICES),
        ("", scheduling.Problem.UNSCHEDULABLE),
    ],
)
def test_the_schedulers_words_say_what_kind_of_problem_it_is(
    message: str, kind: scheduling.Problem
) -> None:
    assert scheduling.problem(message) is kind


@pytest.mark.parametrize(
    ("message", "reason", "advice"),
    [
        (NO_GPU, "Unschedulable", ""),
        (NO_CLAIM, "VolumeClaimNotFound", "create the claim"),
        (UNBOUND, "VolumeClaimUnbound", "storageClassName"),
        (NO_DEVICE, "DevicesNotAllocated", "kubectl get resourceslices"),
    ],
)
def test_the_reason_is_named_before_any_timeout(message: str, reason: str, advice: str) -> None:
    d = decide.decide(pending_for(10, r2=stuck(message), r3=stuck(message)))
    assert d.failure is None and d.launch is None  # within the timeout: it waits
    cond = condition(d, scheduling.PODS_SCHEDULED)
    assert cond is not None and (cond.status, cond.reason) == ("False", reason)
    assert cond.message.startswith(f"2 pod(s) not scheduled; pod job-a1-2: {message}")
    assert advice in cond.message
    warned = [e for e in d.events if e.reason == reason]
    assert len(warned) == 1 and warned[0].type is decide.EventType.WARNING
    assert warned[0].message == cond.message
    # The next pass sees the same: no second Event, nothing to write.
    again = decide.decide(
        observe(status=d.status, pods=pods(r2=stuck(message), r3=stuck(message)), progress=None)
    )
    assert not [e for e in again.events if e.reason == reason]
    assert again.status == d.status


def test_no_capacity_shrinks_the_job_and_says_the_schedulers_reason() -> None:
    # before: "2 pod(s) unschedulable for over 50s", and the job shrank with no reason given
    d = decide.decide(pending_for(TIMEOUT + 1, r2=stuck(NO_GPU), r3=stuck(NO_GPU)))
    said = f"2 pod(s) unschedulable for over {TIMEOUT}s; pod job-a1-2: {NO_GPU}"
    assert d.failure is not None and d.failure.cause is st.Cause.UNSCHEDULABLE
    assert d.status.last_failure is not None and d.status.last_failure.message == said
    assert d.status.phase is st.Phase.RESTARTING and d.status.message == said
    assert d.launch is not None and d.launch.replicas == 2  # smaller: capacity may fit it
    detected = next(e for e in d.events if e.reason == "FailureDetected")
    assert NO_GPU in detected.message


def test_a_missing_claim_fails_the_job_as_a_spec_problem_without_shrinking() -> None:
    d = decide.decide(pending_for(TIMEOUT + 1, r0=stuck(NO_CLAIM), r1=stuck(NO_CLAIM)))
    assert d.launch is None  # no smaller attempt: it would name the same claim
    assert d.status.phase is st.Phase.FAILED and d.status.reason == "InvalidSpec"
    assert 'persistentvolumeclaim "ckpt" not found' in d.status.message
    assert "create the claim" in d.status.message
    assert d.status.restarts == st.Restarts()
    failed = condition(d, "Failed")
    assert failed is not None and failed.status == "True" and "ckpt" in failed.message


def test_an_unbound_claim_is_named_at_the_timeout_and_restarts_as_before() -> None:
    d = decide.decide(pending_for(TIMEOUT + 1, r3=stuck(UNBOUND)))
    assert d.failure is not None and d.failure.cause is st.Cause.UNSCHEDULABLE
    assert "unbound immediate PersistentVolumeClaims" in d.failure.message
    assert "storageClassName" not in d.failure.message  # the advice is the condition's


def test_a_missing_claim_is_named_first_whatever_the_other_pods_say() -> None:
    d = decide.decide(pending_for(10, r1=stuck(NO_GPU), r3=stuck(NO_CLAIM)))
    cond = condition(d, scheduling.PODS_SCHEDULED)
    assert cond is not None and cond.reason == "VolumeClaimNotFound"
    assert "pod job-a1-3: " in cond.message


def test_placed_pods_turn_the_condition_true_and_a_job_always_placed_never_has_it() -> None:
    d = decide.decide(pending_for(10, r3=stuck(NO_GPU)))
    placed = decide.decide(
        observe(status=d.status, pods=pods(r3={"phase": ob.PodPhase.PENDING}), progress=None)
    )
    cond = condition(placed, scheduling.PODS_SCHEDULED)
    assert cond is not None and (cond.status, cond.reason) == ("True", "Scheduled")
    assert condition(decide.decide(observe()), scheduling.PODS_SCHEDULED) is None


def test_pods_kueue_still_gates_are_queued_not_unschedulable() -> None:
    gated = {**stuck(""), "gated": True, "unschedulable": False}
    d = decide.decide(pending_for(10, r2=gated, r3=gated))
    assert condition(d, scheduling.PODS_SCHEDULED) is None


def on_nodes(claim: ob.ClaimView | None, status: st.FSDPJobStatus | None = None) -> ob.Observed:
    """Attempt 1's pods placed and waiting to start (ContainerCreating), with the claim read."""
    waiting = {f"r{r}": {"phase": ob.PodPhase.PENDING} for r in range(4)}
    status = status or running_status(phase=st.Phase.PENDING, attempt_started=NOW - 10)
    return observe(status=status, pods=pods(**waiting), progress=None, claim=claim)


def test_a_claim_not_read_write_many_under_a_multi_node_gang_is_named() -> None:
    rwo = ob.ClaimView("ckpt", found=True, access_modes=("ReadWriteOnce",))
    d = decide.decide(on_nodes(rwo))
    cond = condition(d, scheduling.CLAIM_SHARED)
    assert cond is not None and (cond.status, cond.reason) == ("False", "NotReadWriteMany")
    assert 'checkpoint.claimName "ckpt" is ReadWriteOnce' in cond.message
    assert "ReadWriteMany claim" in cond.message
    assert [e.reason for e in d.events].count("VolumeClaimNotShared") == 1
    again = decide.decide(on_nodes(rwo, status=d.status))
    assert "VolumeClaimNotShared" not in [e.reason for e in again.events]
    assert again.status == d.status
    rwx = ob.ClaimView("ckpt", found=True, access_modes=("ReadWriteMany",))
    fixed = condition(decide.decide(on_nodes(rwx, status=d.status)), scheduling.CLAIM_SHARED)
    assert fixed is not None and fixed.status == "True"


@pytest.mark.parametrize(
    "claim",
    [
        None,  # not read: no pod waits on a node, no claim, one pod, or the read was refused
        ob.ClaimView("ckpt", found=True, access_modes=("ReadWriteMany",)),
        ob.ClaimView("ckpt", found=False),  # the scheduler says so (PodsScheduled)
    ],
)
def test_a_shared_unread_or_missing_claim_adds_no_claim_condition(
    claim: ob.ClaimView | None,
) -> None:
    assert condition(decide.decide(on_nodes(claim)), scheduling.CLAIM_SHARED) is None
