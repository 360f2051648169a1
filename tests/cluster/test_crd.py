"""The FSDPJob CRD on the real API server: installs, accepts the examples, rejects bad specs.

Each invalid spec is refused at admission (`kubectl apply` fails) with a message naming the
field, which is what a user typing a bad spec sees.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from harness import stack
from localcluster import controlplane

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.cluster

BASE: dict[str, Any] = {
    "apiVersion": "fsdpoperator.io/v1alpha1",
    "kind": "FSDPJob",
    "metadata": {"name": "probe"},
    "spec": {
        "replicas": 4,
        "minReplicas": 2,
        "nprocPerNode": 2,
        "image": "example/worker:1",
        "training": {"globalBatchSize": 16, "microBatchSize": 2},
        "checkpoint": {"root": "/ckpt", "claimName": "ckpt"},
    },
}


@pytest.fixture(scope="module")
def crd(cluster: controlplane.Cluster) -> controlplane.Cluster:
    stack.install_crd(cluster)
    return cluster


def _apply(cluster: controlplane.Cluster, ns: str, doc: dict[str, Any]) -> Any:
    return cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(doc), check=False)


def test_examples_apply_and_show_printer_columns(
    crd: controlplane.Cluster, kube_namespace: str
) -> None:
    # the FSDPJob examples (the claims and PriorityClass beside them, which name a storage
    # class to substitute, are the install guide's: tests/cluster/test_install_guide.py)
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        if "kind: FSDPJob\n" in path.read_text():
            crd.kubectl("apply", "-n", kube_namespace, "-f", str(path))
    out = crd.kubectl("get", "fsdpjobs", "-n", kube_namespace).stdout
    header = out.splitlines()[0].split()
    assert header == [
        *("NAME", "PHASE", "REASON", "WORLD", "STEP", "PROGRESS", "CHECKPOINT", "RESTARTS", "AGE")
    ]
    wide = crd.kubectl("get", "fsdpjobs", "-n", kube_namespace, "-o", "wide").stdout
    assert wide.splitlines()[0].split()[-5:] == [
        "ATTEMPT",
        "GOODPUT",
        "REMAINING",
        "QUEUE",
        "MESSAGE",
    ]
    assert {"tiny-cpu", "llama-1b"} <= {line.split()[0] for line in out.splitlines()[1:]}
    # the short name and the category work too
    assert "tiny-cpu" in crd.kubectl("get", "fsdpj", "-n", kube_namespace).stdout
    assert "llama-1b" in crd.kubectl("get", "training", "-n", kube_namespace).stdout


def test_defaults_are_filled_by_the_api_server(
    crd: controlplane.Cluster, kube_namespace: str
) -> None:
    assert _apply(crd, kube_namespace, BASE).returncode == 0
    got = crd.get_json("fsdpjob", "probe", "-n", kube_namespace)["spec"]
    assert got["failurePolicy"]["nodeLossGraceSeconds"] == 30
    assert got["failurePolicy"]["backoff"] == {"initialSeconds": 5, "maxSeconds": 300}
    assert got["training"]["model"]["preset"] == "tiny"
    assert got["checkpoint"]["intervalSteps"] == 500


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    node = doc["spec"]
    keys = path.split(".")
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    return doc


INVALID = [
    ("replicas", 0, "spec.replicas"),
    ("replicas", 5000, "spec.replicas"),
    ("minReplicas", 8, "minReplicas must be <= replicas"),
    ("nprocPerNode", 0, "spec.nprocPerNode"),
    ("image", "bad image; rm -rf /", "spec.image"),
    ("image", "x" * 600, "spec.image"),
    ("training.globalBatchSize", 10, "training.globalBatchSize"),
    ("training.microBatchSize", 3, "globalBatchSize"),
    ("training.steps", -1, "spec.training.steps"),
    ("training.model.preset", "huge", "spec.training.model.preset"),
    ("training.model.preset", "custom", "preset 'custom' requires dim"),
    ("training.model.factory", "os:system; echo", "spec.training.model.factory"),
    ("training.data.kind", "tokenFile", "path is required"),
    ("training.data.path", "/data/../../etc/passwd", "spec.training.data.path"),
    ("training.optimizer.lr", 0, "spec.training.optimizer.lr"),
    ("checkpoint.root", "/ckpt/../../etc", "spec.checkpoint.root"),
    ("checkpoint.root", "relative/path", "spec.checkpoint.root"),
    ("checkpoint.root", "/", "spec.checkpoint.root"),
    ("checkpoint.root", "/ckpt/$(HOME)", "spec.checkpoint.root"),
    ("checkpoint.keep", 0, "spec.checkpoint.keep"),
    ("checkpoint.claimName", "Bad_Name", "spec.checkpoint.claimName"),
    ("failurePolicy.backoff", {"initialSeconds": 100, "maxSeconds": 10}, "initialSeconds"),
    ("failurePolicy.nodeLossGraceSeconds", 999999, "nodeLossGraceSeconds"),
    ("template.spec.env", [{"name": "X", "value": "$(SECRET)"}], "template.spec.env[0].value"),
    ("template.spec.env", [{"name": "1X", "value": "v"}], "template.spec.env[0].name"),
    ("unknownField", 1, "unknownField"),
    ("checkpoint.autoInterval", {"minSteps": 100, "maxSteps": 10}, "maxSteps must be >= minSteps"),
    ("trainer", {"module": "a", "script": "/b.py"}, "exactly one of module and script"),
    ("trainer", {"script": "/opt/../etc/x.py"}, "spec.trainer.script"),
    ("checkpoint.completion", "Guess", "spec.checkpoint.completion"),
    ("template.spec.tolerations", [{"key": "gpu", "operator": "Equals"}], "Exists or Equal"),
    ("template.spec.tolerations", [{"key": "gpu", "effect": "NoRun"}], "effect must be"),
    ("template.spec.tolerations", [{"value": "x"}], "without a key must have operator Exists"),
    ("template.spec.tolerations", [{"key": "g", "operator": "Exists", "value": "x"}], "no value"),
    ("template.spec.tolerations", [{"key": "g", "tolerationSeconds": 5}], "needs effect NoExecute"),
]


@pytest.mark.parametrize(
    ("path", "value", "field"), INVALID, ids=[f"{p}={v!r}"[:40] for p, v, _ in INVALID]
)
def test_invalid_spec_rejected_naming_the_field(
    crd: controlplane.Cluster, kube_namespace: str, path: str, value: Any, field: str
) -> None:
    done = _apply(crd, kube_namespace, _with(path, value))
    assert done.returncode != 0, f"accepted: {path}={value!r}"
    assert field in done.stderr, done.stderr
    assert "modulus by zero" not in done.stderr, "only the real error, not a rule's crash"


def test_the_tolerations_gpu_nodes_want_are_admitted(
    crd: controlplane.Cluster, kube_namespace: str
) -> None:
    tolerations = [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
        {"key": "pool", "operator": "Equal", "value": "train", "effect": "PreferNoSchedule"},
        {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "tolerationSeconds": 30},
    ]
    done = _apply(crd, kube_namespace, _with("template.spec.tolerations", tolerations))
    assert done.returncode == 0, done.stderr


def test_immutable_fields(crd: controlplane.Cluster, kube_namespace: str) -> None:
    assert _apply(crd, kube_namespace, BASE).returncode == 0
    for path, value, message in [
        ("nprocPerNode", 4, "nprocPerNode is immutable"),
        ("training.globalBatchSize", 32, "immutable"),
        ("checkpoint.root", "/other", "checkpoint.root is immutable"),
    ]:
        done = _apply(crd, kube_namespace, _with(path, value))
        assert done.returncode != 0 and message in done.stderr, done.stderr
    # what may change does change: replicas (a resize) and steps (extend the run)
    edit = _with("replicas", 2)
    edit["spec"]["minReplicas"] = 1
    edit["spec"]["training"]["steps"] = 500
    assert _apply(crd, kube_namespace, edit).returncode == 0


def test_the_api_server_serves_the_pod_types_the_crd_was_generated_from(
    cluster: controlplane.Cluster,
) -> None:
    """kubetypes.py, made from the module's OpenAPI file, is what this API server itself serves:
    so what the CRD admits in a pod part is what the server's pod schema admits."""
    from hack import kubegen

    served = json.loads(cluster.kubectl("get", "--raw", "/openapi/v3/api/v1").stdout)
    committed = (ROOT / "operator" / "fsdp_operator" / "types" / "kubetypes.py").read_text()
    assert kubegen.render(served) == committed


def test_an_object_store_is_admitted_and_its_bucket_and_prefix_are_immutable(
    crd: controlplane.Cluster, kube_namespace: str
) -> None:
    store = {"bucket": "team-ckpt", "prefix": "runs", "credentialsSecret": "s3-keys"}
    doc = copy.deepcopy(BASE)
    doc["spec"]["checkpoint"] = {"root": "/ckpt", "objectStore": store}
    doc["spec"]["serviceAccountName"] = "trainer"
    done = _apply(crd, kube_namespace, doc)
    assert done.returncode == 0, done.stderr
    for change, value in [("bucket", "other-ckpt"), ("prefix", "elsewhere")]:
        moved = copy.deepcopy(doc)
        moved["spec"]["checkpoint"]["objectStore"][change] = value
        done = _apply(crd, kube_namespace, moved)
        assert done.returncode != 0, f"{change} changed"
        assert "checkpoint.objectStore (its bucket and prefix) is immutable" in done.stderr
    both = copy.deepcopy(doc)
    both["metadata"]["name"] = "both"
    both["spec"]["checkpoint"]["claimName"] = "ckpt"
    done = _apply(crd, kube_namespace, both)
    assert done.returncode != 0 and "spec.checkpoint.objectStore" in done.stderr, done.stderr
