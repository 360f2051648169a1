"""kube.py against a fake API server: what it sends, and what it makes of each answer."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import kubernetes
import pytest
import urllib3
from kubernetes.client.exceptions import ApiException

from fsdp_operator.io import kube, metrics, observe
from fsdp_operator.types import api, names, observed
from tests import fakeapi

PODS = "/api/v1/namespaces/ns/pods"
POD = f"{PODS}/job-0"
SERVICES = "/api/v1/namespaces/ns/services"
JOB = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/ns/{api.PLURAL}/job"
EVENTS = "/api/v1/namespaces/ns/events"
AN_EVENT = re.compile(r"/api/v1/namespaces/ns/events/[^/]+")
JOB_REF = names.JobRef(name="job", namespace="ns", uid="u1")


def pod(controller: str = "u1") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "job-0",
            "namespace": "ns",
            "uid": f"pod-of-{controller}",
            "ownerReferences": [
                {
                    "apiVersion": f"{api.GROUP}/{api.VERSION}",
                    "kind": api.KIND,
                    "name": "job",
                    "uid": controller,
                    "controller": True,
                }
            ],
        },
        "spec": {"containers": [{"name": "worker", "image": "worker:1"}]},
    }


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "job", "namespace": "ns"},
        "spec": {"clusterIP": "None"},
    }


def counter_value(counter: Any, **labels: str) -> float:
    for family in counter.collect():
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels == labels:
                return float(sample.value)
    return 0.0


# --- create -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("held_by", "expected"),
    [
        pytest.param(
            pod(controller="other"), pod(controller="other"), id="409-held-by-another-job"
        ),
        pytest.param(pod(controller="u1"), pod(controller="u1"), id="409-held-by-this-job"),
        pytest.param(fakeapi.status(404, "gone"), {}, id="409-then-gone-before-the-read"),
    ],
)
def test_a_taken_name_returns_what_holds_it(
    fake_api: fakeapi.FakeAPI, api_client: Any, held_by: Any, expected: dict[str, Any]
) -> None:
    fake_api[f"post {PODS}"] << fakeapi.status(409, 'pods "job-0" already exists')
    fake_api[f"get {POD}"] << held_by
    found = kube.Kube(api_client).create(pod())
    assert found == ({**expected, "kind": "Pod"} if expected else {})
    assert fake_api.log() == [f"POST {PODS}", f"GET {POD}"]


def test_a_created_pod_is_sent_as_given(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    fake_api[f"post {PODS}"] << 201 << pod()
    assert kube.Kube(api_client).create(pod()) is None
    assert fake_api.requests[0].data == pod()


def test_a_service_that_exists_is_read_back(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    fake_api[f"post {SERVICES}"] << fakeapi.status(409, 'services "job" already exists')
    fake_api[f"get {SERVICES}/job"] << service()
    assert kube.Kube(api_client).create(service()) == service()


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param(500, "etcdserver: request timed out", id="500"),
        pytest.param(403, 'pods "job-0" is forbidden: exceeded quota: gpus', id="403-quota"),
        pytest.param(422, 'Pod "job-0" is invalid: spec.containers: Required value', id="422"),
    ],
)
def test_a_refused_create_raises_with_the_servers_message(
    fake_api: fakeapi.FakeAPI, api_client: Any, code: int, message: str
) -> None:
    fake_api[f"post {PODS}"] << fakeapi.status(code, message)
    with pytest.raises(ApiException) as raised:
        kube.Kube(api_client).create(pod())
    assert raised.value.status == code
    assert kube.describe_error(raised.value) == f"API error {code}: {message}"
    assert fake_api.log() == [f"POST {PODS}"]  # no read-back: only a 409 means "exists"


# --- the FSDPJob --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param({"metadata": {"name": "job"}}, {"metadata": {"name": "job"}}, id="found"),
        pytest.param(fakeapi.status(404, "not found"), None, id="404-is-none"),
    ],
)
def test_get_job(
    fake_api: fakeapi.FakeAPI, api_client: Any, answer: Any, expected: dict[str, Any] | None
) -> None:
    fake_api[f"get {JOB}"] << answer
    assert kube.Kube(api_client).get_job("ns", "job") == expected


def test_get_job_raises_what_is_not_a_404(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    fake_api[f"get {JOB}"] << fakeapi.status(403, "forbidden")
    with pytest.raises(ApiException, match="403"):
        kube.Kube(api_client).get_job("ns", "job")


CLAIM = "/api/v1/namespaces/ns/persistentvolumeclaims/ckpt"
RWO = {"metadata": {"name": "ckpt"}, "spec": {"accessModes": ["ReadWriteOnce"]}}


@pytest.mark.parametrize(
    ("answer", "view"),
    [
        pytest.param(RWO, observed.ClaimView("ckpt", True, ("ReadWriteOnce",)), id="found"),
        pytest.param(fakeapi.status(404, "not found"), observed.ClaimView("ckpt", False), id="404"),
        pytest.param(fakeapi.status(403, "forbidden"), None, id="403-is-not-known"),
    ],
)
def test_a_claim_reads_as_its_access_modes_missing_or_not_known(
    fake_api: fakeapi.FakeAPI, api_client: Any, answer: Any, view: observed.ClaimView | None
) -> None:
    fake_api[f"get {CLAIM}"] << answer
    assert observe.claim_view("ckpt", kube.Kube(api_client).get_claim("ns", "ckpt")) == view


def test_patch_status_sends_one_merge_patch_and_returns_the_resource_version(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    fake_api[f"patch {JOB}/status"] << {"metadata": {"name": "job", "resourceVersion": "42"}}
    status = {"phase": "Running", "message": None}
    assert kube.Kube(api_client).patch_status("ns", "job", status) == "42"
    [sent] = fake_api.requests
    assert (sent.method.value, sent.url.path) == ("PATCH", f"{JOB}/status")
    assert sent.headers["Content-Type"] == "application/merge-patch+json"
    assert sent.data == {"status": {"phase": "Running", "message": None}}  # None clears a field


# --- deletes ------------------------------------------------------------------------------------
def delete_pod(k: kube.Kube) -> None:
    k.delete_pod("ns", "job-0", grace=0)


def delete_job(k: kube.Kube) -> None:
    k.delete_job("ns", "job")


DELETES = [
    pytest.param(delete_pod, POD, {"gracePeriodSeconds": "0"}, id="pod"),
    pytest.param(delete_job, JOB, {"propagationPolicy": "Background"}, id="job"),
]


@pytest.mark.parametrize(("delete", "path", "params"), DELETES)
@pytest.mark.parametrize(
    "answer",
    [pytest.param(pod(), id="deleted"), pytest.param(fakeapi.status(404, "gone"), id="404-gone")],
)
def test_deleting_what_is_gone_is_not_an_error(
    fake_api: fakeapi.FakeAPI,
    api_client: Any,
    delete: Callable[[kube.Kube], None],
    path: str,
    params: dict[str, str],
    answer: Any,
) -> None:
    fake_api[f"delete {path}"] << answer
    delete(kube.Kube(api_client))
    [sent] = fake_api.requests
    assert sent.url.path == path
    assert sent.params == params


@pytest.mark.parametrize(("delete", "path", "params"), DELETES)
def test_a_failed_delete_raises(
    fake_api: fakeapi.FakeAPI,
    api_client: Any,
    delete: Callable[[kube.Kube], None],
    path: str,
    params: dict[str, str],
) -> None:
    fake_api[f"delete {path}"] << fakeapi.status(500, "etcdserver: leader changed")
    with pytest.raises(ApiException) as raised:
        delete(kube.Kube(api_client))
    assert raised.value.status == 500


# --- dry run ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        pytest.param(pod(), None, id="admitted"),
        pytest.param(fakeapi.status(409, "already exists"), None, id="409-only-the-name-taken"),
        pytest.param(
            fakeapi.status(403, 'pods "job-0" is forbidden: exceeded quota: gpus'),
            (403, 'pods "job-0" is forbidden: exceeded quota: gpus'),
            id="403-with-message",
        ),
        pytest.param(
            fakeapi.status(400, "admission webhook denied: no GPUs"),
            (400, "admission webhook denied: no GPUs"),
            id="400-webhook",
        ),
    ],
)
def test_dry_run_pod(
    fake_api: fakeapi.FakeAPI, api_client: Any, answer: Any, expected: tuple[int, str] | None
) -> None:
    fake_api[f"post {PODS}"] << answer
    assert kube.Kube(api_client).dry_run_pod(pod()) == expected
    [sent] = fake_api.requests
    assert sent.params == {"dryRun": "All"}


def test_a_dry_run_refused_without_a_status_body_gives_the_reason(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    fake_api[f"post {PODS}"] << 502 << b"<html>bad gateway</html>"
    assert kube.Kube(api_client).dry_run_pod(pod()) == (502, "Bad Gateway")


# --- events -------------------------------------------------------------------------------------
def patched_event(request: Any) -> dict[str, Any]:
    """The Event as the API server returns it after a merge patch of its count."""
    name = request.url.path.rsplit("/", 1)[-1]
    return {"metadata": {"name": name}, "involvedObject": {"uid": "u1"}, **request.data}


def warn(k: kube.Kube, message: str = "pod job-0 failed") -> None:
    k.event(JOB_REF, type_="Warning", reason="PodFailed", message=message)


def test_a_first_event_is_posted(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    fake_api[f"post {EVENTS}"] << 201 << fakeapi.echo
    warn(kube.Kube(api_client))
    [sent] = fake_api.requests
    assert sent.url.path == EVENTS
    assert sent.data["involvedObject"] == {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "name": "job",
        "namespace": "ns",
        "uid": "u1",
    }
    assert (sent.data["type"], sent.data["reason"], sent.data["count"]) == (
        "Warning",
        "PodFailed",
        1,
    )
    assert sent.data["metadata"]["name"].startswith("job.")


def test_the_same_event_again_raises_its_count(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    fake_api[f"post {EVENTS}"] << 201 << fakeapi.echo
    fake_api["patch", AN_EVENT] << patched_event
    k = kube.Kube(api_client)
    warn(k)
    warn(k)
    warn(k)
    posted, *patches = fake_api.requests
    assert [p.url.path for p in patches] == [f"{EVENTS}/{posted.data['metadata']['name']}"] * 2
    assert [p.data["count"] for p in patches] == [2, 3]


def test_another_message_is_another_event(fake_api: fakeapi.FakeAPI, api_client: Any) -> None:
    fake_api[f"post {EVENTS}"] << 201 << fakeapi.echo
    k = kube.Kube(api_client)
    warn(k, "pod job-0 failed")
    warn(k, "pod job-1 failed")
    assert fake_api.log() == [f"POST {EVENTS}"] * 2


def test_after_the_series_window_the_same_event_is_posted_anew(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    fake_api[f"post {EVENTS}"] << 201 << fakeapi.echo
    k = kube.Kube(api_client)
    k.EVENT_SERIES_SECONDS = 0.0
    warn(k)
    warn(k)
    assert fake_api.log() == [f"POST {EVENTS}"] * 2


def test_an_event_gone_before_its_patch_is_posted_anew(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    fake_api[f"post {EVENTS}"] << 201 << fakeapi.echo
    fake_api.answer(("patch", AN_EVENT), fakeapi.status(404, "not found"), patched_event)
    k = kube.Kube(api_client)
    warn(k)
    warn(k)  # its TTL passed: a new one, counting from 1
    warn(k)  # and the series goes on from the new one
    first, _, second, patch = fake_api.requests
    assert [r.method.value for r in fake_api.requests] == ["POST", "PATCH", "POST", "PATCH"]
    assert second.data["count"] == 1
    assert second.data["metadata"]["name"] != first.data["metadata"]["name"]
    assert patch.url.path == f"{EVENTS}/{second.data['metadata']['name']}"
    assert patch.data["count"] == 2


@pytest.mark.parametrize(
    ("post", "patch", "sent"),
    [
        pytest.param(fakeapi.status(500, "internal"), None, ["POST", "POST"], id="post-500"),
        pytest.param(fakeapi.status(403, "forbidden"), None, ["POST", "POST"], id="post-403"),
        pytest.param(
            fakeapi.echo, fakeapi.status(500, "internal"), ["POST", "PATCH"], id="patch-500"
        ),
    ],
)
def test_an_event_the_api_refuses_never_fails_the_caller(
    fake_api: fakeapi.FakeAPI, api_client: Any, post: Any, patch: Any, sent: list[str]
) -> None:
    fake_api[f"post {EVENTS}"] << post
    if patch is not None:
        fake_api["patch", AN_EVENT] << patch
    k = kube.Kube(api_client)
    warn(k)
    warn(k)  # an Event not posted is not remembered: the next one is a first again
    assert [r.method.value for r in fake_api.requests] == sent


# --- write fencing ------------------------------------------------------------------------------
WRITES = [
    pytest.param(lambda k: k.create(pod()), id="create-pod"),
    pytest.param(lambda k: k.create(service()), id="create-service"),
    pytest.param(lambda k: k.patch_status("ns", "job", {"phase": "Running"}), id="patch-status"),
    pytest.param(lambda k: k.delete_pod("ns", "job-0", grace=None), id="delete-pod"),
    pytest.param(lambda k: k.delete_job("ns", "job"), id="delete-job"),
    pytest.param(warn, id="event"),
]


@pytest.mark.parametrize("write", WRITES)
def test_a_replica_that_does_not_lead_sends_no_write(
    fake_api: fakeapi.FakeAPI, api_client: Any, write: Callable[[kube.Kube], object]
) -> None:
    fenced_before = counter_value(metrics.FENCED)
    with pytest.raises(kube.NotLeader):
        write(kube.Kube(api_client, write_window=lambda: 0.0))
    assert fake_api.requests == []
    assert counter_value(metrics.FENCED) == fenced_before + 1


def test_a_write_times_out_before_the_window_closes(
    fake_api: fakeapi.FakeAPI, api_client: Any
) -> None:
    """A write sent with 0.05 s of leadership left gives up then, not 30 s later."""
    fake_api[f"delete {POD}"] << (lambda: asyncio.sleep(0.3)) << {}
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        kube.Kube(api_client, write_window=lambda: 0.05).delete_pod("ns", "job-0", grace=0)


# --- request counting ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("script", "call", "counted"),
    [
        pytest.param(
            {f"post {PODS}": fakeapi.status(409, "exists"), f"get {POD}": pod()},
            lambda k: k.create(pod()),
            [("create", "pods"), ("get", "pods")],
            id="create-409-then-read",
        ),
        pytest.param(
            {f"patch {JOB}/status": {}},
            lambda k: k.patch_status("ns", "job", {}),
            [("patch", f"{api.PLURAL}/status")],
            id="patch-status",
        ),
        pytest.param(
            {f"delete {JOB}": fakeapi.status(404, "gone")},
            lambda k: k.delete_job("ns", "job"),
            [("delete", api.PLURAL)],
            id="delete-job-404",
        ),
        pytest.param(
            {f"get {JOB}": {}},
            lambda k: k.get_job("ns", "job"),
            [("get", api.PLURAL)],
            id="get-job",
        ),
        pytest.param({f"post {EVENTS}": fakeapi.echo}, warn, [("create", "events")], id="event"),
    ],
)
def test_every_request_is_counted_by_verb_and_resource(
    fake_api: fakeapi.FakeAPI,
    api_client: kubernetes.client.ApiClient,
    script: dict[str, Any],
    call: Callable[[kube.Kube], object],
    counted: list[tuple[str, str]],
) -> None:
    for criteria, answer in script.items():
        fake_api[criteria] << answer
    before = {c: counter_value(metrics.API_REQUESTS, verb=c[0], resource=c[1]) for c in counted}
    call(kube.Kube(api_client))
    after = {c: counter_value(metrics.API_REQUESTS, verb=c[0], resource=c[1]) for c in counted}
    assert {c: after[c] - before[c] for c in counted} == dict.fromkeys(counted, 1.0)
    assert len(fake_api.requests) == len(counted)
