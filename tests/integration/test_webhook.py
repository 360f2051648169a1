"""A mesh's mutating webhook in the job's namespace (issue 46): a real HTTPS webhook server on
this host, registered with the API server by URL, injects a proxy sidecar into every pod of
the namespace's FSDPJobs, as a service mesh does. Injected after the operator rendered the
pod, the sidecar is judged by what it adds: a restricted one runs beside the ranks through a
crash and is never a rank; one that adds a capability (istio-init's NET_ADMIN) is refused by
the restricted admission policy, and the job fails naming it, with no pod made.
"""

from __future__ import annotations

import base64
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from localcluster import images, kueue, poll
from tests.integration import harness

pytestmark = pytest.mark.cluster

ANNOTATION = "mesh.example.com/injected"
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "runAsUser": 1000,
    "seccompProfile": {"type": "RuntimeDefault"},
}
PROXY = {
    "name": "mesh-proxy",
    "image": images.WORKER,
    "restartPolicy": "Always",
    "command": ["python", "-c", "import time\nprint('proxy up', flush=True)\ntime.sleep(86400)"],
    "securityContext": RESTRICTED,
}
MESH_INIT = {  # what istio-init adds: iptables rules need NET_ADMIN
    "name": "mesh-init",
    "image": images.WORKER,
    "command": ["python", "-c", "print('rules set')"],
    "securityContext": {
        **RESTRICTED,
        "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
    },
}


class _Mesh(http.server.ThreadingHTTPServer):
    inject: list[dict[str, Any]]
    seen: list[str]


class _Injector(http.server.BaseHTTPRequestHandler):
    server: _Mesh

    def do_POST(self) -> None:
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        pod = request["object"]
        ops = _patch(pod, self.server.inject)
        self.server.seen.append(pod["metadata"].get("name") or pod["metadata"]["generateName"])
        body = json.dumps(
            {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": request["uid"],
                    "allowed": True,
                    "patchType": "JSONPatch",
                    "patch": base64.b64encode(json.dumps(ops).encode()).decode(),
                },
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _patch(pod: dict[str, Any], inject: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A mesh's JSON patch: its containers first among the init containers, its annotation."""
    spec, meta = pod["spec"], pod["metadata"]
    if spec.get("initContainers"):
        ops = [
            {"op": "add", "path": f"/spec/initContainers/{i}", "value": c}
            for i, c in enumerate(inject)
        ]
    else:
        ops = [{"op": "add", "path": "/spec/initContainers", "value": inject}]
    key = ANNOTATION.replace("~", "~0").replace("/", "~1")
    if meta.get("annotations"):
        return [*ops, {"op": "add", "path": f"/metadata/annotations/{key}", "value": "true"}]
    return [*ops, {"op": "add", "path": "/metadata/annotations", "value": {ANNOTATION: "true"}}]


@pytest.fixture
def mesh(jobs: harness.Jobs, tmp_path: Path) -> Iterator[_Mesh]:
    """The webhook server, and its MutatingWebhookConfiguration for this test's namespace
    (pods with the operator's job label only); both gone after the test."""
    ca = kueue.write_certs(tmp_path / "certs")
    server = _Mesh(("127.0.0.1", 0), _Injector)
    server.inject, server.seen = [PROXY], []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "certs" / "tls.crt", tmp_path / "certs" / "tls.key")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    name = f"mesh-{jobs.ns}"
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "inject.mesh.example.com",
                "clientConfig": {
                    "url": f"https://127.0.0.1:{server.server_address[1]}/inject",
                    "caBundle": base64.b64encode(ca).decode(),
                },
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": jobs.ns}},
                "objectSelector": {
                    "matchExpressions": [{"key": "fsdpoperator.io/job", "operator": "Exists"}]
                },
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "failurePolicy": "Fail",
                "timeoutSeconds": 5,
            }
        ],
    }
    jobs.cluster.kubectl("apply", "-f", "-", input=json.dumps(config))
    try:
        yield server
    finally:
        jobs.cluster.kubectl("delete", "mutatingwebhookconfiguration", name, check=False)
        server.shutdown()


def _proxied(jobs: harness.Jobs, name: str, attempt: int) -> list[dict[str, Any]]:
    """The attempt's two running pods once each has the mesh's proxy running; [] until then."""
    pods = jobs.running_pods(name, attempt)
    if len(pods) != 2:
        return []
    for pod in pods:
        states = {s["name"]: s for s in pod["status"].get("initContainerStatuses", [])}
        if "running" not in states.get("mesh-proxy", {}).get("state", {}):
            return []
    return pods


def test_a_meshs_injected_sidecar_is_judged_by_what_it_adds(
    jobs: harness.Jobs, operator: harness.Operator, mesh: _Mesh
) -> None:
    name = harness.unique("mesh")
    jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 12}, training={"steps": 60}))
    story = lambda: jobs.diagnosis(name)  # noqa: E731
    # Attempt 1's rank crashes at step 12; attempt 2's pods are injected again.
    pods = poll.until(
        "attempt 2's pods running with the mesh's proxy",
        lambda: _proxied(jobs, name, 2),
        timeout=180,
        diagnosis=story,
    )
    for pod in pods:
        assert pod["metadata"]["annotations"][ANNOTATION] == "true"
        assert pod["spec"]["initContainers"][0]["name"] == "mesh-proxy", pod["spec"]
        log = jobs.cluster.kubectl(
            "logs", "-n", jobs.ns, pod["metadata"]["name"], "-c", "mesh-proxy"
        )
        assert "proxy up" in log.stdout
    done = poll.until(
        "the meshed job to succeed",
        lambda: (s := jobs.status(name)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=180,
        diagnosis=story,
    )
    # The proxy, still running when the ranks ended, kept no pod from completing and failed
    # no rank: one crash, one restart.
    assert done["phase"] == "Succeeded" and done["attempt"] == 2, done
    assert done["restarts"]["application"] == 1, done["restarts"]
    assert len(mesh.seen) >= 4, mesh.seen  # both attempts' pods (and the operator's dry runs)

    # A mesh whose init container adds NET_ADMIN: the restricted policy refuses the pod the
    # webhook made; the operator's dry run meets that refusal first and names it.
    mesh.inject = [MESH_INIT, PROXY]
    meshed = harness.unique("netadmin")
    jobs.apply(harness.job_doc(meshed, training={"steps": 60}))
    failed = poll.until(
        f"{meshed} Failed",
        lambda: (s := jobs.status(meshed)).get("phase") == "Failed" and s,
        timeout=60,
        diagnosis=lambda: jobs.diagnosis(meshed),
    )
    assert failed["reason"] == "InvalidSpec", failed
    assert "refuses the worker pod" in failed["message"], failed["message"]
    assert "NET_BIND_SERVICE" in failed["message"], failed["message"]
    assert jobs.pods(meshed) == []
