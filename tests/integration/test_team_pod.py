"""The team's own pod on the local cluster (issue 46): a job with its own ServiceAccount, an
init container that prepares data and a native sidecar that uses the pod's token to read a
Secret through the API server (the workload-identity pattern: no static key in the spec) and
reports what the init container prepared. One job (a cluster and a job shared, to keep the
suite short) through a rank's crash and a lost node: every attempt's pods keep the identity,
the prepared data and the sidecar, and the sidecar is never taken for a rank.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from fsdp_operator.types import names
from localcluster import faults as lf
from localcluster import images, poll
from tests.integration import harness

pytestmark = pytest.mark.cluster

SA, SECRET, KEY = "trainer", "tracker-key", "s3cr3t-tracker-value"

# The sidecar: the pod's own token, the API server through the `kubernetes` Service, the
# Secret its Role grants; then what the init container left in the shared volume. Prints one
# line a check (the test reads the container's log), then keeps running, as a shipper would.
SIDECAR_CODE = """
import base64, hashlib, json, os, ssl, time, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
token = open(f"{sa}/token").read()
ns = open(f"{sa}/namespace").read()
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
url = f"https://{host}:{port}/api/v1/namespaces/{ns}/secrets/{os.environ['SECRET_NAME']}"
ctx = ssl.create_default_context(cafile=f"{sa}/ca.crt")
while True:
    try:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        doc = json.load(urllib.request.urlopen(req, context=ctx, timeout=5))
        value = base64.b64decode(doc["data"]["token"]).decode()
        prepared = open("/data/prepared").read().strip()
        print(f"identity: read the secret, {len(value)} bytes; data: {prepared}", flush=True)
        if hashlib.sha256(value.encode()).hexdigest() == os.environ["EXPECT_SHA256"]:
            print("identity: the secret is the team's", flush=True)
    except Exception as exc:
        print(f"identity: failed: {exc!r}", flush=True)
    time.sleep(5)
"""


def _team_objects(ns: str) -> list[dict[str, Any]]:
    """The ServiceAccount, the Secret, and a Role that lets the account read that one Secret."""
    meta = {"namespace": ns}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, **meta}},
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, **meta},
            "stringData": {"token": KEY},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "read-tracker-key", **meta},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": [SECRET],
                    "verbs": ["get"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "trainer-reads-tracker-key", **meta},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "read-tracker-key",
            },
            "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": ns}],
        },
    ]


def _team_job(name: str) -> dict[str, Any]:
    prepare = {
        "name": "prepare-data",
        "image": images.WORKER,
        "command": [
            "python",
            "-c",
            "import os; open('/data/prepared', 'w').write('shards ready on ' + os.uname()[1])",
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    sidecar = {
        "name": "identity",
        "image": images.WORKER,
        "restartPolicy": "Always",
        "command": ["python", "-c", SIDECAR_CODE],
        "env": [
            {"name": "EXPECT_SHA256", "value": hashlib.sha256(KEY.encode()).hexdigest()},
            {"name": "SECRET_NAME", "value": SECRET},
        ],
        "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
    }
    doc = harness.job_doc(
        name,
        serviceAccountName=SA,
        env={"STANDIN_FAIL_AT_STEP": 12},
        training={"steps": 150},
    )
    pod = doc["spec"]["template"]["spec"]
    pod["initContainers"] = [prepare, sidecar]
    pod["volumes"] = [{"name": "data", "emptyDir": {"sizeLimit": "1Mi"}}]
    return doc


def _sidecar_log(jobs: harness.Jobs, pod: str) -> str:
    done = jobs.cluster.kubectl("logs", "-n", jobs.ns, pod, "-c", "identity", check=False)
    return done.stdout if done.returncode == 0 else ""


def _sidecars(jobs: harness.Jobs, name: str) -> str:
    """Each pod's sidecar log, for a wait that ran out."""
    return "".join(
        f"--- {p['metadata']['name']} identity:\n{_sidecar_log(jobs, p['metadata']['name'])}\n"
        for p in jobs.pods(name)
    )


def _attempts_pods_say(jobs: harness.Jobs, name: str, attempt: int) -> list[dict[str, Any]]:
    """The attempt's running pods, once every one's sidecar read the Secret as the job's
    account and saw its own pod's prepared data; [] until then."""
    pods = jobs.running_pods(name, attempt)
    if len(pods) != 2:
        return []
    for pod in pods:
        log = _sidecar_log(jobs, pod["metadata"]["name"])
        if "identity: the secret is the team's" not in log or "shards ready on" not in log:
            return []
    return pods


def test_the_teams_identity_data_and_sidecar_survive_a_crash_and_a_lost_node(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    for obj in _team_objects(jobs.ns):
        jobs.cluster.kubectl("apply", "-f", "-", input=json.dumps(obj))
    name = harness.unique("team")
    jobs.apply(_team_job(name))
    story = lambda: jobs.diagnosis(name)  # noqa: E731

    def reads(attempt: int) -> list[dict[str, Any]]:
        return poll.until(
            f"attempt {attempt}'s sidecars reading the team's Secret",
            lambda: _attempts_pods_say(jobs, name, attempt),
            timeout=180,
            diagnosis=lambda: f"{story()}\n{_sidecars(jobs, name)}",
        )

    # Attempt 1's rank crashes at step 12; attempt 2 comes back with all of it.
    pods = reads(2)
    for pod in pods:
        assert pod["spec"]["serviceAccountName"] == SA, pod["spec"]
        assert KEY not in json.dumps(
            pod["spec"]
        ), "the key is the sidecar's to read, not the spec's"
    s = jobs.status(name)
    assert s["history"][0]["cause"] == "Crash", s["history"]
    restarted = [c for c in s.get("conditions", []) if c["type"] == "SidecarsRestarted"]
    assert all(c["status"] != "True" for c in restarted), restarted
    # The node of rank 1 is lost; attempt 3 comes back elsewhere with all of it again.
    lost = next(p for p in pods if p["metadata"]["name"].endswith("-1"))["spec"]["nodeName"]
    faults = lf.Faults.for_cluster(operator.cluster.state_dir)
    faults.lose_node(lost, freeze=names.Label.JOB.value)
    try:
        third = reads(3)
    finally:
        faults.restore_node(lost)
    assert all(p["spec"]["nodeName"] != lost for p in third)
    done = poll.until(
        "the team's job to succeed",
        lambda: (s := jobs.status(name)).get("phase") in ("Succeeded", "Failed") and s,
        timeout=240,
        diagnosis=story,
    )
    assert done["phase"] == "Succeeded", done
    assert [h["cause"] for h in done["history"][:2]] == ["Crash", "NodeLost"], done["history"]
    # Only the worker container decides: the sidecar, still running at the end, failed no rank.
    assert done["restarts"]["application"] == 1 and done["attempt"] == 3, done["restarts"]
