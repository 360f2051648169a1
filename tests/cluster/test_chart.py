"""The chart and the worker pods pass the API server's checks, PodSecurity "restricted" too.

Server-side dry runs: the objects are validated and admitted by the real kube-apiserver (with
the PodSecurity admission plugin) but not persisted.
"""

from __future__ import annotations

import json

import pytest
import yaml

from fsdp_operator import api, decide, names, templates
from harness import stack
from localcluster import controlplane

pytestmark = pytest.mark.cluster
CHART = stack.ROOT / "charts" / "fsdp-operator"


def _restricted_namespace(cluster: controlplane.Cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")


def _dry_run(cluster: controlplane.Cluster, ns: str, docs: list[dict]) -> str:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    done = cluster.kubectl(
        "apply", "-n", ns, "--dry-run=server", "-f", "-", input=body, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stderr  # PodSecurity warnings, if any, come on stderr


def test_worker_pods_meet_pod_security_restricted(cluster: controlplane.Cluster) -> None:
    ns = "restricted-workers"
    _restricted_namespace(cluster, ns)
    cluster.kubectl("create", "priorityclass", "training-high", "--value=1000")  # the example's
    doc = yaml.safe_load((stack.ROOT / "examples" / "llama-1b-h100.yaml").read_text())
    spec = api.FSDPJobSpec.model_validate(doc["spec"])
    job = names.JobRef(name="llama-1b", namespace=ns, uid="0123456789abcdef")
    launch = decide.Launch(1, spec.replicas, "", excluded_nodes=("node-9",))
    pods = templates.worker_pods(job, spec, launch)
    for pod in pods:
        pod["metadata"].pop("ownerReferences")  # the owner does not exist in a dry run
    warnings = _dry_run(cluster, ns, [templates.service(job=job, spec=spec), *pods])
    assert "violate" not in warnings


def test_chart_renders_and_is_admitted_restricted(cluster: controlplane.Cluster) -> None:
    ns = "restricted-operator"
    _restricted_namespace(cluster, ns)
    docs = stack.render_chart(namespace=ns, release="fsdp-operator")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ClusterRole", "ClusterRoleBinding", "Deployment", "PodDisruptionBudget",
                     "Role", "RoleBinding", "ServiceAccount",
                     "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicy",
                     "ValidatingAdmissionPolicyBinding",
                     "ValidatingAdmissionPolicyBinding"]  # fmt: skip
    lease_role = next(d for d in docs if d["kind"] == "Role")
    assert lease_role["metadata"]["namespace"] == ns  # leader election: its own namespace only
    assert lease_role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                                    "verbs": ["get", "create", "update"]}]  # fmt: skip
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert role["rules"] == yaml.safe_load((CHART / "files" / "rbac-rules.yaml").read_text())
    flat = json.dumps(role["rules"])
    assert "secrets" not in flat and '"*"' not in flat and "pods/exec" not in flat
    warnings = _dry_run(cluster, ns, docs)
    assert "violate" not in warnings
