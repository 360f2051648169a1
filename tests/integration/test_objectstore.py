"""Checkpoints in the cluster's object store (issue 45): a job whose spec.checkpoint.objectStore
names a bucket of the local cluster's S3 server (versitygw, localcluster/objectstore.py),
its keys in a Secret, crashes once and resumes from its newest checkpoint in the bucket. No
claim is mounted, and the operator never reads the bucket: the pods choose their resume point
(RESUME_AUTO) and report it; the worker seals and fences each step by conditional writes
(docs/contract.md, "Object-store commit protocol").
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from localcluster import objectstore, poll
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


def test_a_job_on_an_object_store_crashes_and_resumes_from_the_bucket(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    store = operator.cluster.object_store
    bucket = jobs.ns  # t-<hex>: a valid bucket name of this test's own
    store.create_bucket(bucket)
    secret = json.dumps(store.secret(SECRET))
    jobs.cluster.kubectl("apply", "-n", jobs.ns, "-f", "-", input=secret)
    name = harness.unique("s3crash")
    doc = store_job(name, store, bucket=bucket, env={"STANDIN_FAIL_AT_STEP": 12})
    jobs.apply(doc)
    done = poll.until(
        "job on S3 to succeed after one crash",
        lambda: (s := jobs.status(name)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=180,
        diagnosis=lambda: f"{jobs.status(name)}\n{jobs.events(name)}\n{jobs.pods_report(name)}",
    )
    assert done["phase"] == "Succeeded", done
    assert done["attempt"] == 2 and done["restarts"]["application"] == 1
    assert done["history"][1].get("resumedFromStep") == 10, done["history"]
    root = f"s3://{bucket}/runs/{name}"
    assert done["lastCheckpoint"]["step"] == 40
    assert done["lastCheckpoint"]["path"] == f"{root}/step-40", done["lastCheckpoint"]
    # no claim in the pods: the checkpoints are the bucket's
    for pod in jobs.pods(name):
        assert not [v for v in pod["spec"]["volumes"] if v.get("persistentVolumeClaim")]
    assert keys_under(store, bucket, f"runs/{name}/step-40/"), "step 40 lives in the bucket"
    assert not jobs.ckpt_dir(name).exists(), "nothing of the job's on the namespace's claim"
