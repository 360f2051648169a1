"""Kueue: a job that names a LocalQueue waits as one pod group, Queued and never charged."""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.io import cache, observe
from fsdp_operator.policy import conditions
from fsdp_operator.policy import decide as dc
from fsdp_operator.render import templates
from fsdp_operator.types import api, queueing
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_operator.types.names import JobRef
from tests.builders import NOW, pods, running_status
from tests.builders import observe as observation

QUEUE = queueing.Queue(name="team", job_name="job")
JOB = JobRef(name="job", namespace="ns", uid="u-1")


def queued_status(**over: Any) -> st.FSDPJobStatus:
    q = st.QueueStatus(name="team", pod_group="job-g1")
    return running_status(
        phase=st.Phase.PENDING, last_progress_time=None, step=None, queue=q, **over
    )


def test_the_queue_comes_from_the_job_labels_then_the_template() -> None:
    assert queueing.Queue.of("job", None, {}) is None
    got = queueing.Queue.of("job", {queueing.QUEUE_LABEL: "a"}, {queueing.QUEUE_LABEL: "b"})
    assert got == queueing.Queue(name="a", job_name="job")
    got = queueing.Queue.of("job", {}, {queueing.QUEUE_LABEL: "b", queueing.PRIORITY_LABEL: "hi"})
    assert got == queueing.Queue(name="b", job_name="job", priority_class="hi")


def test_an_attempts_pods_are_one_pod_group_of_its_size() -> None:
    spec = api.FSDPJobSpec.model_validate(
        {
            "replicas": 3,
            "image": "w:1",
            "training": {"globalBatchSize": 3, "microBatchSize": 1},
            # a template's own Kueue keys would split the group: the operator sets them
            "template": {"metadata": {"labels": {queueing.GROUP_LABEL: "mine", "team": "x"}}},
        }
    )
    required = "kueue.x-k8s.io/podset-required-topology"
    queue = queueing.Queue.of(
        "job",
        {queueing.QUEUE_LABEL: "team", queueing.PRIORITY_LABEL: "high"},
        annotations={required: "example.com/block", "other": "x"},
    )
    assert queue is not None
    launch = dc.Launch(attempt=4, replicas=3, resume_path="", queue=queue)
    made = templates.worker_pods(JOB, spec, launch)
    for pod in made:
        labels, notes = pod["metadata"]["labels"], pod["metadata"]["annotations"]
        assert labels[queueing.QUEUE_LABEL] == "team" and labels["team"] == "x"
        assert labels[queueing.GROUP_LABEL] == "job-g4"
        assert labels[queueing.PRIORITY_LABEL] == "high"
        assert notes[queueing.GROUP_COUNT_ANNOTATION] == "3"
        assert notes[queueing.ROLE_HASH_ANNOTATION] == queueing.ROLE
        assert notes[required] == "example.com/block" and "other" not in notes
    plain = templates.worker_pods(JOB, spec, dc.Launch(attempt=4, replicas=3, resume_path=""))
    keys = {*plain[0]["metadata"]["labels"], *plain[0]["metadata"]["annotations"]}
    assert not keys & queueing.KUEUE_KEYS  # without a queue: as before, no Kueue keys


def test_a_gated_pod_is_seen_as_queued() -> None:
    pod = {
        "metadata": {
            "name": "job-a1-0",
            "labels": {"fsdpoperator.io/attempt": "1", "fsdpoperator.io/node-rank": "0"},
        },
        "spec": {"schedulingGates": [{"name": queueing.ADMISSION_GATE}]},
        "status": {"phase": "Pending"},
    }
    view = observe.pod_view(cache.slim_pod(pod))  # as the operator's cache keeps it
    assert view is not None and view.gated
    pod["spec"]["schedulingGates"] = [{"name": "someone.else/gate"}]
    view = observe.pod_view(pod)
    assert view is not None and not view.gated


def test_admission_is_read_from_the_workload_conditions() -> None:
    waiting = {
        "status": {
            "conditions": [
                {
                    "type": "QuotaReserved",
                    "status": "False",
                    "reason": "Pending",
                    "message": "insufficient unused quota for nvidia.com/gpu",
                }
            ]
        }
    }
    got = queueing.admission_of(waiting)
    assert got == queueing.Admission(
        admitted=False, reason="Pending", message="insufficient unused quota for nvidia.com/gpu"
    )
    admitted = {
        "status": {
            "admission": {"clusterQueue": "cq"},
            "conditions": [
                {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
                {"type": "Admitted", "status": "True", "reason": "Admitted", "message": "ok"},
            ],
        }
    }
    assert queueing.admission_of(admitted) == queueing.Admission(
        admitted=True, reason="Admitted", message="ok", cluster_queue="cq"
    )
    assert queueing.admission_of(None) is None


GATED = {f"r{r}": {"phase": ob.PodPhase.PENDING, "node": None, "gated": True} for r in range(4)}


@pytest.mark.parametrize("waited", [10.0, 5000.0])
def test_waiting_in_the_queue_is_queued_never_unschedulable(waited: float) -> None:
    """Past pendingTimeoutSeconds (50 s here) a gated gang is still only Queued: no failure,
    no budget, no shrink; the reason is Kueue's."""
    said = queueing.Admission(admitted=False, reason="Pending", message="insufficient quota")
    status = queued_status(attempt_started=NOW - waited)
    d = dc.decide(observation(status=status, pods=pods(**GATED), admission=said))
    assert d.failure is None and d.launch is None and not d.delete
    s = d.status
    assert (
        s.phase is st.Phase.QUEUED and s.reason == "Pending" and "insufficient quota" in s.message
    )
    cond = next(c for c in s.conditions if c.type == conditions.QUEUED)
    assert cond.status == "True" and cond.reason == "Pending"
    assert s.restarts == st.Restarts() and s.replicas == 4


def test_the_pending_timeout_counts_from_admission() -> None:
    status = queued_status(attempt_started=NOW - 500)
    pending = {
        f"r{r}": {"phase": ob.PodPhase.PENDING, "node": None, "unschedulable": True}
        for r in range(4)
    }
    d = dc.decide(observation(status=status, pods=pods(**pending)))
    assert d.failure is None and d.status.queue is not None
    assert d.status.queue.admitted == NOW and d.status.queue.queued_seconds == 500
    assert d.status.phase is st.Phase.PENDING and d.status.reason == "Admitted"
    assert "Admitted" in [e.reason for e in d.events]
    later = dc.decide(observation(status=d.status, pods=pods(**pending), now=NOW + 49))
    assert later.failure is None
    late = dc.decide(observation(status=d.status, pods=pods(**pending), now=NOW + 51))
    assert late.failure is not None and late.failure.cause is st.Cause.UNSCHEDULABLE


def test_a_launch_under_a_queue_names_its_pod_group() -> None:
    d = dc.decide(
        observation(status=st.FSDPJobStatus(), pods=[], checkpoint=None, progress=None, queue=QUEUE)
    )
    assert d.launch is not None and d.launch.queue == QUEUE
    assert d.status.queue == st.QueueStatus(name="team", pod_group="job-g1")
    plain = dc.decide(observation(status=st.FSDPJobStatus(), pods=[], checkpoint=None))
    assert plain.status.queue is None and plain.launch is not None and plain.launch.queue is None


CRASHED = {"r1": {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 2}}


def admitted_status(**over: Any) -> st.FSDPJobStatus:
    q = st.QueueStatus(name="team", pod_group="job-g1", admitted=NOW - 100)
    return running_status(queue=q, **over)


def test_a_crash_under_a_queue_drains_then_replaces_the_pods_of_the_same_group() -> None:
    d = dc.decide(observation(status=admitted_status(), pods=pods(**CRASHED), queue=QUEUE))
    assert d.failure is not None and d.failure.cause is st.Cause.CRASH
    # the healthy rank is still running: Kueue would count it, so no replacement yet
    assert d.launch is None and d.status.drain and not d.release
    gone = {f"r{r}": {"phase": ob.PodPhase.FAILED, "exit_code": 143} for r in range(4)}
    nxt = dc.decide(observation(status=d.status, pods=pods(**gone), queue=QUEUE, now=NOW + 3))
    assert nxt.launch is not None and nxt.launch.pod_group == "job-g1" and not nxt.release
    assert nxt.status.queue == st.QueueStatus(name="team", pod_group="job-g1")


def test_a_lost_node_under_a_queue_takes_a_new_group_and_releases_the_old() -> None:
    down = [ob.NodeView(name=f"node-{i}", ready=i != 3, not_ready_since=NOW - 60) for i in range(4)]
    d = dc.decide(observation(status=admitted_status(), nodes=down, queue=QUEUE))
    assert d.failure is not None and d.failure.cause is st.Cause.NODE_LOST
    assert d.launch is None and d.status.drain  # the other ranks exit first
    gone = {f"r{r}": {"phase": ob.PodPhase.FAILED, "exit_code": 143} for r in range(3)}
    nxt = dc.decide(
        observation(status=d.status, pods=pods(**gone), nodes=down, queue=QUEUE, now=NOW + 3)
    )
    assert nxt.launch is not None and nxt.launch.replicas < 4  # shrunk: 2 divide the batch
    assert nxt.launch.pod_group == "job-g2" and nxt.release == ("job-g1",)


def test_kueue_eviction_is_a_planned_stop_without_budget() -> None:
    said = "Preempted: Preempted to accommodate a workload due to prioritization"
    evicted = {f"r{r}": {"queue_evicted": said, "deleting": True} for r in range(4)}
    d = dc.decide(observation(status=admitted_status(), pods=pods(**evicted), queue=QUEUE))
    assert d.failure is None and d.status.phase is st.Phase.RESTARTING
    assert d.status.reason == st.Cause.PREEMPTED.value and said in d.status.message
    assert d.status.restarts == st.Restarts() and d.status.reliability.failures == 0
    assert d.status.drain and d.launch is None  # the ranks save first
    assert st.budget_of(st.Cause.PREEMPTED) is st.Budget.NONE
    # once the ranks are gone the next attempt's pods replace them in the same pod group: its
    # Workload keeps Kueue's requeue state (backoff, backoffLimitCount), nothing is released
    gone = {f"r{r}": {"phase": ob.PodPhase.FAILED, "exit_code": 143} for r in range(4)}
    nxt = dc.decide(observation(status=d.status, pods=pods(**gone), queue=QUEUE, now=NOW + 3))
    assert nxt.launch is not None and nxt.launch.pod_group == "job-g1" and not nxt.release
    assert nxt.status.attempt == 2 and nxt.status.history[0].cause is st.Cause.PREEMPTED


def test_a_failed_job_releases_its_group() -> None:
    fatal = {"r1": {"phase": ob.PodPhase.FAILED, "exit_code": 42, "finished": NOW - 1}}
    d = dc.decide(observation(status=admitted_status(), pods=pods(**fatal), queue=QUEUE))
    assert d.status.phase is st.Phase.FAILED and d.release == ("job-g1",)


def test_spares_under_a_queue_are_refused_naming_the_field_and_the_way_out() -> None:
    queue = queueing.Queue.of("job", {queueing.QUEUE_LABEL: "team-a"})
    assert queue is not None
    said = queueing.spares_refusal(queue, 2)
    assert "spec.spares=2" in said and queueing.QUEUE_LABEL in said and "team-a" in said
    assert "Remove spec.spares, or the queue label" in said
    assert queueing.spares_refusal(queue, 0) == ""
