"""reconcile.Reconciler against a fake API server: the order of a pass's writes, and what a user
sees when a pass is cut short, when someone else holds a name the job needs, or when the API
server refuses every create.

The fake server keeps the job and what the passes create (`Cluster`), as an API server would:
a second create of a name is a 409, a read of a free name a 404, a status patch is merged into
the job, so the next pass reads what the last one wrote. Time is the Reconciler's injected clock.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import kmock
import pytest
from kubernetes.client.exceptions import ApiException

from fsdp_operator.io import cache, gang, kube, observe, podgroups
from fsdp_operator.policy import decide
from fsdp_operator.render import templates
from fsdp_operator.run import reconcile, settings
from fsdp_operator.types import api, names, observed, status
from fsdp_worker import contract
from fsdp_worker.contract import gangwire, keeper
from tests import fakeapi

NOW = 1_750_000_000.0
NS, NAME, UID = "ns", "tiny", "uid-tiny"
JOB_REF = names.JobRef(name=NAME, namespace=NS, uid=UID)
JOB = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{NS}/{api.PLURAL}/{NAME}"
PODS = f"/api/v1/namespaces/{NS}/pods"
SERVICES = f"/api/v1/namespaces/{NS}/services"
NETPOLS = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies"
EVENTS = f"/api/v1/namespaces/{NS}/events"
CONFIGMAPS = f"/api/v1/namespaces/{NS}/configmaps"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"
SERVICE = names.service_name(NAME)
GRACE_ON_FAILURE = settings.Settings().tunables.failure_grace_seconds
TERMINATING = "unable to create new content in namespace ns because it is being terminated"


# --- builders -----------------------------------------------------------------------------------
def job_spec(replicas: int = 2) -> dict[str, Any]:
    """examples/tiny-cpu.yaml's spec, with `replicas` pods."""
    return {
        "replicas": replicas,
        "minReplicas": 1,
        "nprocPerNode": 2,
        "image": "ghcr.io/example/fsdp-worker:0.1.0",
        "resources": {"requests": {"cpu": "1", "memory": "2Gi"}},
        "training": {
            "model": {"preset": "tiny", "vocabSize": 256, "seqLen": 32},
            "data": {"kind": "synthetic", "seed": 1},
            "steps": 200,
            "globalBatchSize": 16,
            "microBatchSize": 2,
            "optimizer": {"lr": 0.001},
            "scheduler": {"kind": "cosine", "warmupSteps": 10},
            "seed": 7,
        },
        "checkpoint": {"root": "/ckpt", "claimName": "ckpt", "intervalSteps": 20, "keep": 3},
        "failurePolicy": {
            "maxRestarts": 5,
            "backoff": {"initialSeconds": 1, "maxSeconds": 30},
            "nodeLossGraceSeconds": 10,
            "progressDeadlineSeconds": 120,
            "pendingTimeoutSeconds": 30,
        },
    }


def job_body(replicas: int = 2, job_status: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "metadata": {
            "name": NAME,
            "namespace": NS,
            "uid": UID,
            "generation": 1,
            "resourceVersion": "1",
            "creationTimestamp": decide.stamp(NOW - 5),
        },
        "spec": job_spec(replicas),
    }
    if job_status is not None:
        body["status"] = job_status
    return body


def dumped(job_status: status.FSDPJobStatus) -> dict[str, Any]:
    return job_status.model_dump(mode="json", by_alias=True)


def launched_status(replicas: int = 2) -> dict[str, Any]:
    """The status a new job's first pass writes (attempt 1, its pods not yet seen), from
    decide() itself."""
    obs = observed.Observed(
        spec=api.FSDPJobSpec.model_validate(job_spec(replicas)),
        status=status.FSDPJobStatus(),
        generation=1,
        now=NOW - 60,
        validated_generation=1,
    )
    return dumped(decide.decide(obs).status)


def running_status(replicas: int = 2) -> dict[str, Any]:
    """Attempt 1 running with every pod seen."""
    started = NOW - 600
    return dumped(
        status.FSDPJobStatus(
            phase=status.Phase.RUNNING,
            attempt=1,
            replicas=replicas,
            world_size=replicas * 2,
            pods_created=True,
            started=started,
            attempt_started=started,
            observed_generation=1,
            validated_generation=1,
            history=[status.HistoryEntry(attempt=1, started=started, world_size=replicas * 2)],
        )
    )


def worker_pods(replicas: int, *, attempt: int, failed: int | None = None) -> list[dict[str, Any]]:
    """Attempt `attempt`'s pods as the API server holds them once scheduled: running, but rank
    `failed` exited 1."""
    spec = api.FSDPJobSpec.model_validate(job_spec(replicas))
    launch = decide.Launch(attempt=attempt, replicas=replicas, resume_path="")
    pods = templates.worker_pods(JOB_REF, spec, launch)
    for rank, pod in enumerate(pods):
        pod["metadata"]["uid"] = f"pod-{rank}"
        pod["spec"]["nodeName"] = f"node-{rank}"
        pod["status"] = {"phase": "Running", "podIP": f"10.0.0.{rank + 1}"}
        if rank == failed:
            ended = {"exitCode": 1, "reason": "Error", "finishedAt": decide.stamp(NOW - 1)}
            exited = {
                "name": names.CONTAINER_NAME,
                "image": pod["spec"]["containers"][0]["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"terminated": ended},
            }
            pod["status"] = {"phase": "Failed", "containerStatuses": [exited]}
    return pods


def foreign(kind: str, name: str, owner: dict[str, Any] | None) -> dict[str, Any]:
    """A Pod or Service with one of the job's names that the job does not control."""
    meta: dict[str, Any] = {"name": name, "namespace": NS, "uid": f"foreign-{name}"}
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    spec = {"containers": [{"name": "app", "image": "busybox"}]} if kind == "Pod" else {}
    return {"apiVersion": "v1", "kind": kind, "metadata": meta, "spec": spec}


ANOTHER_JOB = {
    "apiVersion": f"{api.GROUP}/{api.VERSION}",
    "kind": api.KIND,
    "name": "other",
    "uid": "uid-other",
}
EARLIER_JOB = {**ANOTHER_JOB, "name": NAME, "uid": "uid-of-a-deleted-tiny"}
NODES = [
    cache.NodeRecord(
        name=f"node-{i}",
        ready=True,
        not_ready_since=None,
        schedulable=True,
        labels={},
        taints=(),
        allocatable={"cpu": 8.0, "memory": 64.0 * 2**30},
    )
    for i in range(4)
]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a merge patch (None deletes, lists are replaced)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


Refusal = Callable[[str, str], kmock.Response | None]


class Cluster:
    """The API server's side: the FSDPJob, and the Pods and Services stored by name.

    `refuse(kind, name)` may answer a create instead of the store (an error injected); a dry
    run is admitted and stores nothing. `created` lists the names whose create succeeded.
    """

    def __init__(self, fake_api: fakeapi.FakeAPI, job: dict[str, Any]) -> None:
        self.job = job
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.created: list[str] = []
        self.refuse: Refusal = lambda kind, name: None
        self.dry_run: kmock.Response | None = None  # a dry run's answer; None: admitted
        fake_api[f"get {JOB}"] << (lambda: ok(copy.deepcopy(self.job)))
        fake_api[f"patch {JOB}/status"] << self._patch_status
        for kind, path in (("Pod", PODS), ("Service", SERVICES), ("NetworkPolicy", NETPOLS)):
            fake_api[f"post {path}"] << (lambda request, kind=kind: self._create(kind, request))
            one = re.compile(f"{path}/[^/]+")
            fake_api["get", one] << (lambda request, kind=kind: self._read(kind, request))
        fake_api[f"get {NETPOLS}"] << (lambda: ok({"items": self.of_kind("NetworkPolicy")}))
        fake_api["delete", re.compile(f"{PODS}/[^/]+")] << self._delete
        fake_api["patch", re.compile(f"{PODS}/[^/]+")] << self._patch_pod
        self.logs: dict[str, str] = {}  # pod name -> its worker container's log
        fake_api["get", re.compile(f"{PODS}/[^/]+/log")] << self._log
        fake_api[f"post {CONFIGMAPS}"] << (lambda request: self._create("ConfigMap", request))
        fake_api[f"post {SECRETS}"] << (lambda request: self._create("Secret", request))
        one_cm = re.compile(f"{CONFIGMAPS}/[^/]+")
        fake_api["get", one_cm] << (lambda request: self._read("ConfigMap", request))
        fake_api["put", one_cm] << self._replace_config_map
        fake_api[f"post {EVENTS}"] << fakeapi.CREATED
        fake_api["patch", re.compile(f"{EVENTS}/[^/]+")] << self._patch_event

    def put(self, *objects: dict[str, Any]) -> None:
        for obj in objects:
            self.objects[obj["kind"], obj["metadata"]["name"]] = obj

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [copy.deepcopy(obj) for (k, _), obj in self.objects.items() if k == kind]

    def job_pods(self) -> list[str]:
        """Names of the stored pods this job controls."""
        return sorted(
            name
            for (kind, name), obj in self.objects.items()
            if kind == "Pod" and observe.owned_by(obj, JOB_REF)
        )

    def view(self, scrape: observed.ScrapeHealth | None = None) -> cache.View:
        """What the pods watch shows a pass once caught up: the pods with the job's label, and
        how the scrapes of rank 0 went."""
        label = names.Label.JOB.value
        pods = [
            cache.slim_pod(obj)
            for (kind, _), obj in self.objects.items()
            if kind == "Pod" and obj["metadata"].get("labels", {}).get(label) == NAME
        ]
        return cache.View(pods=pods, nodes=NODES, used={}, scrape=scrape)

    def _patch_status(self, request: kmock.Request) -> kmock.Response:
        self.job = merge_patch(self.job, request.data)
        meta = self.job["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        return ok(copy.deepcopy(self.job))

    def _create(self, kind: str, request: kmock.Request) -> kmock.Response:
        body = request.data
        if request.params.get("dryRun") == "All":
            return self.dry_run if self.dry_run is not None else ok(body, 201)
        name = body["metadata"]["name"]
        refused = self.refuse(kind, name)
        if refused is not None:
            return refused
        if (kind, name) in self.objects:
            return fakeapi.status(409, f'{kind.lower()}s "{name}" already exists')
        self.objects[kind, name] = body
        self.created.append(name)
        return ok(body, 201)

    def _read(self, kind: str, request: kmock.Request) -> kmock.Response:
        found = self.objects.get((kind, name_of(request)))
        return ok(found) if found is not None else fakeapi.status(404, "not found")

    def _delete(self, request: kmock.Request) -> kmock.Response:
        found = self.objects.pop(("Pod", name_of(request)), None)
        return ok(found) if found is not None else fakeapi.status(404, "not found")

    def _patch_pod(self, request: kmock.Request) -> kmock.Response:
        found = self.objects.get(("Pod", name_of(request)))
        if found is None:
            return fakeapi.status(404, "not found")
        self.objects["Pod", name_of(request)] = merge_patch(found, request.data)
        return ok(self.objects["Pod", name_of(request)])

    def _replace_config_map(self, request: kmock.Request) -> kmock.Response:
        self.objects["ConfigMap", name_of(request)] = request.data
        return ok(request.data)

    def _log(self, request: kmock.Request) -> kmock.Response:
        pod = request.url.path.rsplit("/", 2)[-2]
        if ("Pod", pod) not in self.objects:
            return fakeapi.status(404, "not found")
        lines = self.logs.get(pod, "").splitlines(keepends=True)
        return kmock.Response(
            status=200, payload="".join(lines[-int(request.params["tailLines"]) :]).encode()
        )

    def _patch_event(self, request: kmock.Request) -> kmock.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        return ok({"metadata": {"name": name}, "involvedObject": {"uid": UID}, **request.data})


def ok(payload: Any, code: int = 200) -> kmock.Response:
    """Every answer of a callable carries its status: kmock 0.8 keeps the status of a Response
    a callable returned on the reaction, so a plain dict after a 404 would go out as a 404."""
    return kmock.Response(status=code, payload=payload)


def refuse_names(code: int, *refused: str) -> Refusal:
    def refuse(kind: str, name: str) -> kmock.Response | None:
        return fakeapi.status(code, "etcdserver: request timed out") if name in refused else None

    return refuse


# --- reading the request log --------------------------------------------------------------------
def write_kind(request: kmock.Request) -> str | None:
    """What a request did, as a user would name it; None for reads and dry runs."""
    method, path = request.method.value, request.url.path
    if method == "GET" or request.params.get("dryRun"):
        return None
    if path.startswith(EVENTS):
        return "event"
    if path.startswith(CONFIGMAPS):
        return "evidence" if method in ("POST", "PUT") else f"{method} {path}"
    if path == f"{JOB}/status":
        return "status"
    return {"POST": "create", "DELETE": "delete"}.get(method, f"{method} {path}")


def write_order(requests: list[kmock.Request]) -> list[str]:
    """The kinds of writes in the order sent, each run of one kind as one entry."""
    order: list[str] = []
    for kind in filter(None, map(write_kind, requests)):
        if not order or order[-1] != kind:
            order.append(kind)
    return order


def name_of(request: kmock.Request) -> str:
    """The object a request created, read or deleted."""
    if request.method.value == "POST":
        return str(request.data["metadata"]["name"])
    return request.url.path.rsplit("/", 1)[-1]


def creates(requests: list[kmock.Request]) -> list[kmock.Request]:
    return [r for r in requests if write_kind(r) == "create"]


def events(requests: list[kmock.Request]) -> list[kmock.Request]:
    return [r for r in requests if write_kind(r) == "event"]


def status_patches(requests: list[kmock.Request]) -> list[dict[str, Any]]:
    return [r.data["status"] for r in requests if write_kind(r) == "status"]


def condition(job_status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in job_status.get("conditions") or [] if c["type"] == kind), None)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def reconciler(api_client: Any, clock: Clock) -> Iterator[reconcile.Reconciler]:
    made = reconcile.Reconciler(
        kube.Kube(api_client), settings.Settings(metrics_port=0), clock=clock
    )
    yield made
    made.close()


# --- 1. the order of a pass's writes ------------------------------------------------------------
def new_job(cluster: Cluster) -> None:
    cluster.job = job_body(2)


def rank_1_failed(cluster: Cluster) -> None:
    cluster.job = job_body(2, running_status(2))
    cluster.put(*worker_pods(2, attempt=1, failed=1))
    cluster.put(templates.service(job=JOB_REF, spec=api.FSDPJobSpec.model_validate(job_spec(2))))


@pytest.mark.parametrize(
    ("given", "order", "deleted", "attempt"),
    [
        pytest.param(new_job, ["status", "create", "event"], [], 1, id="new-job-first-launch"),
        pytest.param(
            rank_1_failed,
            ["evidence", "status", "delete", "create", "event"],
            [f"{NAME}-a1-0", f"{NAME}-a1-1"],
            2,
            id="restart-after-rank-1-failed",
        ),
    ],
)
def test_the_status_goes_out_first_then_deletes_then_creates_then_events(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    given: Callable[[Cluster], None],
    order: list[str],
    deleted: list[str],
    attempt: int,
) -> None:
    """The status is the operator's memory: written before any pod exists, a pass cut short
    after it is finished by the next one; Events report what was done, so they come last."""
    cluster = Cluster(fake_api, job_body())
    given(cluster)
    reconciler.run_pass(NS, NAME, cluster.view())
    assert write_order(fake_api.requests) == order, fake_api.log()
    [written] = status_patches(fake_api.requests)
    assert (written["attempt"], written["podsCreated"]) == (attempt, False)
    sent = creates(fake_api.requests)
    # the Service first, then the policy over the gang's ports: no pod runs unguarded
    assert [r.url.path for r in sent] == [SERVICES, NETPOLS, PODS, PODS]
    assert cluster.job_pods() == [f"{NAME}-a{attempt}-0", f"{NAME}-a{attempt}-1"]
    removed = sorted((name_of(r), r.params.get("gracePeriodSeconds")) for r in fake_api["delete"])
    assert removed == [(name, str(GRACE_ON_FAILURE)) for name in deleted]


# --- 2. a pass cut short between the status write and the creates -------------------------------
@pytest.mark.parametrize(
    "watch_caught_up",
    [pytest.param(True, id="watch-saw-them"), pytest.param(False, id="watch-behind")],
)
@pytest.mark.parametrize(
    "refused",
    [
        pytest.param((SERVICE,), id="service-500"),
        pytest.param((f"{NAME}-a1-1",), id="rank-1-500"),
        pytest.param((f"{NAME}-a1-0", f"{NAME}-a1-1"), id="every-pod-500"),
    ],
)
def test_a_gang_cut_short_is_finished_by_the_next_pass_without_duplicates(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    clock: Clock,
    refused: tuple[str, ...],
    watch_caught_up: bool,
) -> None:
    cluster = Cluster(fake_api, job_body(2))
    cluster.refuse = refuse_names(500, *refused)
    with pytest.raises(ApiException) as raised:
        reconciler.run_pass(NS, NAME, cluster.view())
    assert raised.value.status == 500
    first = fake_api.requests
    launched, *reported = status_patches(first)
    assert (launched["attempt"], launched["podsCreated"]) == (1, False)
    [error] = reported  # the failed pass says why, in the status and in a Warning Event
    said = condition(error, decide.RECONCILE_ERROR)
    assert said is not None and said["status"] == "True"
    assert said["message"] == "API error 500: etcdserver: request timed out"
    [warning] = events(first)
    assert (warning.data["type"], warning.data["reason"]) == ("Warning", decide.RECONCILE_ERROR)

    cluster.refuse = refuse_names(500)  # the API server is well again
    clock.now += 5
    view = cluster.view() if watch_caught_up else cache.View(pods=[], nodes=NODES, used={})
    reconciler.run_pass(NS, NAME, view)
    ranks = [f"{NAME}-a1-0", f"{NAME}-a1-1"]
    # (a set: the first pass raised at its first failed create, and a create of its that was
    # still on its way may arrive now, or never: the writer pool cancels what has not started)
    second = fake_api.requests[len(first) :]
    assert {name_of(r) for r in creates(second) if r.url.path == PODS} == set(ranks)
    assert cluster.job_pods() == ranks, fake_api.log()
    pods_made = [n for n in cluster.created if n != SERVICE]
    assert sorted(pods_made) == sorted(set(pods_made)), "a pod name was created twice"
    assert list(fake_api["delete"]) == []  # its own pods (a 409) are kept, not replaced
    assert condition(status_patches(fake_api.requests)[-1], decide.RECONCILE_ERROR) is None


# --- 3. a pod name held by someone else ---------------------------------------------------------
@pytest.mark.parametrize(
    ("replicas", "squatted"),
    [pytest.param(2, 0, id="rank-0-of-2"), pytest.param(4, 3, id="rank-3-of-4")],
)
def test_a_pod_name_someone_holds_leaves_no_pod_of_the_job_and_says_so(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    clock: Clock,
    replicas: int,
    squatted: int,
) -> None:
    squatter = f"{NAME}-a1-{squatted}"
    cluster = Cluster(fake_api, job_body(replicas))
    cluster.put(foreign("Pod", squatter, owner=None))  # hand-made: no owner, no labels
    reconciler.run_pass(NS, NAME, cluster.view())
    others = sorted(f"{NAME}-a1-{r}" for r in range(replicas) if r != squatted)
    deleted = list(fake_api["delete"])
    assert sorted(name_of(r) for r in deleted) == others  # not the squatter's
    assert {r.params.get("gracePeriodSeconds") for r in deleted} == {"0"}
    assert cluster.job_pods() == []  # no pod of the job waits on someone else's name
    assert ("Pod", squatter) in cluster.objects

    before = len(fake_api.requests)
    clock.now += decide.CONFLICT_POLL_SECONDS
    outcome = reconciler.run_pass(NS, NAME, cluster.view())
    second = fake_api.requests[before:]
    assert [r for r in second if write_kind(r) in ("create", "delete")] == [], fake_api.log()
    assert cluster.job_pods() == []
    said = condition(cluster.job["status"], decide.CONFLICT)
    assert said is not None and said["status"] == "True", cluster.job["status"]
    assert said["reason"] == observed.ConflictKind.FOREIGN.value
    assert f"pod {squatter}" in said["message"]
    warnings = [r.data for r in events(second) if r.method.value == "POST"]
    assert [(e["type"], e["reason"]) for e in warnings] == [
        ("Warning", observed.ConflictKind.FOREIGN.value)
    ]
    assert outcome is not None and outcome.delay == decide.CONFLICT_POLL_SECONDS


# --- 4. the Service name held by someone else ---------------------------------------------------
@pytest.mark.parametrize(
    "owner",
    [
        pytest.param(ANOTHER_JOB, id="another-job"),
        pytest.param(EARLIER_JOB, id="a-deleted-job-of-the-same-name"),
        pytest.param(None, id="hand-made"),
    ],
)
def test_a_service_name_someone_holds_creates_no_pod(
    fake_api: fakeapi.FakeAPI, reconciler: reconcile.Reconciler, owner: dict[str, Any] | None
) -> None:
    cluster = Cluster(fake_api, job_body(2))
    cluster.put(foreign("Service", SERVICE, owner))
    reconciler.run_pass(NS, NAME, cluster.view())
    assert [r.url.path for r in creates(fake_api.requests)] == [SERVICES], fake_api.log()
    assert cluster.job_pods() == []
    assert list(fake_api["delete"]) == []  # not the job's to delete
    assert cluster.objects["Service", SERVICE]["metadata"]["uid"] == f"foreign-{SERVICE}"


# --- 5. a pass that fails again and again -------------------------------------------------------
def terminating(kind: str, name: str) -> kmock.Response:
    return fakeapi.status(403, f'{kind.lower()}s "{name}" is forbidden: {TERMINATING}')


@pytest.mark.parametrize(
    ("later", "forget", "warnings"),
    [
        pytest.param(30.0, False, 1, id="again-within-a-minute-is-quiet"),
        pytest.param(reconcile.ERROR_EVENT_SECONDS, False, 2, id="a-minute-later-says-it-again"),
        pytest.param(1.0, True, 2, id="after-forget-says-it-again"),
    ],
)
def test_a_failing_pass_warns_at_most_once_a_minute(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    clock: Clock,
    later: float,
    forget: bool,
    warnings: int,
) -> None:
    cluster = Cluster(fake_api, job_body(2, launched_status(2)))
    cluster.refuse = terminating
    with pytest.raises(ApiException, match="403"):
        reconciler.run_pass(NS, NAME, cluster.view())
    [warning] = events(fake_api.requests)
    assert (warning.data["type"], warning.data["reason"]) == ("Warning", decide.RECONCILE_ERROR)
    assert TERMINATING in warning.data["message"]

    if forget:
        reconciler.forget(NS, NAME)  # the job's loop ended (and a new one starts)
    clock.now += later
    with pytest.raises(ApiException, match="403"):
        reconciler.run_pass(NS, NAME, cluster.view())
    # a second Warning of the same text raises the first one's count (a PATCH), as kubectl shows
    assert len(events(fake_api.requests)) == warnings, fake_api.log()


@pytest.mark.parametrize(
    ("job_status", "passes"),
    [
        pytest.param(None, 1, id="new-job-keeps-progressing"),
        pytest.param(launched_status(2), 2, id="second-failing-pass-keeps-the-error"),
    ],
)
def test_a_failing_job_shows_its_error_beside_its_other_conditions(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    clock: Clock,
    job_status: dict[str, Any] | None,
    passes: int,
) -> None:
    """Two ways this broke before the report started from the status the pass wrote: (1) the
    error patch sent `conditions` as the pre-pass list plus ReconcileError; a merge patch
    replaces the whole list, so the conditions the pass wrote (a new job's Progressing) were
    gone. (2) decide() drops ReconcileError ("this pass works") and the pass writes that before
    its creates fail; the report then found the condition, same message, in the pre-pass body
    and wrote nothing: while the job failed pass after pass, the condition showed every other
    pass."""
    cluster = Cluster(fake_api, job_body(2, job_status))
    cluster.refuse = terminating
    for _ in range(passes):
        with pytest.raises(ApiException):
            reconciler.run_pass(NS, NAME, cluster.view())
        clock.now += 1
    shown = {c["type"]: c["status"] for c in cluster.job["status"].get("conditions") or []}
    assert shown.get(decide.RECONCILE_ERROR) == "True", shown
    assert shown.get("Progressing") == "True", shown


RBAC_403 = (
    'pods is forbidden: User "system:serviceaccount:fsdp-system:fsdp-operator" cannot create'
    ' resource "pods" in API group "" in the namespace "ns"'
)
TERMINATING_403 = (
    'pods "tiny-a1-0-dryrun-x" is forbidden: unable to create new content in namespace ns'
    " because it is being terminated"
)
PSA_403 = (
    'pods "tiny-a1-0-dryrun-x" is forbidden: violates PodSecurity "restricted:latest":'
    ' hostPath volumes (volume "data")'
)


@pytest.mark.parametrize(
    ("code", "message", "spec_at_fault"),
    [
        pytest.param(403, RBAC_403, False, id="operator-rbac-missing-a-verb"),
        pytest.param(403, TERMINATING_403, False, id="namespace-being-deleted"),
        pytest.param(403, "exceeded quota: compute, requested: cpu=4", False, id="quota-full"),
        pytest.param(403, PSA_403, True, id="pod-security-refuses-the-spec"),
        pytest.param(422, "spec.containers[0].resources: Invalid value", True, id="invalid-pod"),
    ],
)
def test_a_dry_run_refusal_fails_the_job_only_when_the_spec_is_at_fault(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    code: int,
    message: str,
    spec_at_fault: bool,
) -> None:
    """A refusal a fixed cluster clears (the operator's RBAC, a namespace being deleted, a full
    quota) fails the pass, to be tried again; it must not fail the job for good as
    InvalidSpec, where fixing the cluster would not bring it back."""
    cluster = Cluster(fake_api, job_body(2))
    cluster.dry_run = fakeapi.status(code, message)
    if spec_at_fault:
        reconciler.run_pass(NS, NAME, cluster.view())
        assert cluster.job["status"]["phase"] == "Failed"
        assert cluster.job["status"]["reason"] == "InvalidSpec"
        assert cluster.created == []
    else:
        with pytest.raises(RuntimeError, match=f"dry run of the worker pod failed \\({code}\\)"):
            reconciler.run_pass(NS, NAME, cluster.view())
        assert cluster.job["status"].get("phase") != "Failed"
        shown = condition(cluster.job["status"], decide.RECONCILE_ERROR)
        assert shown is not None and shown["status"] == "True", cluster.job["status"]
        assert cluster.created == []


# --- 6. a failed attempt's evidence is read before its pods go ----------------------------------
def _stall_line(rank: int, *, where: str, step: int, waiting: str | None, seq: int) -> str:
    collective = {
        "op": waiting or "all_reduce",
        "seq": seq,
        "state": "entered" if waiting else "completed",
    }
    doc = {"rank": rank, "step": step, "where": where, "collective": collective, "collectives": seq}
    return f"[rank{rank}] thread MainThread:\n{contract.EVIDENCE_PREFIX} {json.dumps(doc)}\n"


def test_a_hung_gangs_logs_and_evidence_are_kept_before_its_pods_are_deleted(
    fake_api: fakeapi.FakeAPI, reconciler: reconcile.Reconciler
) -> None:
    """Rank 2 (pod 1's first) stalled in data loading, the others wait in an all-gather: the
    status names pod 1 and the phase, the ConfigMap keeps both pods' logs, all before any
    delete."""
    cluster = Cluster(fake_api, job_body(2, running_status(2)))
    hung = status.FSDPJobStatus.model_validate(cluster.job["status"])
    hung.last_progress_time = NOW - 900
    cluster.job["status"] = dumped(hung)
    cluster.put(*worker_pods(2, attempt=1))
    pod0, pod1 = f"{NAME}-a1-0", f"{NAME}-a1-1"
    waiting = {"where": "forward", "step": 11, "waiting": "all_gather_into_tensor", "seq": 139}
    cluster.logs[pod0] = "step 11\n" + _stall_line(0, **waiting) + _stall_line(1, **waiting)
    cluster.logs[pod1] = _stall_line(2, where="data loading", step=11, waiting=None, seq=138)
    cluster.logs[pod1] += _stall_line(3, **waiting)
    reconciler.run_pass(NS, NAME, cluster.view(observed.ScrapeHealth(pod0, failures=0)))
    assert write_order(fake_api.requests)[:3] == ["evidence", "status", "delete"], fake_api.log()
    [written] = status_patches(fake_api.requests)
    failure = written["lastFailure"]
    assert failure["cause"] == "Hang" and failure["pod"] == pod1 and failure["rank"] == 1
    assert failure["phase"] == "data loading" and failure["step"] == 11
    assert failure["evidence"].startswith(
        "ranks 0,1,3 wait in all_gather_into_tensor #139 (forward, step 12); "
        "rank 2 in data loading at step 12, 1 collective behind"
    ), failure["evidence"]
    assert failure["diagnosis"].startswith("rank 2 not where the others are")
    assert failure["evidenceRef"] == names.evidence_name(NAME, attempt=1)
    assert written["history"][0]["failure"]["evidenceRef"] == failure["evidenceRef"]
    [kept] = [r.data for r in fake_api.requests if r.url.path == CONFIGMAPS]
    assert kept["metadata"]["ownerReferences"][0]["uid"] == UID
    assert kept["data"]["log-1.txt"] == cluster.logs[pod1]
    assert json.loads(kept["data"]["failure.json"])["firstPod"] == 1
    ranks = json.loads(kept["data"]["ranks.json"])
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and ranks[2]["where"] == "data loading"
    explained = [e for e in events(fake_api.requests) if "FailureExplained" in str(e.data)]
    assert explained, "an Event says it too"


def test_a_configmap_of_that_name_that_is_not_the_jobs_is_left_alone(
    fake_api: fakeapi.FakeAPI, reconciler: reconcile.Reconciler
) -> None:
    """Someone's own `<job>-a1-why`: the evidence is not written over it (no confused deputy);
    the failure is handled as ever, without an evidenceRef."""
    cluster = Cluster(fake_api, job_body(2, running_status(2)))
    cluster.put(*worker_pods(2, attempt=1, failed=1))
    theirs = {
        "kind": "ConfigMap",
        "metadata": {
            "name": names.evidence_name(NAME, attempt=1),
            "namespace": NS,
            "uid": "someone",
        },
        "data": {"mine": "yes"},
    }
    cluster.put(theirs)
    reconciler.run_pass(NS, NAME, cluster.view())
    assert cluster.objects["ConfigMap", names.evidence_name(NAME, attempt=1)] == theirs
    assert not [r for r in fake_api.requests if r.method.value == "PUT"]
    [written] = status_patches(fake_api.requests)
    assert written["lastFailure"]["cause"] == "Crash"
    assert written["lastFailure"].get("evidenceRef") is None


# --- 7. one status write per pass ---------------------------------------------------------------
def spared_spec() -> dict[str, Any]:
    """job_spec(2) with one warm spare (which needs restarts in place)."""
    spec = job_spec(2)
    spec["spares"] = 1
    spec["failurePolicy"]["inPlaceRestarts"] = 2
    return spec


@pytest.mark.parametrize("again", [False, True], ids=["first-pass", "pass-done-again"])
def test_an_in_place_attempts_key_is_created_before_its_pods_and_only_it_is_mounted(
    fake_api: fakeapi.FakeAPI, api_client: Any, clock: Clock, again: bool
) -> None:
    """With restarts in place the attempt's gang key (derived from the operator's master key)
    goes out in its own Secret, owned by the job, before any pod that mounts it; a pass done
    again finds it there (a 409) and creates the pods all the same."""
    master = b"m" * 32
    made = reconcile.Reconciler(
        kube.Kube(api_client),
        settings.Settings(metrics_port=0),
        clock=clock,
        gang_client=gang.GangClient(master),
    )
    cluster = Cluster(fake_api, {**job_body(2), "spec": spared_spec()})
    secret_name = names.gang_key_name(NAME, attempt=1)
    if again:
        cluster.put({"kind": "Secret", "metadata": {"name": secret_name}})
    try:
        made.run_pass(NS, NAME, cluster.view())
    finally:
        made.close()
    creates = [r.url.path for r in fake_api.requests if write_kind(r) == "create"]
    creates = [path for path in creates if path in (SECRETS, PODS)]
    assert creates[0] == SECRETS and creates[1:].count(PODS) >= 2, creates
    secret = cluster.objects["Secret", secret_name]
    if not again:
        key = gangwire.attempt_key(master, JOB_REF.uid, 1).hex()
        assert secret["stringData"] == {"key": key} and secret["immutable"] is True
        assert observe.owned_by(secret, JOB_REF)
    pods = [cluster.objects["Pod", n] for n in cluster.job_pods()]
    assert len(pods) >= 2, pods
    for pod in pods:
        volume = {"secretName": secret_name, "defaultMode": 0o440}
        assert {"name": "fsdp-gang-key", "secret": volume} in pod["spec"]["volumes"]


def node_1_lost(cluster: Cluster) -> None:
    """Attempt 1 runs with a spare on node-3; node rank 1's node is gone from the cluster."""
    spec = api.FSDPJobSpec.model_validate(spared_spec())
    running = status.FSDPJobStatus.model_validate(running_status(2))
    running.spares = status.Spares(wanted=1, next_index=1, running=1)
    cluster.job = {**job_body(2, dumped(running)), "spec": spared_spec()}
    pods = worker_pods(2, attempt=1)
    pods[1]["spec"]["nodeName"] = "node-gone"
    launch = decide.Launch(attempt=1, replicas=2, resume_path="")
    spare = templates.spare_pod(JOB_REF, spec, launch, index=0)
    spare["metadata"]["uid"] = "pod-spare"
    spare["spec"]["nodeName"] = "node-3"
    spare["status"] = {"phase": "Running", "podIP": "10.0.0.9"}
    cluster.put(*pods, spare)


@pytest.mark.parametrize(
    ("refusal", "label_and_delete"),
    [
        pytest.param("", 2, id="taken-over"),
        pytest.param("spare 0 already holds a node", 0, id="refused"),
    ],
)
def test_a_spare_takeover_hands_the_place_over_or_says_it_was_refused(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    monkeypatch: pytest.MonkeyPatch,
    refusal: str,
    label_and_delete: int,
) -> None:
    """The coordinator's answer is part of the pass: the status it leads to (the takeover, or
    its refusal, so that the next pass recreates the gang) goes out in the pass's one patch."""
    told: list[tuple[tuple[str, int], dict[str, Any]]] = []

    def ask(
        address: tuple[str, int], doc: dict[str, Any], *, creds: object, timeout: float
    ) -> dict[str, Any]:
        told.append((address, doc))
        return {"refused": refusal} if refusal and doc["op"] == "replace" else {}

    monkeypatch.setattr(keeper, "ask", ask)
    cluster = Cluster(fake_api, job_body())
    node_1_lost(cluster)
    reconciler.run_pass(NS, NAME, cluster.view())
    assert [doc["op"] for _, doc in told] == ["follow", "replace"]
    [written] = status_patches(fake_api.requests)
    assert written["spares"]["takeovers"] == 1
    handed = [
        r
        for r in fake_api.requests
        if r.method.value in ("PATCH", "DELETE") and r.url.path.startswith(PODS)
    ]
    assert len(handed) == label_and_delete, fake_api.log()
    reasons = [e.data["reason"] for e in events(fake_api.requests)]
    if refusal:
        assert written["spares"]["refused"] == f"{NAME}-a1-1", written["spares"]
        assert written["spares"].get("replaced") in (None, []), written["spares"]
        assert reasons == ["SpareTakeover", "SpareTakeoverRefused"]
    else:
        assert written["spares"]["replaced"] == [f"{NAME}-a1-1"]
        assert (
            cluster.objects["Pod", f"{NAME}-a1-s0"]["metadata"]["labels"][
                names.Label.NODE_RANK.value
            ]
            == "1"
        )
        assert ("Pod", f"{NAME}-a1-1") not in cluster.objects
        assert reasons == ["SpareTakeover"]


def keepers(answer: str) -> Callable[..., dict[str, Any]]:
    """keeper.ask as keepers that take every word (""), or refuse a `replace` saying why."""

    def ask(
        address: tuple[str, int], doc: dict[str, Any], *, creds: object, timeout: float
    ) -> dict[str, Any]:
        return {"refused": answer} if answer and doc["op"] == "replace" else {}

    return ask


@pytest.mark.parametrize(
    ("given", "answer"),
    [
        pytest.param(new_job, "", id="new-job"),
        pytest.param(rank_1_failed, "", id="restart-with-evidence"),
        pytest.param(node_1_lost, "", id="spare-takeover"),
        pytest.param(node_1_lost, "the gang has stopped restarting in place", id="refused"),
    ],
)
def test_every_pass_writes_its_status_in_one_patch(
    fake_api: fakeapi.FakeAPI,
    reconciler: reconcile.Reconciler,
    monkeypatch: pytest.MonkeyPatch,
    given: Callable[[Cluster], None],
    answer: str,
) -> None:
    """All a pass changes in the status, including what it learns by asking (a failed gang's
    logs, the keepers' word on a takeover), goes out in one patch before any pod is touched;
    the patch's echo is the process's own and wakes no pass."""
    monkeypatch.setattr(keeper, "ask", keepers(answer))
    cluster = Cluster(fake_api, job_body())
    given(cluster)
    reconciler.run_pass(NS, NAME, cluster.view())
    assert len(status_patches(fake_api.requests)) == 1, fake_api.log()
    first = next(i for i, r in enumerate(fake_api.requests) if write_kind(r) == "status")
    before = {write_kind(r) for r in fake_api.requests[:first]} - {None}
    assert before <= {"evidence"}, fake_api.log()  # only the failed gang's evidence is kept first
    version = cluster.job["metadata"]["resourceVersion"]
    assert reconciler.is_echo(NS, NAME, version)


# --- spec.gangScheduling: the attempt's PodGroup ------------------------------------------------
PODGROUPS = f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{NS}/podgroups"
VOLCANO_PODGROUPS = f"/apis/scheduling.volcano.sh/v1beta1/namespaces/{NS}/podgroups"


@dataclasses.dataclass
class Served:
    """Whether the cluster serves the PodGroup CRD (a test turns it on)."""

    on: bool


def serve_podgroups(fake_api: fakeapi.FakeAPI, cluster: Cluster, *, served: bool = True) -> Served:
    """scheduler-plugins' PodGroup CRD: PodGroups kept beside the job's other objects while
    it is served (the returned switch), every request a 404 while not (no such CRD)."""
    switch = Served(served)
    missing = fakeapi.status(404, "the server could not find the requested resource")

    def listed() -> kmock.Response:
        return ok({"items": cluster.of_kind("PodGroup")}) if switch.on else missing

    def create(request: kmock.Request) -> kmock.Response:
        return cluster._create("PodGroup", request) if switch.on else missing

    def delete(request: kmock.Request) -> kmock.Response:
        found = cluster.objects.pop(("PodGroup", name_of(request)), None)
        return ok(found) if found is not None else fakeapi.status(404, "not found")

    fake_api[f"get {PODGROUPS}"] << listed
    fake_api[f"post {PODGROUPS}"] << create
    fake_api["delete", re.compile(f"{PODGROUPS}/[^/]+")] << delete
    # the other kind's groups, which a launch deletes after an edit: no Volcano here
    fake_api[f"get {VOLCANO_PODGROUPS}"] << (lambda: missing)
    return switch


def test_a_restart_replaces_the_podgroup_before_the_new_attempts_pods(
    fake_api: fakeapi.FakeAPI, reconciler: reconcile.Reconciler
) -> None:
    """The restarted gang's PodGroup (minMember: its pods) is there before any of its pods, and
    the failed attempt's is gone (a shrunk gang must not be counted against the old size)."""
    cluster = Cluster(fake_api, job_body())
    rank_1_failed(cluster)
    cluster.job["spec"]["gangScheduling"] = {"kind": "Coscheduling"}
    old = names.pod_group(NAME, attempt=1)
    owner = templates.owner_reference(JOB_REF)
    meta = {"name": old, "ownerReferences": [owner]}
    cluster.put({"kind": "PodGroup", "metadata": meta, "spec": {"minMember": 2}})
    serve_podgroups(fake_api, cluster)
    reconciler.run_pass(NS, NAME, cluster.view())
    new = names.pod_group(NAME, attempt=2)
    assert ("PodGroup", old) not in cluster.objects
    group = cluster.objects["PodGroup", new]
    assert group["spec"] == {"minMember": 2} and observe.owned_by(group, JOB_REF)
    paths = [r.url.path for r in creates(fake_api.requests)]
    assert paths.index(PODGROUPS) < paths.index(PODS), paths
    for pod in (cluster.objects["Pod", n] for n in cluster.job_pods()):
        assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == new
        assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


def test_a_cluster_without_the_podgroup_crd_makes_no_pod_and_says_what_to_install(
    fake_api: fakeapi.FakeAPI, reconciler: reconcile.Reconciler, clock: Clock
) -> None:
    """No crash and no member pod without its group: the pass stops before the pods, the job
    says what to install, and once the CRD is served the next pass creates the gang."""
    spec = {**job_spec(2), "gangScheduling": {"kind": "Coscheduling"}}
    cluster = Cluster(fake_api, {**job_body(2), "spec": spec})
    crd = serve_podgroups(fake_api, cluster, served=False)
    with pytest.raises(podgroups.MissingApi):
        reconciler.run_pass(NS, NAME, cluster.view())
    assert cluster.job_pods() == []
    shown = condition(cluster.job["status"], decide.RECONCILE_ERROR)
    assert shown is not None and shown["status"] == "True", cluster.job["status"]
    said = "spec.gangScheduling.kind=Coscheduling: the cluster serves no PodGroup"
    assert said in shown["message"]
    [warning] = events(fake_api.requests)
    assert warning.data["type"] == "Warning" and "install" in warning.data["message"]

    crd.on = True
    clock.now += 5
    reconciler.run_pass(NS, NAME, cluster.view())
    assert cluster.job_pods() == [f"{NAME}-a1-0", f"{NAME}-a1-1"]
    assert ("PodGroup", names.pod_group(NAME, attempt=1)) in cluster.objects
