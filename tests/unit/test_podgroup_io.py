"""io/podgroups.py against a fake API server: the job's PodGroups are read by its label, a
cluster without the scheduler's CRD is said in words a user can act on, a name already held
returns its holder, and a delete of one gone already is no error."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from fsdp_operator.io import kube, podgroups
from fsdp_operator.types import names, spec_gang
from tests import fakeapi

NS = "team-a"
JOB = names.JobRef(name="llama", namespace=NS, uid="uid-llama")
COSCHEDULING = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{NS}/podgroups"
VOLCANO = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{NS}/podgroups"
NOT_FOUND = fakeapi.status(404, "the server could not find the requested resource")


def groups(api_client: Any, kind: spec_gang.GangKind) -> podgroups.PodGroups:
    return podgroups.PodGroups(kube.Kube(api_client), kind)


def body(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"minMember": 2},
    }


def test_the_jobs_podgroups_are_listed_by_its_label(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    fake_api[f"get {VOLCANO}"] << {"items": [body("llama-g1")]}
    found = groups(api_client, spec_gang.GangKind.VOLCANO).of_job(JOB)
    assert [g["metadata"]["name"] for g in found] == ["llama-g1"]
    (request,) = fake_api["get"]
    assert request.params["labelSelector"] == f"{names.Label.JOB.value}=llama"


@pytest.mark.parametrize("kind", list(spec_gang.GangKind))
def test_a_cluster_without_the_crd_says_what_to_install(
    fake_api: fakeapi.FakeAPI, api_client: Any, kind: spec_gang.GangKind
) -> None:
    path = COSCHEDULING if kind is spec_gang.GangKind.COSCHEDULING else VOLCANO
    fake_api[f"get {path}"] << NOT_FOUND
    fake_api[f"post {path}"] << NOT_FOUND
    made = groups(api_client, kind)
    api_version = spec_gang.API[kind].api_version
    said = rf"spec\.gangScheduling\.kind={kind}: the cluster serves no PodGroup {api_version}"
    with pytest.raises(podgroups.MissingApi, match=said):
        made.of_job(JOB)
    with pytest.raises(podgroups.MissingApi, match="install .*or remove spec.gangScheduling"):
        made.create(body("llama-g1"))


def test_a_name_already_held_returns_its_holder(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    held = {**body("llama-g1"), "metadata": {"name": "llama-g1", "ownerReferences": []}}
    fake_api[f"post {COSCHEDULING}"] << fakeapi.status(409, "exists")
    fake_api[f"get {COSCHEDULING}/llama-g1"] << held
    made = groups(api_client, spec_gang.GangKind.COSCHEDULING)
    assert made.create(body("llama-g1")) == held


def test_a_create_other_errors_and_a_delete_of_one_gone(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    fake_api[f"post {COSCHEDULING}"] << fakeapi.status(403, "forbidden")
    fake_api[f"delete {COSCHEDULING}/llama-g1"] << NOT_FOUND
    made = groups(api_client, spec_gang.GangKind.COSCHEDULING)
    with pytest.raises(ApiException) as raised:
        made.create(body("llama-g2"))
    assert raised.value.status == 403
    made.delete(NS, "llama-g1")  # gone already: nothing
