"""Security on the real cluster: hostile specs, the chart's admission policies, ownership by uid.

The operator runs with the chart's ClusterRole and admission policies (harness.install_rbac);
every refusal is what a user sees: a failed `kubectl apply`, or a job Failed with a reason.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest

from fsdp_operator.types import api, names
from localcluster import controlplane, poll
from tests import hostile_specs as hs
from tests.cluster import _podkit as podkit
from tests.integration import harness

pytestmark = pytest.mark.cluster


def _job(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "fsdpoperator.io/v1alpha1",
        "kind": "FSDPJob",
        "metadata": {"name": name},
        "spec": spec,
    }


def _apply(jobs: harness.Jobs, doc: dict[str, Any], dry_run: str = "", **kw: Any) -> Any:
    flags = [f"--dry-run={dry_run}"] if dry_run else []
    return jobs.cluster.kubectl(
        "apply", "-n", jobs.ns, *flags, "-f", "-", input=json.dumps(doc), check=False, **kw
    )


ADMISSION = [c for c in hs.CASES if c.where is hs.Where.ADMISSION]
OPERATOR = [c for c in hs.CASES if c.where is hs.Where.OPERATOR]


def _profile_lists(jobs: harness.Jobs, *namespaces: str) -> None:
    """The cluster admin lists `namespaces` in the test profile; returns once admission says
    so for jobs.ns (the policy reads its parameters from a watch: a moment behind the patch)."""
    patch = json.dumps({"spec": {"namespaces": list(namespaces)}})
    jobs.cluster.kubectl("patch", api.PROFILE_PLURAL, hs.PROFILE, "--type=merge", "-p", patch)
    probe = _job(
        "probe", hs.spec_of(hs.Case("probe", hs.Where.ADMISSION, "", lambda d: None, profile=True))
    )
    want = jobs.ns in namespaces

    def admitted() -> bool:
        done = _apply(jobs, probe, dry_run="server")
        return (done.returncode == 0) == want

    poll.until(f"profile {hs.PROFILE} lists {namespaces} at admission", admitted, timeout=30)


def test_hostile_specs_are_refused_at_admission_naming_the_field(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    refused = []
    unlisted = [c for c in ADMISSION if not c.listed]
    rest = [c for c in ADMISSION if c.listed]
    # the profile's namespace rule first, then every other case from a namespace it lists
    for cases, listed in ((unlisted, ["someone-else"]), (rest, [jobs.ns])):
        _profile_lists(jobs, *listed)
        for case in cases:
            done = _apply(jobs, _job(f"h-{case.id}", hs.spec_of(case)))
            assert done.returncode != 0, f"{case.id}: admitted"
            assert case.field in done.stderr, f"{case.id}: {done.stderr}"
            refused.append(case.id)
    assert jobs.pods() == [] and sorted(refused) == sorted(c.id for c in ADMISSION)
    names = jobs.cluster.kubectl("get", "fsdpjobs", "-n", jobs.ns, "-o", "name").stdout
    assert names.strip() == ""


def test_hostile_specs_the_api_server_admits_fail_with_invalid_spec_and_no_pods(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    for case in OPERATOR:
        assert _apply(jobs, _job(f"h-{case.id}", hs.spec_of(case))).returncode == 0, case.id
    for case in OPERATOR:
        name = f"h-{case.id}"
        s = poll.until(
            f"{name} Failed",
            lambda n=name: (s := jobs.status(n)).get("phase") == "Failed" and s,
            timeout=30,
            diagnosis=operator.log_tail,
        )
        assert s["reason"] == "InvalidSpec", (case.id, s)
        assert case.field in s["message"], (case.id, s["message"])
        failed = next(c for c in s["conditions"] if c["type"] == "Failed")
        assert failed["status"] == "True" and failed["reason"] == "InvalidSpec"
    assert jobs.pods() == []  # no case created a pod, not even for a moment of a pass
    # the operator is still healthy: alive, and a good job next to the hostile ones runs
    assert urllib.request.urlopen(operator.liveness_url, timeout=5).status == 200
    good = harness.unique("good")
    jobs.apply(harness.job_doc(good, training={"steps": 400}))
    poll.until(
        "good job Running",
        lambda: jobs.status(good).get("phase") == "Running",
        timeout=60,
        diagnosis=operator.log_tail,
    )


def _pod(name: str, **container_security: Any) -> dict[str, Any]:
    security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        **container_security,
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{"name": "c", "image": "fsdp-worker:test", "securityContext": security}],
        },
    }


def _create(cluster: controlplane.Cluster, ns: str, pod: dict[str, Any], **kw: Any) -> Any:
    return cluster.kubectl(
        "create", "--dry-run=server", "-n", ns, "-f", "-", input=json.dumps(pod), check=False, **kw
    )


def test_admission_policy_refuses_unrestricted_pods_from_the_operators_credentials(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """The namespace enforces no Pod Security level: only the chart's policy stands in the way."""
    cluster, ns, creds = jobs.cluster, jobs.ns, operator.kubeconfig
    assert _create(cluster, ns, _pod("fine"), kubeconfig=creds).returncode == 0
    privileged = _pod("priv", privileged=True, allowPrivilegeEscalation=True)
    done = _create(cluster, ns, privileged, kubeconfig=creds)
    # restricted-pods ("may not run privileged containers") or runtime-profile-pods ("privileged
    # or uid 0 only for a sidecar its runtime profile runs so"): the API server says one
    assert done.returncode != 0 and "privileged" in done.stderr
    host = _pod("host")
    host["spec"]["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    done = _create(cluster, ns, host, kubeconfig=creds)
    assert done.returncode != 0, done.stdout
    assert any(w in done.stderr for w in ("may only use configMap", "hostPath / only as")), done
    root = _pod("root")
    root["spec"]["securityContext"] = {"runAsUser": 0}
    done = _create(cluster, ns, root, kubeconfig=creds)
    assert done.returncode != 0 and "non-root" in done.stderr
    # the policy binds the operator's account only: an admin's privileged pod is admitted here
    assert _create(cluster, ns, privileged).returncode == 0


def test_fsdpjob_creators_must_be_allowed_to_create_pods(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    cluster, ns = jobs.cluster, jobs.ns
    cluster.kubectl("create", "serviceaccount", "alice", "-n", ns)
    cluster.kubectl(
        "create",
        "role",
        "jobs-only",
        "-n",
        ns,
        "--verb=get,list,create,patch",
        "--resource=fsdpjobs.fsdpoperator.io",
    )
    cluster.kubectl(
        "create",
        "rolebinding",
        "alice-jobs",
        "-n",
        ns,
        "--role=jobs-only",
        f"--serviceaccount={ns}:alice",
    )
    alice = cluster.kubeconfig_for_serviceaccount(ns, "alice")
    doc = harness.job_doc(harness.unique("alice"))
    done = _apply(jobs, doc, kubeconfig=alice)
    assert done.returncode != 0
    assert f"system:serviceaccount:{ns}:alice may not create pods in namespace {ns}" in done.stderr
    cluster.kubectl("create", "role", "pods", "-n", ns, "--verb=create", "--resource=pods")
    cluster.kubectl(
        "create",
        "rolebinding",
        "alice-pods",
        "-n",
        ns,
        "--role=pods",
        f"--serviceaccount={ns}:alice",
    )
    poll.until(
        "alice admitted once she may create pods",
        lambda: _apply(jobs, doc, kubeconfig=alice).returncode == 0,
    )


def test_spares_under_a_kueue_queue_are_refused_at_admission(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """The CRD's rules cannot read labels: the chart's policy refuses spares under a queue at
    `kubectl apply`, naming the field, whether the job or its pod template names the queue."""
    queue = {"kueue.x-k8s.io/queue-name": "team-a"}
    spares = {"spares": 1, "failurePolicy": {"inPlaceRestarts": 1}}
    on_job = {**harness.job_doc(harness.unique("spq"), **spares)}
    on_job["metadata"]["labels"] = queue
    on_template = harness.job_doc(
        harness.unique("spq"), template={"metadata": {"labels": queue}}, **spares
    )
    for doc in (on_job, on_template):
        done = _apply(jobs, doc, dry_run="server")
        assert done.returncode != 0, done.stdout
        assert "spec.spares=1 is not allowed under a Kueue queue" in done.stderr, done.stderr
    alone = harness.job_doc(harness.unique("spq"), **spares)  # no queue: spares are fine
    assert _apply(jobs, alone, dry_run="server").returncode == 0


def _profile_pod(name: str, *caps: str, label: str | None = hs.PROFILE, **spec: Any) -> Any:
    pod = _pod(name, capabilities={"drop": ["ALL"], "add": list(caps)})
    pod["spec"]["containers"][0]["image"] = f"{hs.PROFILE_REGISTRY}/fsdp-worker:test"
    if label is not None:
        pod["metadata"]["labels"] = {names.Label.RUNTIME_PROFILE.value: label}
    pod["spec"]["containers"][0].update(spec)
    return pod


def test_a_job_under_its_runtime_profile_gets_ipc_lock_and_nothing_more(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """The profile the chart made (hs.PROFILE_SPEC) grants IPC_LOCK and rdma/ib to jobs in the
    namespaces it lists; the API server holds the operator's own credentials to it."""
    cluster, ns, creds = jobs.cluster, jobs.ns, operator.kubeconfig
    _profile_lists(jobs, ns)
    name = harness.unique("ib")
    doc = harness.job_doc(
        name,
        runtimeProfile=hs.PROFILE,
        image=f"{hs.PROFILE_REGISTRY}/fsdp-worker:test",
        template={"spec": {"capabilities": ["IPC_LOCK"]}},
    )
    jobs.apply(doc)
    pods = poll.until(
        f"{name}'s pods created",
        lambda: len(p := jobs.pods(name)) == 2 and p,
        timeout=60,
        diagnosis=lambda: f"{jobs.status(name)}\n{operator.log_tail()}",
    )
    for pod in pods:
        c = pod["spec"]["containers"][0]
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
        assert c["resources"]["limits"]["rdma/ib"] == "2"
        assert {"name": "NCCL_IB_HCA", "value": "mlx5"} in c["env"]
        assert pod["metadata"]["labels"][names.Label.RUNTIME_PROFILE] == hs.PROFILE
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", ns, "--wait=false")

    # The same pods, made by hand with the operator's credentials: only what the profile grants.
    assert _create(cluster, ns, _profile_pod("ok", "IPC_LOCK"), kubeconfig=creds).returncode == 0
    refusals = {
        "ghost": (_profile_pod("ghost", "IPC_LOCK", label="made-up"), "does not bind"),
        "no-profile": (_profile_pod("none", "IPC_LOCK", label=None), "NET_BIND_SERVICE"),
        "not-granted": (_profile_pod("nice", "SYS_NICE"), "runtime profile gpu-ib grants"),
        "ceiling": (_profile_pod("admin", "SYS_ADMIN"), "NET_BIND_SERVICE"),
        "registry": (_profile_pod("reg", image="docker.io/evil/x:1"), "not from a registry"),
        "rdma": (_profile_pod("rdma", resources={"limits": {"rdma/ib": "4"}}), "rdma/"),
    }
    for case, (pod, words) in refusals.items():
        done = _create(cluster, ns, pod, kubeconfig=creds)
        assert done.returncode != 0 and words in done.stderr, (case, done.stderr)
    # a namespace the profile does not list
    done = _create(cluster, "default", _profile_pod("elsewhere", "IPC_LOCK"), kubeconfig=creds)
    assert done.returncode != 0 and "may not use runtime profile" in done.stderr, done.stderr


def _as_new(pod: dict[str, Any], name: str) -> dict[str, Any]:
    """An operator-made pod as a fresh create: its labels and spec, a new name, no node."""
    meta = pod["metadata"]
    spec = {k: v for k, v in pod["spec"].items() if k != "nodeName"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": meta["labels"],
            "annotations": meta.get("annotations", {}),
        },
        "spec": json.loads(json.dumps(spec)),
    }


def test_a_fabric_profile_admits_its_host_network_path_and_daemon_and_nothing_else(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """A fabric's profile (hs.FABRIC_SPEC, as GPUDirect-TCPX needs) gives the pods the host's
    network, a host directory and a privileged root daemon: the chart's policies admit exactly
    those, for pods under that profile, and refuse each one changed by a field."""
    cluster, ns, creds = jobs.cluster, jobs.ns, operator.kubeconfig
    patch = json.dumps({"spec": {"namespaces": [ns]}})
    cluster.kubectl("patch", api.PROFILE_PLURAL, hs.FABRIC_PROFILE, "--type=merge", "-p", patch)
    name = harness.unique("fabric")
    jobs.apply(
        harness.job_doc(
            name, runtimeProfile=hs.FABRIC_PROFILE, image=f"{hs.PROFILE_REGISTRY}/fsdp-worker:test"
        )
    )
    # the policy reads the profile from a watch: the operator's first tries may be refused
    pods = poll.until(
        f"{name}'s pods admitted under {hs.FABRIC_PROFILE}",
        lambda: len(p := jobs.pods(name)) == 2 and p,
        timeout=90,
        diagnosis=lambda: f"{jobs.diagnosis(name)}\n{operator.log_tail()}",
    )
    pod = pods[0]
    assert pod["spec"]["hostNetwork"] is True
    assert {"name": "fabric-lib", "hostPath": {"path": "/opt/fabric/lib", "type": "Directory"}} in (
        pod["spec"]["volumes"]
    )
    (daemon,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "fabric-daemon"]
    assert daemon["securityContext"]["privileged"] is True
    assert daemon["securityContext"]["runAsUser"] == 0
    assert daemon["restartPolicy"] == "Always"
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", ns, "--wait=false")

    # The same pod made by hand with the operator's credentials: admitted as the operator made
    # it, refused with any one of the profile's grants changed.
    base = _as_new(pod, "fabric-copy")
    done = _create(cluster, ns, base, kubeconfig=creds)
    assert done.returncode == 0, done.stderr

    def changed(how: Any) -> dict[str, Any]:
        doc = json.loads(json.dumps(base))
        how(doc["spec"], doc["metadata"])
        return doc

    def daemon_of(spec: dict[str, Any]) -> dict[str, Any]:
        return next(c for c in spec["initContainers"] if c["name"] == "fabric-daemon")

    def volume_of(spec: dict[str, Any]) -> dict[str, Any]:
        return next(v for v in spec["volumes"] if v["name"] == "fabric-lib")

    def worker_privileged(spec: dict[str, Any], _: Any) -> None:
        spec["containers"][0]["securityContext"] = {"privileged": True}

    def worker_root(spec: dict[str, Any], _: Any) -> None:
        spec["containers"][0]["securityContext"]["runAsUser"] = 0
        spec["containers"][0]["securityContext"]["runAsNonRoot"] = False

    # Two policies judge each pod and the API server says the refusal of whichever it ran
    # first: restricted-pods (whose first rule, the capabilities, a privileged container fails)
    # or runtime-profile-pods. Each case names what either would say.
    caps = "drop ALL capabilities"
    refusals: dict[str, tuple[Any, tuple[str, ...]]] = {
        "other host path": (lambda s, m: volume_of(s)["hostPath"].update(path="/"), ("hostPath",)),
        "the daemon's image": (
            lambda s, m: daemon_of(s).update(image=f"{hs.FABRIC_REGISTRY}/other:1"),
            (caps, "privileged or uid 0 only for a sidecar"),
        ),
        "the daemon renamed": (
            lambda s, m: daemon_of(s).update(name="other-daemon"),
            (caps, "privileged or uid 0 only for a sidecar"),
        ),
        "the worker privileged": (worker_privileged, (caps, "privileged")),
        "the worker as root": (worker_root, ("uid 0", "non-root")),
        "no profile": (
            lambda s, m: m["labels"].pop(names.Label.RUNTIME_PROFILE.value),
            (caps, "hostNetwork needs a runtime profile"),
        ),
        "another profile": (
            lambda s, m: m["labels"].update({names.Label.RUNTIME_PROFILE.value: hs.PROFILE}),
            (caps, f"may not use runtime profile {hs.PROFILE}", "hostNetwork"),
        ),
    }
    for case, (how, words) in refusals.items():
        done = _create(cluster, ns, changed(how), kubeconfig=creds)
        assert done.returncode != 0 and any(w in done.stderr for w in words), (case, done.stderr)

    # The chart's values said hostNetwork; the admin turns it off in the profile itself: the
    # profile as it is now is what the pods are held to.
    off = json.dumps({"spec": {"hostNetwork": False}})
    cluster.kubectl("patch", api.PROFILE_PLURAL, hs.FABRIC_PROFILE, "--type=merge", "-p", off)
    try:
        refused = poll.until(
            "the base pod refused once the profile stops granting hostNetwork",
            lambda: (d := _create(cluster, ns, base, kubeconfig=creds)).returncode != 0 and d,
            timeout=30,
        )
        assert f"runtime profile {hs.FABRIC_PROFILE} does not" in refused.stderr, refused.stderr
    finally:
        on = json.dumps({"spec": {"hostNetwork": True}})
        cluster.kubectl("patch", api.PROFILE_PLURAL, hs.FABRIC_PROFILE, "--type=merge", "-p", on)


def test_a_profile_namespace_holds_all_but_the_operators_pods_to_restricted(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """A namespace a runtime profile lists runs at Pod Security "privileged", as
    docs/install.md says (IPC_LOCK is refused by baseline and restricted): the chart's policy
    still holds a tenant with `edit` there, and even a cluster admin, to restricted, and the
    operator's profile pods cannot be patched past their profile."""
    cluster, ns, creds = jobs.cluster, jobs.ns, operator.kubeconfig
    cluster.kubectl(
        "label", "namespace", ns, "--overwrite", "pod-security.kubernetes.io/enforce=privileged"
    )
    _profile_lists(jobs, ns)
    cluster.kubectl("create", "serviceaccount", "carol", "-n", ns)
    cluster.kubectl(
        "create",
        "rolebinding",
        "carol-edit",
        "-n",
        ns,
        "--clusterrole=edit",
        f"--serviceaccount={ns}:carol",
    )
    carol = cluster.kubeconfig_for_serviceaccount(ns, "carol")
    poll.until(
        "carol may create pods",
        lambda: cluster.kubectl(
            "auth",
            "can-i",
            "create",
            "pods",
            "-n",
            ns,
            kubeconfig=carol,
            check=False,
        ).stdout.strip()
        == "yes",
    )
    host = _pod("host")
    host["spec"]["volumes"] = [{"name": "root", "hostPath": {"path": "/"}}]
    refused = {
        "privileged": (
            _pod("priv", privileged=True, allowPrivilegeEscalation=True),
            "may not run privileged containers",
        ),
        "host-path": (host, "may only use configMap"),
        "ipc-lock": (_profile_pod("caps", "IPC_LOCK", label=None), "NET_BIND_SERVICE"),
        "posing": (_profile_pod("posing", "IPC_LOCK"), "NET_BIND_SERVICE"),  # the label alone
    }
    for who, kubeconfig in (("tenant", carol), ("cluster admin", None)):
        for case, (pod, words) in refused.items():
            done = _create(cluster, ns, pod, kubeconfig=kubeconfig)
            assert done.returncode != 0 and words in done.stderr, (who, case, done.stderr)
            assert "runtime profile" in done.stderr, (who, case, done.stderr)
    assert _create(cluster, ns, _pod("fine"), kubeconfig=carol).returncode == 0
    # A profile pod the operator made (held back from scheduling): only it changes the image.
    held = _profile_pod(harness.unique("held"), "IPC_LOCK")
    held["spec"]["schedulingGates"] = [{"name": "fsdpoperator.io/test-hold"}]
    name = held["metadata"]["name"]
    cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(held), kubeconfig=creds)
    try:
        image = [
            {"op": "replace", "path": "/spec/containers/0/image", "value": "docker.io/evil/x:1"}
        ]
        done = cluster.kubectl(
            "patch",
            "pod",
            name,
            "-n",
            ns,
            "--type=json",
            "-p",
            json.dumps(image),
            kubeconfig=carol,
            check=False,
        )
        assert done.returncode != 0, done.stdout
        assert "only the operator may change its images" in done.stderr, done.stderr
        done = cluster.kubectl(
            "label", "pod", name, "-n", ns, "team=a", kubeconfig=carol, check=False
        )
        assert done.returncode == 0, done.stderr  # what is not the profile's stays the tenant's
    finally:
        cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false", check=False)


def test_only_a_cluster_admin_may_create_or_edit_a_runtime_profile(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """Even a cluster-wide `edit` (which may run FSDPJobs everywhere) cannot grant itself more."""
    cluster, ns = jobs.cluster, jobs.ns
    cluster.kubectl("create", "serviceaccount", "bob", "-n", ns)
    cluster.kubectl(
        "create",
        "clusterrolebinding",
        f"bob-edit-{ns}",
        "--clusterrole=edit",
        f"--serviceaccount={ns}:bob",
    )
    try:
        bob = cluster.kubeconfig_for_serviceaccount(ns, "bob")
        poll.until(
            "bob may create FSDPJobs",
            lambda: cluster.kubectl(
                "auth",
                "can-i",
                "create",
                "fsdpjobs.fsdpoperator.io",
                "-n",
                ns,
                kubeconfig=bob,
                check=False,
            ).stdout.strip()
            == "yes",
        )
        mine = {
            "apiVersion": f"{api.GROUP}/{api.VERSION}",
            "kind": api.PROFILE_KIND,
            "metadata": {"name": f"bob-{ns}"},
            "spec": {"namespaces": [ns], "capabilities": ["IPC_LOCK", "SYS_NICE"]},
        }
        done = cluster.kubectl(
            "create", "-f", "-", input=json.dumps(mine), kubeconfig=bob, check=False
        )
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
        patch = json.dumps({"spec": {"namespaces": [ns], "capabilities": ["SYS_NICE"]}})
        done = cluster.kubectl(
            "patch",
            api.PROFILE_PLURAL,
            hs.PROFILE,
            "--type=merge",
            "-p",
            patch,
            kubeconfig=bob,
            check=False,
        )
        assert done.returncode != 0 and "forbidden" in done.stderr.lower(), done.stderr
    finally:
        cluster.kubectl("delete", "clusterrolebinding", f"bob-edit-{ns}", check=False)


def _conflict(jobs: harness.Jobs, name: str) -> dict[str, Any] | None:
    conds = jobs.status(name).get("conditions") or []
    return next((c for c in conds if c["type"] == "Conflict" and c["status"] == "True"), None)


def _owned(jobs: harness.Jobs, name: str) -> list[dict[str, Any]]:
    uid = (jobs.get(name) or {})["metadata"]["uid"]
    return [
        p
        for p in jobs.pods(name)
        if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
    ]


def test_a_hand_made_pod_with_the_jobs_name_is_never_adopted(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("squat")
    squatter = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{name}-a1-0",
            "labels": {
                "fsdpoperator.io/job": name,
                "fsdpoperator.io/attempt": "1",
                "fsdpoperator.io/node-rank": "0",
            },
        },
        "spec": {
            "nodeSelector": {"no-such-node": "true"},  # stays Pending: no process needed
            "containers": [{"name": "worker", "image": "evil:1"}],
        },
    }
    jobs.cluster.kubectl("create", "-n", jobs.ns, "-f", "-", input=json.dumps(squatter))
    jobs.apply(harness.job_doc(name, training={"steps": 400}))
    cond = poll.until(
        "Conflict condition", lambda: _conflict(jobs, name), timeout=30, diagnosis=operator.log_tail
    )
    assert cond["reason"] == "NameConflict"
    assert f"pod {name}-a1-0 is owned by no controller" in cond["message"]
    assert "NameConflict" in jobs.events(name)
    s = jobs.status(name)
    assert s["phase"] == "Pending" and _owned(jobs, name) == []  # nothing adopted or created
    jobs.cluster.kubectl(
        "delete", "pod", f"{name}-a1-0", "-n", jobs.ns, "--grace-period=0", "--force"
    )
    poll.until(
        "Running once the squatter is gone",
        lambda: jobs.status(name).get("phase") == "Running",
        timeout=60,
        diagnosis=operator.log_tail,
    )
    s = jobs.status(name)
    assert s["attempt"] == 1 and s["restarts"]["total"] == 0 and _conflict(jobs, name) is None
    assert len(_owned(jobs, name)) == 2


def test_delete_then_recreate_waits_for_the_old_pods_and_resumes_only_when_asked(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("again")
    doc = harness.job_doc(name, training={"steps": 400})
    jobs.apply(doc)
    poll.until(
        "first job at step 7",
        lambda: (jobs.status(name).get("step") or 0) >= 7,
        timeout=60,
        diagnosis=operator.log_tail,
    )
    old_uid = (jobs.get(name) or {})["metadata"]["uid"]
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    jobs.apply(doc)
    new_uid = (jobs.get(name) or {})["metadata"]["uid"]
    assert new_uid != old_uid
    # the old job's pods and checkpoints are not the new job's: it waits and says why
    cond = poll.until(
        "checkpoint conflict",
        lambda: (c := _conflict(jobs, name)) and c["reason"] == "CheckpointsOfAnotherJob" and c,
        timeout=90,
        diagnosis=lambda: f"{jobs.get(name)}\n{jobs.events(name)}\n{jobs.pods(name)}",
    )
    assert f"FSDPJob uid {old_uid}" in cond["message"]
    assert "resumeFromPreviousJobs" in cond["message"]
    assert jobs.pods(name) == [] and jobs.status(name)["attempt"] == 0
    jobs.patch(name, {"checkpoint": {"resumeFromPreviousJobs": True}})
    s = poll.until(
        "new job Running",
        lambda: (s := jobs.status(name)).get("phase") == "Running" and s,
        timeout=60,
        diagnosis=operator.log_tail,
    )
    assert s["attempt"] == 1 and s["restarts"]["total"] == 0
    assert (s["history"][0]["resumedFromStep"] or 0) >= 5
    assert len(_owned(jobs, name)) == 2 and len(jobs.pods(name)) == 2
    reasons = jobs.events(name)
    assert "CheckpointsOfAnotherJob" in reasons


# --- the job's NetworkPolicy over its gang's ports (issue 44) ---------------------------------
def _connect(name: str, ip: str, port: int, *, tries: int = 1) -> dict[str, Any]:
    """A pod that connects to ip:port (3 s a try, `tries` times a second apart): Succeeded when
    it got through, Failed with the last error as its termination message when not."""
    code = (
        "import socket, sys, time\n"
        f"for attempt in range({tries}):\n"
        "    try:\n"
        f"        socket.create_connection(('{ip}', {port}), timeout=3).close(); sys.exit(0)\n"
        "    except OSError as err:\n"
        "        error = repr(err); time.sleep(1)\n"
        "open('/dev/termination-log', 'w').write(error); sys.exit(1)\n"
    )
    return podkit.python_pod(name, code, labels={"role": "stranger"})


def _outcome(cluster: controlplane.Cluster, ns: str, name: str) -> tuple[bool, str]:
    """Whether pod `name` connected, and its error if not."""
    done = podkit.wait_phase(cluster, ns, name, ("Succeeded", "Failed"), timeout=90)
    (state,) = [c["state"] for c in done["status"]["containerStatuses"]]
    return done["status"]["phase"] == "Succeeded", state["terminated"].get("message", "")


def test_only_the_gang_reaches_its_keeper_and_store_and_restarts_in_place_still_work(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """With the operator's per-job NetworkPolicy (on by default): a pod of another namespace
    and a pod of the job's own namespace that is not the job's time out on rank 0's keeper
    (29501) and rendezvous store (29500), while its metrics port still answers them; the job's
    crash is restarted in place, its keepers speaking across the policy, and it succeeds. The
    operator runs on the host here: node traffic, which the policy leaves alone."""
    name = harness.unique("guarded")
    # the crash comes about 60 s into training, after the probes (they start once a step is
    # seen and take tens of seconds on a loaded node); the job ends about 30 s after it. Were
    # a probe late, the metrics probe retries across the restart in place (its port is down
    # while the ranks start again), not past the job's end (seen: a job of 24 s was over
    # before the probe pods ran).
    env = {"STANDIN_FAIL_AT_STEP": 300, "STANDIN_FAIL_RANK": 1}
    # a deadline well past a restart in place on a loaded node: this test is about the policy,
    # not hang timing (seen in CI at 20 s: the restart in place took longer, the verdict was a
    # Hang and the gang was recreated)
    failure_policy = {"inPlaceRestarts": 1, "progressDeadlineSeconds": 60}
    jobs.apply(
        harness.job_doc(name, env=env, training={"steps": 450}, failurePolicy=failure_policy)
    )
    rank0 = poll.until(
        "rank 0 running with an address",
        lambda: next(
            (p for p in jobs.running_pods(name, 1) if p["metadata"]["name"].endswith("-0")), None
        ),
        diagnosis=operator.log_tail,
    )
    policy = jobs.cluster.get_json("networkpolicy", names.network_policy_name(name), "-n", jobs.ns)
    assert policy["metadata"]["ownerReferences"][0]["uid"] == jobs.get(name)["metadata"]["uid"]
    ip = rank0["status"]["podIP"]
    # rank 0 serves its metrics port once the gang has met (a torch import and a rendezvous
    # after its pod runs: tens of seconds on a loaded node); the operator's scrape says when
    poll.until(
        "the operator scraping a step from rank 0's metrics port",
        lambda: (jobs.status(name).get("step") or 0) > 0,
        timeout=180,
        diagnosis=lambda: f"{jobs.status(name)}\n{jobs.events(name)}\n{operator.log_tail()}",
    )
    elsewhere = harness.unique("elsewhere")
    jobs.cluster.kubectl("create", "namespace", elsewhere)
    probes = {
        "keeper": _connect("keeper", ip, names.GANG_PORT),
        "store": _connect("store", ip, names.RENDEZVOUS_PORT),
        "metrics": _connect("metrics", ip, names.METRICS_PORT, tries=30),
    }
    try:
        for ns in (jobs.ns, elsewhere):  # all at once: the job's namespace and another
            podkit.apply(jobs.cluster, ns, *probes.values())
        for ns in (jobs.ns, elsewhere):
            for probe in ("keeper", "store"):
                got, error = _outcome(jobs.cluster, ns, probe)
                assert not got and "timed out" in error, (ns, probe, error)  # dropped
            got, error = _outcome(jobs.cluster, ns, "metrics")
            assert got, (ns, "the metrics port stays open", error)
    finally:
        jobs.cluster.kubectl("delete", "namespace", elsewhere, "--wait=false", check=False)
    done = poll.until(
        "the job succeeds after its crash, restarted in place",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=180,
        diagnosis=lambda: f"{jobs.diagnosis(name)}\n{operator.log_tail()}",
    )
    said = f"{jobs.diagnosis(name)}\n{jobs.evidence(name)}\n{operator.log_tail()}"
    assert done["attempt"] == 1 and done["restarts"]["application"] == 1, said
    assert "RestartedInPlace" in jobs.events(name)
