"""A job of real torch ranks whose checkpoints live in the cluster's S3 server (issue 45): a
crash restarts it in place from the memory tier, a lost node shrinks it and DCP reshards its
newest step from the bucket, and on success its model is exported to the bucket.

Not in tests/integration: the stand-in worker there has no memory tier, no DCP and no export.
3 pods x 1 rank (one per node, minReplicas 2), the chart's defaults (the operator reads no
tenant's storage: the pods choose their step from FENCE.json and report it), the keys in a
Secret of the job's namespace, no claim mounted. The bucket is read here from the host, as a
user would with their own S3 client: FENCE.json lists what was sealed, each step's marker its
world size and data cursor.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml

from fsdp_operator.types import names
from fsdp_worker.contract import catalog, objstore
from harness import stack
from localcluster import objectstore, poll
from tests.e2e.conftest import E2E

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(900)]
SECRET = "s3-keys"
MEMORY_CATCHES_UP = 2.0  # seconds after a bucket seal: the memory tier's seal of that step
STEPS = 300  # ~0.2-0.4 s each here: the faults land mid-run
INTERVAL = 30  # the bucket's; memory every 2 steps (and at each of the bucket's steps)
KEEP = 10  # steps 30 apart: what attempt 2 resumed from is still listed when it is read
GLOBAL_BATCH = 24  # 2 per micro-batch: whole at world size 3 and 2


def _store(e2e: E2E) -> objectstore.ObjectStore:
    store = getattr(e2e.kube, "object_store", None)
    if store is None:  # FSDP_E2E_KUBECONFIG (kind): no S3 server in that cluster
        pytest.skip("needs the local cluster's S3 server (versitygw); a kind cluster has none")
    return store  # type: ignore[no-any-return]


def _job(e2e: E2E, name: str, store: objectstore.ObjectStore, bucket: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((stack.ROOT / "examples" / "tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    spec = doc["spec"]
    spec.update(
        image=e2e.worker_image,
        replicas=3,
        minReplicas=2,
        nprocPerNode=1,
        resources={"requests": {"cpu": "500m", "memory": "1Gi"}},
    )
    spec["training"].update(steps=STEPS, globalBatchSize=GLOBAL_BATCH)
    spec["checkpoint"] = {
        "objectStore": {
            "bucket": bucket,
            "prefix": "runs",
            "endpoint": store.cluster_endpoint,
            "region": store.region,
            "credentialsSecret": SECRET,
        },
        "intervalSteps": INTERVAL,
        "keep": KEEP,
        "memory": {"intervalSteps": 2, "sizeLimit": "256Mi"},
        "export": {"format": "safetensors"},
    }
    spec["failurePolicy"].update(
        nodeLossGraceSeconds=4,
        progressDeadlineSeconds=90,
        startupDeadlineSeconds=240,
        inPlaceRestarts=2,
    )
    return doc


def _get(store: objectstore.ObjectStore, bucket: str, key: str) -> bytes | None:
    reply = store.request("GET", f"/{bucket}/{key}")
    return reply.body if reply.status == 200 else None


def _fence(store: objectstore.ObjectStore, bucket: str, name: str) -> objstore.FenceDoc:
    raw = _get(store, bucket, f"runs/{name}/{objstore.FENCE_NAME}")
    return objstore.FenceDoc.from_json(raw) if raw is not None else objstore.FenceDoc()


def _marker(store: objectstore.ObjectStore, bucket: str, name: str, step: int) -> catalog.Marker:
    writer = _fence(store, bucket, name).steps[step]
    key = f"runs/{name}/{catalog.step_dir_name(step)}/{writer}/{catalog.MARKER_NAME}"
    raw = _get(store, bucket, key)
    assert raw is not None, f"no marker at {key}"
    return catalog.Marker.from_json(raw)


def _resumed_lines(jobs: stack.Jobs, namespace: str, name: str) -> str:
    """What each pod's ranks said about where they resumed (a failed assert's story)."""
    lines = []
    for pod in jobs.pods(name):
        log = jobs.cluster.kubectl("logs", "-n", namespace, pod["metadata"]["name"], check=False)
        said = [ln for ln in log.stdout.splitlines() if "resum" in ln or "memory" in ln]
        lines += [f"{pod['metadata']['name']}: {ln}" for ln in said[-12:]]
    return "\n".join(lines)


def test_a_job_in_the_bucket_restarts_from_memory_then_shrinks_and_reshards_from_the_bucket(
    e2e: E2E, namespace: str
) -> None:
    store = _store(e2e)
    bucket = namespace  # e2e-<hex>: a valid bucket name of this test's own
    store.create_bucket(bucket)
    e2e.kube.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(store.secret(SECRET)))
    jobs, name = stack.Jobs(e2e.kube, namespace), "s3-torch"
    jobs.apply(_job(e2e, name, store, bucket))
    story = lambda: jobs.diagnosis(name)  # noqa: E731
    sealed = lambda: max(_fence(store, bucket, name).steps, default=0)  # noqa: E731

    def gang(attempt: int) -> list[dict[str, Any]] | None:
        pods = jobs.running_pods(name, attempt)
        return pods if len(pods) == 3 and sealed() >= INTERVAL else None

    pods = poll.until(
        f"3 pods training, step {INTERVAL} sealed in the bucket",
        lambda: gang(1),
        timeout=420,
        diagnosis=story,
    )
    uids = {p["metadata"]["uid"] for p in pods}
    for pod in pods:  # no claim in the pods: the checkpoints are the bucket's
        assert not [v for v in pod["spec"]["volumes"] if v.get("persistentVolumeClaim")], pod
    by_rank = {p["metadata"]["labels"][names.Label.NODE_RANK.value]: p for p in pods}

    # 1. A rank crashes: its pod's processes restart in place and load the memory tier's step.
    # The memory tier seals each of the bucket's steps just after the bucket does: a crash in
    # between rightly loads the bucket's (newer) step. So the crash lands a moment after a new
    # step appears in FENCE.json, well before the next (INTERVAL steps of ~0.3 s later).
    crashed = sealed()
    poll.until(
        "a new step sealed in the bucket",
        lambda: sealed() > crashed,
        timeout=120,
        every=0.2,
        diagnosis=story,
    )
    crashed = sealed()
    time.sleep(MEMORY_CATCHES_UP)
    e2e.faults.kill_rank(namespace, by_rank["1"]["metadata"]["name"], rank=1)

    def restarted() -> dict[str, Any] | None:
        s = jobs.status(name)
        done = (s.get("history") or [{}])[-1].get("restartsInPlace") or []
        return done[0] if done and done[0].get("resumed") else None

    restart = poll.until(
        "a restart in place after the crash", restarted, timeout=300, diagnosis=story
    )
    s = jobs.status(name)
    said = f"{restart}\n{_resumed_lines(jobs, namespace, name)}\n{story()}"
    assert s["attempt"] == 1 and s["lastFailure"]["cause"] == "Crash", said
    assert restart["fromMemory"] is True and restart["resumedFromStep"] >= crashed, said
    assert {p["metadata"]["uid"] for p in jobs.running_pods(name, 1)} == uids, story()

    # 2. A node is lost: the operator shrinks the gang to the 2 nodes left, and the new pods
    # (new memory volumes) load the newest step FENCE.json lists, resharded from 3 ranks to 2.
    before = sealed()
    poll.until(
        "a step sealed after the restart", lambda: sealed() > before, timeout=300, diagnosis=story
    )
    lost = by_rank["2"]["spec"]["nodeName"]
    e2e.faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        shrunk = poll.until(
            "attempt 2 at world size 2 resumed",
            lambda: (x := jobs.status(name)).get("attempt") == 2
            and x.get("worldSize") == 2
            and x.get("resumedFromStep") is not None
            and x,
            timeout=300,
            diagnosis=story,
        )
        fence = _fence(store, bucket, name)
    finally:
        e2e.faults.restore_node(lost)
    assert shrunk["history"][0]["cause"] == "NodeLost", story()
    assert shrunk["lastFailure"]["node"] == lost, story()
    # attempt 2 took the fence over and resumed from the newest step attempt 1 sealed
    resumed = shrunk["resumedFromStep"]
    by_first = [step for step, writer in fence.steps.items() if writer.startswith("writer-a1g")]
    assert resumed > before and resumed == max(by_first), (resumed, fence.steps, story())
    assert fence.writer is not None and fence.writer.attempt == 2, fence
    marker = _marker(store, bucket, name, resumed)
    assert marker.world_size == 3 and marker.samples_consumed == resumed * GLOBAL_BATCH, marker

    # 3. It succeeds (grown back to 3 or not once the node returns): the last step is sealed
    # in the bucket with the data cursor of the global batch, and the model is exported.
    done = poll.until(
        "Succeeded",
        lambda: (x := jobs.status(name)).get("phase") == "Succeeded" and x,
        timeout=600,
        diagnosis=story,
    )
    root = f"s3://{bucket}/runs/{name}"
    assert done["lastCheckpoint"]["path"] == f"{root}/{catalog.step_dir_name(STEPS)}", done
    last = _marker(store, bucket, name, STEPS)
    assert last.attempt >= 2 and last.samples_consumed == STEPS * GLOBAL_BATCH, last
    assert len(_fence(store, bucket, name).steps) <= KEEP, "retention in the bucket too"
    exported = _get(store, bucket, f"runs/{name}/export/COMPLETE.json")
    assert exported is not None, "export/COMPLETE.json is written last, on success"
    header = _get(store, bucket, f"runs/{name}/export/model.safetensors")
    assert header is not None and len(header) > 8, "the exported model"
    size = int.from_bytes(header[:8], "little")  # safetensors: a u64 header length, then JSON
    tensors = json.loads(header[8 : 8 + size])
    assert any(k.endswith("weight") for k in tensors), sorted(tensors)[:10]
    print(
        f"s3 e2e: crash resumed from step {restart['resumedFromStep']} (memory, sealed "
        f"{crashed} in the bucket); node loss resumed from step {resumed} at world size 2; "
        f"{done['attempt']} attempts"
    )
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", namespace, "--wait=false")
