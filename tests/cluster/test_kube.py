"""kube.Kube against the real API server: a repeated Event is one object with a count, every
request is counted by verb, and a replica that may not act sends no write at all."""

from __future__ import annotations

import uuid

import pytest

from fsdp_operator.io import kube, metrics
from fsdp_operator.types import names
from localcluster import controlplane

pytestmark = pytest.mark.cluster


@pytest.fixture
def client(cluster: controlplane.Cluster) -> kube.Kube:
    return kube.Kube(kube.load_client(str(cluster.kubeconfig)))


def _count(verb: str, resource: str) -> float:
    return metrics.API_REQUESTS.labels(verb, resource)._value.get()


def test_a_repeated_event_is_one_object_with_a_count(
    cluster: controlplane.Cluster, client: kube.Kube, kube_namespace: str
) -> None:
    job = names.JobRef(name="ev", namespace=kube_namespace, uid=str(uuid.uuid4()))
    created, patched = _count("create", "events"), _count("patch", "events")
    for _ in range(3):
        client.event(job, type_="Warning", reason="Waiting", message="no room for 4 pods")
    client.event(job, type_="Normal", reason="AttemptStarted", message="attempt 1")
    items = cluster.get_json("events", "-n", kube_namespace)["items"]
    counts = sorted((e["reason"], e["count"]) for e in items)
    assert counts == [("AttemptStarted", 1), ("Waiting", 3)]
    assert (_count("create", "events") - created, _count("patch", "events") - patched) == (2, 2)


def test_a_replica_that_may_not_act_sends_no_write(
    cluster: controlplane.Cluster, kube_namespace: str
) -> None:
    fenced = kube.Kube(kube.load_client(str(cluster.kubeconfig)), write_window=lambda: 0.0)
    before = metrics.FENCED._value.get()
    sent = _count("delete", "pods")
    with pytest.raises(kube.NotLeader):
        fenced.delete_pod(kube_namespace, "anything", grace=0)
    assert fenced.get("Pod", kube_namespace, "anything") is None  # reads still work
    assert metrics.FENCED._value.get() == before + 1 and _count("delete", "pods") == sent
