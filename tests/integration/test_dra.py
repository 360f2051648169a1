"""DRA (issue 46): a job whose pods claim a device through a ResourceClaimTemplate, as GPUs
and NVL72 compute domains are claimed on clusters with a DRA driver. No example DRA driver
can be built here (sigs.k8s.io/dra-example-driver is not served to this machine), so this is
the half the local cluster can show: the operator renders the pod-level claims, the API
server admits the pods, the control plane makes each pod its claim from the template, the
scheduler finds no device and says so, and the job says it in the scheduler's words, with
what to check; deleting the job collects the claims with the pods.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from localcluster import poll
from tests.integration import harness

pytestmark = pytest.mark.cluster

DRIVER = "gpu.example.com"


def _objects(ns: str, device_class: str) -> list[dict[str, Any]]:
    """A DeviceClass of a driver no node runs, and a template of one device of it."""
    return [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": device_class},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]},
        },
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": "one-gpu", "namespace": ns},
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}]
                    }
                }
            },
        },
    ]


def _claims(jobs: harness.Jobs) -> list[dict[str, Any]]:
    found = jobs.cluster.get_json("resourceclaims", "-n", jobs.ns)
    return list(found["items"])


def test_a_jobs_device_claims_are_rendered_admitted_and_told_when_no_driver_has_them(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    device_class = f"gpu-{jobs.ns}"
    for obj in _objects(jobs.ns, device_class):
        jobs.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    try:
        name = harness.unique("dra")
        doc = harness.job_doc(
            name,
            resources={"claims": [{"name": "gpu"}]},
            failurePolicy={"pendingTimeoutSeconds": 600},
        )
        pod_spec = doc["spec"]["template"]["spec"]
        pod_spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        jobs.apply(doc)
        story = lambda: jobs.diagnosis(name)  # noqa: E731

        def told() -> dict[str, Any] | None:
            s = jobs.status(name)
            cond = next((c for c in s.get("conditions", []) if c["type"] == "PodsScheduled"), None)
            return cond if cond is not None and cond["status"] == "False" else None

        cond = poll.until("the scheduler's reason in the job", told, timeout=90, diagnosis=story)
        assert cond["reason"] == "DevicesNotAllocated", cond
        assert "cannot allocate all claims" in cond["message"], cond
        assert "kubectl get resourceslices" in cond["message"], cond
        pods = jobs.pods(name)
        assert len(pods) == 2 and all(p["status"]["phase"] == "Pending" for p in pods), pods
        for pod in pods:
            assert pod["spec"]["resourceClaims"] == pod_spec["resourceClaims"]
            worker = next(c for c in pod["spec"]["containers"] if c["name"] == "worker")
            assert worker["resources"]["claims"] == [{"name": "gpu"}], worker["resources"]
        # Each pod got its own claim from the template, owned by the pod.
        claims = poll.until(
            "a claim per pod", lambda: len(c := _claims(jobs)) == 2 and c, timeout=30
        )
        owners = sorted(c["metadata"]["ownerReferences"][0]["name"] for c in claims)
        assert owners == sorted(p["metadata"]["name"] for p in pods)
        assert all(c["spec"]["devices"]["requests"][0]["name"] == "gpu" for c in claims)
        jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
        poll.until("the claims collected with the pods", lambda: not _claims(jobs), timeout=90)
    finally:
        jobs.cluster.kubectl("delete", "deviceclass", device_class, check=False)
