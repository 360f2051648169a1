"""Checkpoints in the cluster's object store (issue 45): a job whose spec.checkpoint.objectStore
names a bucket of the local cluster's S3 server (versitygw, localcluster/objectstore.py),
its keys in a Secret, crashes once and resumes from its newest checkpoint in the bucket. No
claim is mounted, and the operator never reads the bucket: the pods choose their resume point
(RESUME_AUTO) and report it; the worker seals and fences each step by conditional writes
(docs/contract.md, "Object-store commit protocol").
"""

from __future__ import annotations

import json
import warnings
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import pytest

from fsdp_operator.types import names
from fsdp_worker.contract import objstore
from localcluster import faults as lf
from localcluster import images, objectstore, poll
from tests.integration import harness

pytestmark = pytest.mark.cluster

SECRET = "s3-keys"


def store_job(name: str, store: objectstore.ObjectStore, *, bucket: str, **spec: object) -> dict:
    """harness.job_doc's stand-in job with its checkpoints in `bucket` instead of the claim."""
    doc = harness.job_doc(name, **spec)
    checkpoint = doc["spec"]["checkpoint"]
    checkpoint.pop("claimName")
    checkpoint["objectStore"] = {
        "bucket": bucket,
        "prefix": "runs",
        "endpoint": store.cluster_endpoint,
        "region": store.region,
        "credentialsSecret": SECRET,
    }
    return doc


def keys_under(store: objectstore.ObjectStore, bucket: str, prefix: str) -> list[str]:
    """Object keys under `prefix` (ListObjectsV2, first 1000)."""
    reply = store.request("GET", f"/{bucket}?list-type=2&prefix={prefix}")
    assert reply.status == 200, reply
    ns = {"s3": "http://s3.amazonaws.com/doc/2006-03-01/"}
    return [e.text or "" for e in ET.fromstring(reply.body).findall("s3:Contents/s3:Key", ns)]


def fence_of(store: objectstore.ObjectStore, bucket: str, name: str) -> objstore.FenceDoc:
    """The job's FENCE.json: the writer that holds its root and the steps it sealed."""
    reply = store.request("GET", f"/{bucket}/runs/{name}/{objstore.FENCE_NAME}")
    assert reply.status == 200, reply
    return objstore.FenceDoc.from_json(reply.body)


def test_a_job_on_an_object_store_survives_a_crash_and_a_lost_node_from_the_bucket(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """One job, two faults (a cluster and a job shared, to keep the suite short): its rank
    crashes at step 12 and it resumes from step 10 in the bucket; then the node of its rank 1
    is lost (kubelet stopped, its pods frozen) and it resumes elsewhere from the newest step
    FENCE.json lists, written by the attempt before; it succeeds with its last step sealed in
    the bucket and the last attempt holding the fence."""
    store = operator.cluster.object_store
    bucket = jobs.ns  # t-<hex>: a valid bucket name of this test's own
    store.create_bucket(bucket)
    secret = json.dumps(store.secret(SECRET))
    jobs.cluster.kubectl("apply", "-n", jobs.ns, "-f", "-", input=secret)
    name = harness.unique("s3crash")
    doc = store_job(
        name, store, bucket=bucket, env={"STANDIN_FAIL_AT_STEP": 12}, training={"steps": 120}
    )
    jobs.apply(doc)
    story = lambda: jobs.diagnosis(name)  # noqa: E731
    poll.until(
        "attempt 2 after the crash, past step 30",
        lambda: (s := jobs.status(name)).get("attempt") == 2 and (s.get("step") or 0) >= 30,
        timeout=180,
        diagnosis=story,
    )
    gang = [p for p in jobs.running_pods(name, 2) if p["metadata"]["name"].endswith("-1")]
    assert gang, story()
    lost = gang[0]["spec"]["nodeName"]
    faults = lf.Faults.for_cluster(operator.cluster.state_dir)
    faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        poll.until(
            "attempt 3 after the lost node",
            lambda: jobs.status(name).get("attempt") == 3,
            timeout=120,
            diagnosis=story,
        )
        sealed_before = fence_of(store, bucket, name).steps
    finally:
        faults.restore_node(lost)
    done = poll.until(
        "job on S3 to succeed after a crash and a lost node",
        lambda: (s := jobs.status(name)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=240,
        diagnosis=story,
    )
    assert done["phase"] == "Succeeded", done
    assert done["attempt"] == 3 and done["restarts"]["application"] == 1, done["restarts"]
    assert done["history"][1]["cause"] == "NodeLost" and done["lastFailure"]["node"] == lost
    assert done["history"][1].get("resumedFromStep") == 10, done["history"]
    # from the newest step sealed when the node went (the lost node's frozen rank seals none)
    resumed = done["history"][2].get("resumedFromStep")
    assert resumed is not None and resumed >= max(sealed_before, default=30) >= 30, (
        resumed,
        sorted(sealed_before),
    )
    root = f"s3://{bucket}/runs/{name}"
    assert done["lastCheckpoint"]["step"] == 120
    assert done["lastCheckpoint"]["path"] == f"{root}/step-120", done["lastCheckpoint"]
    fence = fence_of(store, bucket, name)
    assert fence.writer is not None and fence.writer.attempt == 3, fence
    assert 120 in fence.steps, fence
    # no claim in the pods: the checkpoints are the bucket's
    for pod in jobs.pods(name):
        assert not [v for v in pod["spec"]["volumes"] if v.get("persistentVolumeClaim")]
    assert keys_under(store, bucket, f"runs/{name}/"), "the job's steps live in the bucket"
    assert not jobs.ckpt_dir(name).exists(), "nothing of the job's on the namespace's claim"

    # Deleted and created again under its name, the job's new pods find the old job's steps
    # under its prefix (the operator never reads the bucket) and refuse to train from step 0
    # beside them; created again with resumeFromPreviousJobs, it resumes from step 120.
    refused = _again(jobs, name, doc, story)
    assert refused["phase"] == "Failed" and refused["lastFailure"]["cause"] == "ConfigError"
    assert "holds checkpoints of another FSDPJob" in refused["lastFailure"]["message"], refused
    assert "set checkpoint.resumeFromPreviousJobs" in refused["lastFailure"]["message"]
    assert set(fence_of(store, bucket, name).steps) == set(fence.steps), "nothing sealed"
    doc["spec"]["checkpoint"]["resumeFromPreviousJobs"] = True
    doc["spec"]["training"]["steps"] = 140
    again = _again(jobs, name, doc, story)
    said = json.dumps(again, indent=1)  # whole: pytest cuts a dict's repr short
    assert again["phase"] == "Succeeded", said
    # Every attempt of the new job resumes from the old one's newest step, never from 0. One
    # CI run under load saw this job need a second attempt (its cause cut from the report):
    # its history is said whole, and a restart there is reported, not taken for the rule's.
    resumed = [h.get("resumedFromStep") for h in again["history"]]
    assert resumed[0] == 120 and all((r or 0) >= 120 for r in resumed), said
    if again["attempt"] != 1:
        causes = [h.get("cause") for h in again["history"][:-1]]
        assert "ConfigError" not in causes, said
        warnings.warn(f"the recreated job restarted: {causes}\n{said}", stacklevel=1)
    assert again["lastCheckpoint"]["path"] == f"{root}/step-140"
    uid = (jobs.get(name) or {})["metadata"]["uid"]
    writer = fence_of(store, bucket, name).writer
    assert writer is not None and (writer.attempt, writer.job_uid) == (1, uid), writer


def _again(
    jobs: harness.Jobs, name: str, doc: dict[str, Any], story: Callable[[], str]
) -> dict[str, Any]:
    """Delete the job, create `doc` again under its name once the old one is gone, and wait for
    the new one to end: its status."""
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    poll.until("the old job gone", lambda: jobs.get(name) is None, timeout=90, diagnosis=story)
    jobs.apply(doc)
    return poll.until(
        "the job created again to end",
        lambda: (s := jobs.status(name)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=180,
        diagnosis=story,
    )


HOLD_SECONDS = 10  # the next attempt's pod waits this long in an init container


def _sealed_by(doc: objstore.FenceDoc, attempt: int) -> set[int]:
    return {step for step, writer in doc.steps.items() if writer.startswith(f"writer-a{attempt}g")}


def test_a_lost_writer_seals_on_s3_until_the_next_attempt_takes_the_fence_and_then_nothing(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """The fence race on the bucket (test_zombie.py's, on S3): a lost node's rank 0 is let go
    after the next attempt was launched elsewhere and while that attempt's pod is held. The old
    writer's seals land until the new attempt swaps FENCE.json to itself (a compare-and-swap
    at the store, not a check before it); after that its commits fail there, it says it was
    superseded, and the job succeeds in the attempt the operator launched, from the newest
    step sealed when it took over, every later step its own."""
    store = operator.cluster.object_store
    bucket = jobs.ns
    store.create_bucket(bucket)
    jobs.cluster.kubectl("apply", "-n", jobs.ns, "-f", "-", input=json.dumps(store.secret(SECRET)))
    name = harness.unique("s3zombie")
    hold = {
        "name": "hold",
        "image": images.WORKER,
        "command": ["python", "-c", f"import time; time.sleep({HOLD_SECONDS})"],
    }
    doc = store_job(name, store, bucket=bucket, replicas=1, minReplicas=1, training={"steps": 400})
    doc["spec"]["template"]["spec"]["initContainers"] = [hold]
    jobs.apply(doc)
    story = lambda: jobs.diagnosis(name)  # noqa: E731
    pod = poll.until(
        "rank 0 stepping past step 12",
        lambda: (jobs.status(name).get("step") or 0) >= 12 and jobs.running_pods(name, 1),
        timeout=120,
        diagnosis=story,
    )[0]
    node, zombie = pod["spec"]["nodeName"], pod["metadata"]["name"]
    faults = lf.Faults.for_cluster(operator.cluster.state_dir)
    faults.lose_node(node, freeze=names.Label.JOB.value)
    try:
        poll.until(
            "attempt 2 launched after NodeLost",
            lambda: jobs.status(name).get("attempt", 0) >= 2,
            timeout=90,
            diagnosis=story,
        )
        at_loss = _sealed_by(fence_of(store, bucket, name), 1)
        faults.thaw_pods(node)  # the old writer goes on; the new attempt's rank is held
        before: set[int] = set()

        def taken() -> bool:
            doc = fence_of(store, bucket, name)
            if doc.writer is not None and doc.writer.attempt == 1:
                before.update(_sealed_by(doc, 1))
            return doc.writer is not None and doc.writer.attempt == 2

        poll.until("attempt 2 takes the fence", taken, timeout=120, every=0.2, diagnosis=story)
        log = poll.until(
            "the old writer refused at the store",
            lambda: "was superseded" in (text := faults.pod_log(node, jobs.ns, zombie)) and text,
            timeout=60,
            diagnosis=story,
        )
        late = before - at_loss
        print(f"s3 zombie: sealed at the loss {max(at_loss, default=0)}; late {sorted(late)}")
        # One way: the old attempt sealed after the loss, before the take-over...
        assert late, f"no seal of attempt 1 after the loss\n{log[-3000:]}"
        # ...the other: once attempt 2 held the fence, the old writer was refused.
        assert "attempt 2 generation 0 now writes" in log, log[-3000:]
    finally:
        faults.restore_node(node)
    done = poll.until(
        "Succeeded",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=180,
        diagnosis=story,
    )
    resumed = done["history"][-1]["resumedFromStep"]
    assert done["attempt"] == 2 and resumed >= max(before), (resumed, sorted(before))
    final = fence_of(store, bucket, name)
    assert final.writer is not None and final.writer.attempt == 2
    assert all(w.startswith("writer-a2g") for s, w in final.steps.items() if s > resumed), final
    assert final.steps.get(400, "").startswith("writer-a2g"), final
