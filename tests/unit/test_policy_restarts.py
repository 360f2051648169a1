"""Restart budgets, the circuit breaker, backoff and world size (policy/restarts.py), as decide()
applies them: what a user sees when a job restarts, stops restarting, shrinks or grows.

No cluster and no clock: each row is an observation and the decision a user would see.
"""

from __future__ import annotations

from fsdp_operator.policy import decide, restarts
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests.builders import (
    NOW,
    ckpt,
    make_spec,
    nodes,
    observe,
    pods,
    running_status,
)


def test_restart_without_new_checkpoint_backs_off_exponentially() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    delays = []
    for without in (0, 1):
        status = running_status(
            resumed_from_step=40,
            restarts=st.Restarts(total=without, application=without, without_progress=without),
        )
        d = decide.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(40)))
        delays.append(d.status.next_attempt_at)
    assert delays[0] is None  # first failure without progress: launched at once
    assert delays[1] == NOW + 10  # second: initialSeconds, then doubling
    spec = make_spec()
    assert restarts.backoff_seconds(spec, st.Restarts(without_progress=4)) == 40
    assert restarts.backoff_seconds(spec, st.Restarts(without_progress=9)) == 60


def test_progress_resets_the_circuit_breaker() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    status = running_status(resumed_from_step=40, restarts=st.Restarts(without_progress=2))
    d = decide.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(45)))
    assert d.status.restarts.without_progress == 0 and d.status.phase is st.Phase.RESTARTING


def test_circuit_breaker_fails_the_job() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    status = running_status(
        resumed_from_step=40, restarts=st.Restarts(total=2, application=2, without_progress=2)
    )
    d = decide.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(40)))
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.CIRCUIT_BREAKER
    assert d.launch is None and "maxRestartsWithoutProgress=3" in d.status.message


def test_application_budget_exhausted() -> None:
    failed = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW}
    status = running_status(restarts=st.Restarts(total=3, application=3))
    d = decide.decide(observe(status=status, pods=pods(r0=failed), checkpoint=ckpt(60)))
    assert d.status.phase is st.Phase.FAILED and d.status.reason == st.Cause.BUDGET
    assert "maxRestarts=3" in d.status.message and d.status.finished == NOW


def test_infrastructure_failures_do_not_spend_the_application_budget() -> None:
    status = running_status(restarts=st.Restarts(total=3, application=3))
    d = decide.decide(observe(status=status, pods=pods(r0={"disrupted": True})))
    assert d.status.phase is st.Phase.RESTARTING
    assert d.status.restarts.application == 3 and d.status.restarts.infrastructure == 1
    assert d.status.restarts.without_progress == 0  # not the job's fault


def test_infrastructure_budget_exhausted() -> None:
    status = running_status(restarts=st.Restarts(total=5, infrastructure=5))
    d = decide.decide(observe(status=status, pods=pods(r0={"disrupted": True})))
    assert d.status.phase is st.Phase.FAILED and "maxInfraRestarts=5" in d.status.message


def test_shrink_to_what_the_ready_nodes_hold_after_node_loss() -> None:
    d = decide.decide(observe(nodes=nodes(down={3: NOW - 40})))
    # 3 nodes left; 3 does not divide 8 samples, so 2 is the largest exact size
    assert d.launch is not None and d.launch.replicas == 2 and d.status.world_size == 2
    assert d.launch.excluded_nodes == ("node-3",)


def test_unschedulable_always_shrinks_even_if_capacity_looks_fine() -> None:
    status = running_status(phase=st.Phase.PENDING, attempt_started=NOW - 60)
    stuck = {"phase": ob.PodPhase.PENDING, "unschedulable": True, "node": None}
    d = decide.decide(observe(status=status, pods=pods(r3=stuck)))
    assert d.launch is not None and d.launch.replicas == 2


def test_never_below_min_replicas() -> None:
    d = decide.decide(observe(nodes=nodes(down={1: NOW - 40, 2: NOW - 40, 3: NOW - 40})))
    assert d.launch is not None and d.launch.replicas == 2  # minReplicas, will wait Pending


def test_grow_back_when_capacity_returns_is_a_planned_drain() -> None:
    status = running_status(replicas=2, world_size=2)
    d = decide.decide(observe(status=status, pods=pods(n=2)))
    assert d.status.phase is st.Phase.RESTARTING and d.status.reason == st.Cause.RESIZE
    assert d.status.drain and d.launch is None and {x.grace_seconds for x in d.delete} == {None}
    assert d.status.restarts.total == 0  # planned restarts cost no budget


def test_a_resize_that_came_out_no_larger_is_not_retried_at_once() -> None:
    """The capacity estimate said 4 pods fit, the attempt after the Resize launched 2 (what
    really fit at launch): growing again is held off for GROW_RETRY_SECONDS, not looped."""
    resized = st.HistoryEntry(
        attempt=1, started=NOW - 90, ended=NOW - 30, cause=st.Cause.RESIZE, world_size=2
    )
    current = st.HistoryEntry(attempt=2, started=NOW - 30, world_size=2)
    status = running_status(
        replicas=2, world_size=2, attempt=2, attempt_started=NOW - 30, history=[resized, current]
    )
    d = decide.decide(observe(status=status, pods=pods(n=2, attempt=2)))
    assert d.status.phase is st.Phase.RUNNING and not d.delete and not d.status.drain
    later = status.model_copy(update={"attempt_started": NOW - restarts.GROW_RETRY_SECONDS - 1})
    d = decide.decide(observe(status=later, pods=pods(n=2, attempt=2)))
    assert d.status.reason == st.Cause.RESIZE and d.status.drain  # tried again, later


def test_no_resize_once_the_last_step_is_reached() -> None:
    # The pods are sealing the final checkpoint; growing now would start an empty attempt.
    status = running_status(replicas=2, world_size=2, step=100)
    spec = make_spec(training={"globalBatchSize": 8, "microBatchSize": 1, "steps": 100})
    d = decide.decide(
        observe(spec=spec, status=status, pods=pods(n=2), progress=ob.Progress(step=100))
    )
    assert d.status.phase is st.Phase.RUNNING and not d.delete and not d.status.drain


def test_excluded_node_does_not_count_as_capacity() -> None:
    excluded = [st.ExcludedNode(node="node-3", until=NOW + 100)]
    status = running_status(replicas=2, world_size=2, excluded_nodes=excluded)
    d = decide.decide(observe(status=status, pods=pods(n=2)))
    assert d.launch is None and not d.delete  # 3 usable nodes: 2 is still the best size


def test_replicas_edit_down_is_applied_by_a_planned_restart() -> None:
    spec = make_spec(replicas=2, minReplicas=1)
    d = decide.decide(observe(spec=spec, generation=2))
    assert d.status.reason == st.Cause.RESIZE and d.status.observed_generation == 2
    # each condition says which spec it was set for, as Kubernetes' own conditions do
    assert {c.type: c.observed_generation for c in d.status.conditions} == {
        "Complete": 2,
        "Failed": 2,
        "Progressing": 2,
        "Suspended": 2,
    }
