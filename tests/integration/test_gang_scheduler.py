"""FSDPJobs gang-placed by a real gang scheduler: scheduler-plugins' kube-scheduler (v0.33.5,
built from its Go module) with its Coscheduling plugin, run as a second scheduler beside the
local cluster's own (localcluster/schedulerplugins.py).

A job with `spec.gangScheduling: {kind: Coscheduling}` gets one PodGroup per attempt (minMember:
the attempt's pods), its pods the group's label and the scheduler's name; a gang that cannot fit
whole is placed not at all (no pod holds a node while the rest wait), and once the operator
shrinks it the smaller attempt's PodGroup replaces the first. Volcano is not built here (its
module is not served to this machine): its PodGroup is rendered and unit-tested only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from localcluster import controlplane, poll, procs
from localcluster import schedulerplugins as lsp
from tests.integration import harness

# The module's first test may wait for the scheduler's build (minutes, niced, on a fresh cache).
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
PODGROUPS = "podgroups.scheduling.x-k8s.io"


@pytest.fixture(scope="module")
def coscheduler(cluster: controlplane.Cluster) -> Iterator[lsp.SchedulerPlugins]:
    scheduler = lsp.SchedulerPlugins(cluster)
    scheduler.start()
    try:
        yield scheduler
    finally:
        scheduler.stop()


def _gang_job(name: str, **spec: Any) -> dict[str, Any]:
    return harness.job_doc(
        name, gangScheduling={"kind": "Coscheduling", "scheduleTimeoutSeconds": 10}, **spec
    )


def _pod_groups(jobs: harness.Jobs, name: str) -> dict[str, dict[str, Any]]:
    """The job's PodGroups by name."""
    found = jobs.cluster.get_json(PODGROUPS, "-n", jobs.ns, "-l", f"fsdpoperator.io/job={name}")
    return {g["metadata"]["name"]: g for g in found["items"]}


def _context(jobs: harness.Jobs, scheduler: lsp.SchedulerPlugins, name: str) -> str:
    groups = {n: g.get("spec") for n, g in _pod_groups(jobs, name).items()}
    return (
        f"{jobs.diagnosis(name)}\npod groups: {json.dumps(groups)}\n"
        f"scheduler-plugins log:\n{procs.tail(scheduler.log, 30)}"
    )


def _attempt_pods(jobs: harness.Jobs, name: str, attempt: int) -> list[dict[str, Any]]:
    return [
        p
        for p in jobs.pods(name)
        if p["metadata"]["labels"].get("fsdpoperator.io/attempt") == str(attempt)
        and "fsdpoperator.io/spare" not in p["metadata"]["labels"]
    ]


def _placed(jobs: harness.Jobs, name: str, attempt: int) -> list[dict[str, Any]]:
    """The attempt's pods bound to a node."""
    return [p for p in _attempt_pods(jobs, name, attempt) if p["spec"].get("nodeName")]


def _succeeded(jobs: harness.Jobs, scheduler: lsp.SchedulerPlugins, name: str) -> None:
    poll.until(
        f"{name} Succeeded",
        lambda: jobs.status(name).get("phase") == "Succeeded",
        timeout=240,
        diagnosis=lambda: _context(jobs, scheduler, name),
    )


def test_a_coscheduled_gang_gets_its_podgroup_and_trains(
    jobs: harness.Jobs, coscheduler: lsp.SchedulerPlugins
) -> None:
    name = harness.unique("gang")
    jobs.apply(_gang_job(name))

    def diagnosis() -> str:
        return _context(jobs, coscheduler, name)

    group = poll.until(
        f"{name}'s PodGroup",
        lambda: _pod_groups(jobs, name).get(f"{name}-g1"),
        timeout=60,
        diagnosis=diagnosis,
    )
    assert group["spec"]["minMember"] == 2, group
    assert group["spec"]["scheduleTimeoutSeconds"] == 10, group
    owner = group["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner.get("controller")) == ("FSDPJob", name, True)
    pods = poll.until(
        f"{name}'s 2 pods placed",
        lambda: len(placed := _placed(jobs, name, 1)) == 2 and placed,
        timeout=120,
        diagnosis=diagnosis,
    )
    for pod in pods:
        assert pod["metadata"]["labels"][POD_GROUP_LABEL] == f"{name}-g1"
        assert pod["spec"]["schedulerName"] == lsp.SCHEDULER_NAME
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    _succeeded(jobs, coscheduler, name)


def test_a_gang_that_cannot_fit_is_placed_not_at_all_then_shrinks_to_a_new_podgroup(
    jobs: harness.Jobs, coscheduler: lsp.SchedulerPlugins, cluster: controlplane.Cluster
) -> None:
    """One more pod than the cluster has nodes (one worker pod per node): the default
    scheduler would bind all but one of them and leave them idle; the gang scheduler binds
    none. After its pending timeout the operator shrinks the job: the new attempt has a
    PodGroup of its own size, the first is deleted, and the smaller gang trains."""
    nodes = len(cluster.get_json("nodes")["items"])
    replicas = nodes + 1
    batch = 2 * replicas  # divisible by both sizes the job may run at: replicas and 2
    name = harness.unique("gang-wide")
    policy = {"pendingTimeoutSeconds": 20}
    training = {"steps": 30, "globalBatchSize": batch, "microBatchSize": 1}
    jobs.apply(
        _gang_job(name, replicas=replicas, minReplicas=2, training=training, failurePolicy=policy)
    )

    def diagnosis() -> str:
        return _context(jobs, coscheduler, name)

    first = f"{name}-g1"
    group = poll.until(
        f"{first}", lambda: _pod_groups(jobs, name).get(first), timeout=60, diagnosis=diagnosis
    )
    assert group["spec"]["minMember"] == replicas, group
    poll.until(
        f"{replicas} pods of attempt 1",
        lambda: len(_attempt_pods(jobs, name, 1)) == replicas,
        timeout=60,
        diagnosis=diagnosis,
    )
    # Longer than the plugin's permit wait (10 s): a partial placement would have been bound.
    watch_until = time.monotonic() + 15
    while time.monotonic() < watch_until and jobs.status(name).get("attempt") == 1:
        placed = [p["metadata"]["name"] for p in _placed(jobs, name, 1)]
        assert not placed, f"partly placed: {placed}\n{diagnosis()}"
        time.sleep(1)
    shrunk = poll.until(
        f"{name} restarted smaller",
        lambda: (s := jobs.status(name)).get("attempt", 1) >= 2 and s,
        timeout=120,
        diagnosis=diagnosis,
    )
    second = f"{name}-g{shrunk['attempt']}"
    groups = poll.until(
        f"{second} alone",
        lambda: set(g := _pod_groups(jobs, name)) == {second} and g,
        timeout=60,
        diagnosis=diagnosis,
    )
    assert groups[second]["spec"]["minMember"] == shrunk["replicas"] < replicas, groups
    _succeeded(jobs, coscheduler, name)
