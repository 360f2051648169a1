"""The cluster's object store: an S3 server (versitygw) started with the control plane, its data
on the host under the cluster's state dir, reached by pods at its cluster DNS name with the
keys of a Secret, as a job's checkpoint.objectStore reaches it, conditional writes included.
"""

from __future__ import annotations

import json

import pytest

from localcluster import objectstore
from localcluster.controlplane import Cluster
from tests.cluster._podkit import JSON, apply, python_pod, terminated, wait_phase

pytestmark = pytest.mark.cluster

# Runs in the pod: the stdlib client (objectstore.py's own text) against the Service's name,
# with the keys the kubelet took from the Secret; prints what it saw as one JSON line.
POD_MAIN = """
import json, os, sys, types
mod = types.ModuleType("lc_objectstore")
sys.modules[mod.__name__] = mod
exec(SOURCE, mod.__dict__)
keys, url = mod.environ_keys(), os.environ["AWS_ENDPOINT_URL_S3"] + "/" + os.environ["BUCKET"]
put = mod.request("PUT", url + "/from-pod/step-1/COMPLETE.json", keys=keys, body=b"sealed")
again = mod.request("PUT", url + "/from-pod/step-1/COMPLETE.json", keys=keys, body=b"zombie",
                    headers={"If-None-Match": "*"})
get = mod.request("GET", url + "/from-host.txt", keys=keys)
print(json.dumps({"put": put.status, "again": again.status, "get": get.body.decode()}))
"""


def client_pod(store: objectstore.ObjectStore, *, bucket: str, secret: str) -> JSON:
    """A restricted pod with the AWS variables a job's pods get (keys by secretKeyRef)."""
    code = f"SOURCE = {objectstore.source()!r}\n{POD_MAIN}"
    pod = python_pod("s3-client", code)
    env: list[JSON] = [
        {"name": "AWS_ENDPOINT_URL_S3", "value": store.cluster_endpoint},
        {"name": "BUCKET", "value": bucket},
    ]
    env += [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for key in objectstore.SECRET_KEYS
    ]
    pod["spec"]["containers"][0]["env"] = env
    return pod


def test_the_s3_server_runs_with_the_cluster_its_data_on_the_host(cluster: Cluster) -> None:
    store = cluster.object_store
    assert store.answers(), "the root keys list the buckets"
    assert cluster.component_status()["s3"]
    bucket = "lc-host-check"
    store.create_bucket(bucket)
    assert store.request("PUT", f"/{bucket}/k", b"v").status == 200
    assert (cluster.state_dir / "s3" / bucket / "k").read_bytes() == b"v"
    wrong = objectstore.ObjectStore(host=store.host, port=store.port, keys=objectstore.Keys.fresh())
    assert wrong.request("GET", f"/{bucket}/k").status != 200, "other keys are refused"


def test_a_pod_reaches_it_by_its_cluster_name_with_the_secrets_keys(
    cluster: Cluster, kube_namespace: str
) -> None:
    store = cluster.object_store
    bucket = kube_namespace  # t-<hex>: a valid bucket name, one per test
    store.create_bucket(bucket)
    assert store.request("PUT", f"/{bucket}/from-host.txt", b"hello pod").status == 200
    apply(cluster, kube_namespace, store.secret("s3-keys"))
    apply(cluster, kube_namespace, client_pod(store, bucket=bucket, secret="s3-keys"))
    done = wait_phase(cluster, kube_namespace, "s3-client", ("Succeeded", "Failed"), timeout=90)
    logs = cluster.kubectl("logs", "s3-client", "-n", kube_namespace).stdout
    assert done["status"]["phase"] == "Succeeded", (terminated(done), logs)
    seen = json.loads(logs.strip().splitlines()[-1])
    assert seen == {"put": 200, "again": 412, "get": "hello pod"}, "create-only write refused"
    marker = store.request("GET", f"/{bucket}/from-pod/step-1/COMPLETE.json")
    assert marker.body == b"sealed", "the first writer's marker stands"
