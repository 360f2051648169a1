"""The team's sidecars are never ranks: a sidecar's crash, OOM kill or exit leaves the rank's
pod running and the attempt alone (told in a condition and an Event); only the worker
container's own state fails a rank, and a plain init container's failure is blamed by name.

Read from the pod as the API server reports it (observe.pod_view, through the cache's slim
copy), then decided (decide.decide). No cluster, no clock.
"""

from __future__ import annotations

import copy
from typing import Any

from fsdp_operator.io import cache, observe
from fsdp_operator.policy import decide, sidecars
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from tests import builders
from tests.builders import NOW, condition, pods

SIDECAR = {"name": "log-shipper", "image": "fluent/fluent-bit:3", "restartPolicy": "Always"}
PREP = {"name": "prepare-data", "image": "busybox:1"}


def _pod(phase: str, *, worker: dict[str, Any], inits: list[dict[str, Any]]) -> dict[str, Any]:
    """Rank 1's rendered pod with a sidecar and an init container, as the kubelet reports it."""
    spec = builders.typical_spec(template__spec__initContainers=[PREP, SIDECAR])
    pod = copy.deepcopy(builders.typical_pod(spec))
    pod["spec"]["nodeName"] = "node-a"
    pod["status"] = {
        "phase": phase,
        "initContainerStatuses": inits,
        "containerStatuses": [{"name": "worker", "restartCount": 0, "state": worker}],
    }
    return pod


def _crashed_sidecar(reason: str = "OOMKilled", code: int = 137) -> dict[str, Any]:
    return {
        "name": "log-shipper",
        "restartCount": 3,
        "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}},
        "lastState": {"terminated": {"reason": reason, "exitCode": code}},
    }


PREPARED = {"name": "prepare-data", "state": {"terminated": {"reason": "Completed", "exitCode": 0}}}
RUNNING = {"running": {"startedAt": "2026-12-01T10:00:00Z"}}


def _view(pod: dict[str, Any]) -> ob.PodView:
    view = observe.pod_view(pod)
    assert view is not None and view == observe.pod_view(cache.slim_pod(pod))
    return view


def test_a_crashed_sidecar_beside_a_running_worker_is_no_failure_but_is_told() -> None:
    view = _view(_pod("Running", worker=RUNNING, inits=[PREPARED, _crashed_sidecar()]))
    assert view.phase is ob.PodPhase.RUNNING and view.exit_code is None and view.reason == ""
    assert view.sidecars == (ob.SidecarView("log-shipper", 3, "OOMKilled", 137),)
    over = {"sidecars": view.sidecars}
    d = decide.decide(builders.observe(pods=pods(r1=over)))
    assert d.failure is None and d.status.last_failure is None and not d.delete
    told = condition(d, sidecars.SIDECARS)
    assert told is not None and told.status == "True"
    assert "sidecar log-shipper of pod job-a1-1 (node rank 1) OOMKilled (exit 137)" in told.message
    assert [e.type for e in d.events if e.reason == "SidecarRestarted"] == ["Warning"]
    # the next pass, nothing new: no second Event
    again = decide.decide(builders.observe(pods=pods(r1=over), status=d.status))
    assert "SidecarRestarted" not in [e.reason for e in again.events]


def test_a_failed_worker_is_blamed_whatever_its_sidecar_did() -> None:
    worker = {
        "terminated": {"reason": "Error", "exitCode": 1, "finishedAt": "2026-12-01T10:00:09Z"}
    }
    view = _view(_pod("Failed", worker=worker, inits=[PREPARED, _crashed_sidecar("Error", 2)]))
    assert view.exit_code == 1 and view.reason == "Error"
    d = decide.decide(builders.observe(pods=pods(r1={**_fields(view), "finished": NOW - 1})))
    assert d.failure is not None and d.failure.cause is st.Cause.CRASH
    assert d.failure.pod == "job-a1-1" and d.failure.exit_code == 1


def test_a_failed_init_container_is_named_in_the_failure() -> None:
    prep = {"name": "prepare-data", "state": {"terminated": {"reason": "Error", "exitCode": 3}}}
    view = _view(_pod("Failed", worker={"waiting": {"reason": "PodInitializing"}}, inits=[prep]))
    assert view.exit_code is None and view.reason == "Init:Error"
    d = decide.decide(builders.observe(pods=pods(r1={**_fields(view), "finished": NOW - 1})))
    assert d.failure is not None and d.failure.pod == "job-a1-1"
    assert "init container prepare-data failed: Error (exit 3)" in d.failure.message


def _fields(view: ob.PodView) -> dict[str, Any]:
    return {
        "phase": view.phase,
        "exit_code": view.exit_code,
        "reason": view.reason,
        "message": view.message,
    }
