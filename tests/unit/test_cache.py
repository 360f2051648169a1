"""The watch caches keep what a pass reads: a slimmed pod reads as the whole pod does, usage
follows phases, nodes reduce to their scheduling facts; and API calls are counted by verb."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from fsdp_operator.io import cache, kube, observe
from fsdp_operator.types import observed as ob
from tests import builders


def _live(pod: dict[str, Any], **status: Any) -> dict[str, Any]:
    """A worker pod as the API serves it once a kubelet ran it (with the noise we drop)."""
    pod = copy.deepcopy(pod)
    pod["metadata"].update(
        uid="p-uid",
        ownerReferences=[{"kind": "FSDPJob", "name": "llama", "uid": "j-uid", "controller": True}],
        managedFields=[{"manager": "kubelet", "fieldsV1": {"f:status": {}}}] * 20,
    )
    pod["spec"]["nodeName"] = "node-a"
    pod["status"] = {
        "phase": "Failed",
        "podIP": "10.244.1.7",
        "conditions": [
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "EvictionByEvictionAPI",
                "message": "x" * 200,
                "lastTransitionTime": "2026-12-01T10:00:00Z",
            },
            {"type": "PodScheduled", "status": "True"},
            {
                "type": "Ready",
                "status": "False",
                "reason": "PodFailed",
                "lastTransitionTime": "2026-12-01T10:00:05Z",
            },
            {"type": "ContainersReady", "status": "False", "reason": "PodFailed"},
        ],
        "containerStatuses": [
            {
                "name": "worker",
                "image": "img",
                "imageID": "sha256:" + "0" * 64,
                "state": {
                    "terminated": {
                        "exitCode": 137,
                        "reason": "OOMKilled",
                        "message": '{"cause": "oom"}',
                        "finishedAt": "2026-12-01T10:00:01Z",
                    }
                },
            },
        ],
        **status,
    }
    return pod


def test_a_slim_pod_reads_as_the_whole_pod_and_is_much_smaller() -> None:
    full = _live(builders.typical_pod())
    slim = cache.slim_pod(full)
    assert observe.pod_view(slim) == observe.pod_view(full)
    view = observe.pod_view(slim)
    assert view is not None and view.exit_code == 137 and view.disrupted and view.ip
    assert view.ready is False and view.ready_changed == observe.ts("2026-12-01T10:00:05Z")
    assert cache.pod_requests(slim) == cache.pod_requests(full) != {}
    assert len(repr(slim)) < len(repr(full)) / 3
    kept = [c["type"] for c in slim["status"]["conditions"]]
    assert kept == ["DisruptionTarget", "PodScheduled", "Ready"]  # Ready: rank 0's progress probe


def test_a_slim_running_pod_keeps_no_container_state_and_a_waiting_one_its_reason() -> None:
    running = _live(builders.typical_pod(), phase="Running")
    running["status"]["containerStatuses"][0]["state"] = {"running": {"startedAt": "2026-12-01"}}
    slim = cache.slim_pod(running)
    assert slim["status"]["containerStatuses"] == []
    assert observe.pod_view(slim) == observe.pod_view(running)
    waiting = _live(builders.typical_pod(), phase="Pending")
    waiting["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ErrImagePull"}}
    view = observe.pod_view(cache.slim_pod(waiting))
    assert view == observe.pod_view(waiting)
    assert view is not None and view.image_error == "ErrImagePull"


def test_usage_is_held_only_by_bound_pods_that_have_not_finished_and_kept_per_node() -> None:
    pod = _live(builders.typical_pod(), phase="Running")
    node, uid, requests = cache.usage(pod) or ("", "", {})
    assert (node, uid) == ("node-a", "p-uid") and requests["nvidia.com/gpu"] == 8
    assert cache.usage(_live(builders.typical_pod(), phase="Succeeded")) is None
    unbound = _live(builders.typical_pod(), phase="Pending")
    unbound["spec"].pop("nodeName")
    assert cache.usage(unbound) is None
    kept = cache.Usage()
    kept.put("p-uid", ("node-a", requests))
    kept.put("other", ("node-a", {"nvidia.com/gpu": 2.0}))
    before = kept.totals()
    assert before["node-a"]["nvidia.com/gpu"] == 10
    assert kept.totals() is before  # one copy for every pass until something changes
    # the job's own pod frees its room; the copy a pass holds does not change under it
    assert cache.without(before, [pod])["node-a"]["nvidia.com/gpu"] == 2
    kept.put("p-uid", None)  # gone (DELETED) or finished
    kept.put("other", ("node-a", {"nvidia.com/gpu": 2.0}))  # a repeat changes nothing
    assert kept.totals() == {"node-a": {"nvidia.com/gpu": 2.0}} and len(kept) == 1
    assert kept.totals() is not before
    assert before["node-a"]["nvidia.com/gpu"] == 10
    kept.put("other", None)
    assert kept.totals() == {}


def test_nodes_reduce_to_readiness_and_room() -> None:
    node = {
        "metadata": {"name": "n1", "labels": {"gpu": "h100"}},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}], "unschedulable": True},
        "status": {
            "allocatable": {"nvidia.com/gpu": "8", "cpu": "128", "memory": "1Ti"},
            "conditions": [
                {"type": "Ready", "status": "False", "lastTransitionTime": "2026-12-01T10:00:00Z"}
            ],
        },
    }
    record = observe.node_record(node)
    assert not record.ready and not record.schedulable and record.not_ready_since
    assert record.allocatable == {"nvidia.com/gpu": 8.0, "cpu": 128.0, "memory": 2.0**40}
    spec = builders.typical_spec()  # selects gpu=h100, tolerates the gpu taint
    (free,) = observe.node_views([record], spec=spec, used={})
    (full,) = observe.node_views([record], spec=spec, used={"n1": {"nvidia.com/gpu": 1.0}})
    assert free.fits and not full.fits  # the job asks for 8 GPUs per pod
    assert observe.node_record(node) == record  # a heartbeat-only change compares equal


@pytest.mark.parametrize(
    ("path", "method", "want"),
    [
        ("/api/v1/namespaces/{namespace}/pods", "GET", ("list", "pods")),
        ("/api/v1/namespaces/{namespace}/pods", "POST", ("create", "pods")),
        ("/api/v1/namespaces/{namespace}/pods/{name}", "GET", ("get", "pods")),
        ("/api/v1/namespaces/{namespace}/pods/{name}", "DELETE", ("delete", "pods")),
        (
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}/status",
            "PATCH",
            ("patch", "fsdpjobs/status"),
        ),
        (
            "/apis/{group}/{version}/namespaces/{namespace}/{plural}/{name}",
            "GET",
            ("get", "fsdpjobs"),
        ),
        ("/api/v1/nodes", "GET", ("list", "nodes")),
    ],
)
def test_requests_are_counted_by_verb_and_resource(
    path: str, method: str, want: tuple[str, str]
) -> None:
    params = {"plural": "fsdpjobs", "namespace": "team-a", "name": "llama"}
    assert kube.request_kind(path, method, params) == want


def test_a_slim_unschedulable_pod_keeps_the_schedulers_reason() -> None:
    why = (
        '0/3 nodes are available: persistentvolumeclaim "ckpt" not found. preemption: ' + "x" * 2000
    )
    pending = _live(builders.typical_pod(), phase="Pending")
    pending["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": why}
    ]
    pending["spec"].pop("nodeName")
    view = observe.pod_view(cache.slim_pod(pending))
    assert view == observe.pod_view(pending)
    assert view is not None and view.unschedulable
    assert view.scheduler_message == why[: ob.SCHEDULER_MESSAGE_LIMIT]
    scheduled = observe.pod_view(cache.slim_pod(_live(builders.typical_pod())))
    assert scheduled is not None and scheduled.scheduler_message == ""
