"""The chart and the worker pods pass the API server's checks, PodSecurity "restricted" too.

Server-side dry runs: the objects are validated and admitted by the real kube-apiserver (with
the PodSecurity admission plugin) but not persisted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from fsdp_operator.policy import decide
from fsdp_operator.render import templates
from fsdp_operator.types import api, names
from harness import stack
from localcluster import controlplane, poll

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
    cluster.kubectl("apply", "-f", str(stack.ROOT / "examples" / "priorityclass.yaml"))
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
    stack.install_crd(cluster)  # the chart makes its own runtime profile (a custom resource)
    docs = stack.render_chart(namespace=ns, release="fsdp-operator")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == [
        "ClusterRole",
        "ClusterRole",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "FSDPRuntimeProfile",
        "PodDisruptionBudget",
        *["Role"] * 3,  # leader election, node leases, the gang's master key
        *["RoleBinding"] * 3,
        "Service",
        "ServiceAccount",
        *["ValidatingAdmissionPolicy"] * 6,
        *["ValidatingAdmissionPolicyBinding"] * 6,
    ]
    # the one profile is the chart's own, granting nothing: pods made under no profile
    (builtin,) = _by_kind(docs, "FSDPRuntimeProfile")
    assert builtin["metadata"]["name"] == "fsdp-operator-restricted" and builtin["spec"] == {}
    roles = {d["metadata"]["name"]: d for d in _by_kind(docs, "Role")}
    lease_role = roles["fsdp-operator-leader-election"]
    assert lease_role["metadata"]["namespace"] == ns  # leader election: its own namespace only
    assert lease_role["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "create", "update"],
        }
    ]
    # nodes lost by their Leases: the kubelets' Leases, read-only, in kube-node-lease only
    node_leases = roles["fsdp-operator-node-leases"]
    assert node_leases["metadata"]["namespace"] == "kube-node-lease"
    assert node_leases["rules"] == [
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "verbs": ["get", "list", "watch"],
        }
    ]
    off = stack.render_chart(release="fsdp-operator", values=["settings.nodeLeaseMissedRenewals=0"])
    assert "fsdp-operator-node-leases" not in {d["metadata"]["name"] for d in off}
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["replicas"] == 2
    role = next(
        d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "fsdp-operator"
    )
    assert role["rules"] == yaml.safe_load((CHART / "files" / "rbac-rules.yaml").read_text())
    flat = json.dumps(role["rules"])
    assert '"*"' not in flat and "pods/exec" not in flat
    netpols = next(r for r in role["rules"] if r["resources"] == ["networkpolicies"])
    assert netpols["verbs"] == ["get", "list", "create", "patch"]  # the job's GC deletes it
    # Secrets: create only (the gang keys); get/list/watch/delete would read tenants' Secrets
    assert [r["verbs"] for r in role["rules"] if "secrets" in r["resources"]] == [["create"]]
    (key_role,) = [
        d for d in docs if d["metadata"]["name"] == "fsdp-operator-gang-key" and d["kind"] == "Role"
    ]
    assert key_role["rules"][0] == {
        "apiGroups": [""],
        "resources": ["secrets"],
        "resourceNames": ["fsdp-operator-gang-key"],
        "verbs": ["get"],
    }
    elsewhere = [d for d in docs if d["metadata"].get("namespace") == "kube-node-lease"]
    _dry_run(cluster, "kube-node-lease", elsewhere)
    warnings = _dry_run(cluster, ns, [d for d in docs if d not in elsewhere])
    assert "violate" not in warnings


# --- the chart as a platform team installs it: values, labels, schema, monitoring, roles ---


def _by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _deployment(*values: str) -> dict:
    return _by_kind(stack.render_chart(values=values), "Deployment")[0]


def test_the_jobs_network_policies_are_on_and_let_this_releases_operator_pods_in() -> None:
    """networkPolicy.enabled (default on) reaches the operator, with the labels its own pods
    carry, so the jobs' policies let exactly them in on the keepers' port."""
    deployment = _deployment()
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["FSDPOP_NETWORK_POLICY"] == "1"
    assert env["FSDPOP_OPERATOR_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    wanted = dict(pair.split("=") for pair in env["FSDPOP_OPERATOR_POD_LABELS"].split(","))
    assert wanted and wanted.items() <= pod_labels.items()
    (off,) = _deployment("networkPolicy.enabled=false")["spec"]["template"]["spec"]["containers"]
    assert {"name": "FSDPOP_NETWORK_POLICY", "value": "0"} in off["env"]


def test_every_object_carries_the_standard_labels() -> None:
    docs = stack.render_chart(
        values=["metrics.serviceMonitor.enabled=true", "commonLabels.team=ml-platform"]
    )
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for doc in docs:
        labels = doc["metadata"].get("labels", {})
        where = f'{doc["kind"]}/{doc["metadata"]["name"]}'
        assert labels.get("app.kubernetes.io/name") == "fsdp-operator", where
        assert labels.get("app.kubernetes.io/instance") == stack.OP_SA, where
        assert labels.get("app.kubernetes.io/version") == chart["appVersion"], where
        assert labels.get("app.kubernetes.io/managed-by") == "Helm", where
        assert labels.get("helm.sh/chart") == f"fsdp-operator-{chart['version']}", where
        assert labels.get("team") == "ml-platform", where
    pod = _by_kind(docs, "Deployment")[0]["spec"]["template"]["metadata"]["labels"]
    assert pod["app.kubernetes.io/version"] == chart["appVersion"]


def test_the_image_tag_is_the_charts_app_version_unless_set() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = _deployment()["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"ghcr.io/example/fsdp-operator:{chart['appVersion']}"
    image = _deployment("image.repository=registry.corp/ml/fsdp-operator", "image.tag=0.1.0-rc1")[
        "spec"
    ]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.corp/ml/fsdp-operator:0.1.0-rc1"


def test_operator_scheduling_and_pull_secrets_reach_its_pods() -> None:
    spec = _deployment(
        "nodeSelector.pool=system",
        "tolerations[0].key=node-role.kubernetes.io/control-plane",
        "tolerations[0].operator=Exists",
        "tolerations[0].effect=NoSchedule",
        "imagePullSecrets[0].name=regcred",
        "priorityClassName=system-cluster-critical",
        "podAnnotations.example\\.com/owner=platform",
    )["spec"]["template"]
    pod = spec["spec"]
    assert pod["nodeSelector"] == {"pool": "system"}
    assert pod["tolerations"] == [
        {
            "key": "node-role.kubernetes.io/control-plane",
            "operator": "Exists",
            "effect": "NoSchedule",
        }
    ]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert spec["metadata"]["annotations"] == {"example.com/owner": "platform"}
    # the default affinity spreads the replicas over nodes; a value replaces it
    assert "podAntiAffinity" in pod["affinity"]
    pod = _deployment(
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )["spec"]["template"]["spec"]
    assert list(pod["affinity"]) == ["nodeAffinity"]


def test_the_memory_limit_fits_the_measured_restart_peak() -> None:
    """docs/benchmarks.md, "Fleet": 452 MiB RSS after a restart at 1,000 jobs (the old limit
    was 512Mi)."""
    resources = _deployment()["spec"]["template"]["spec"]["containers"][0]["resources"]
    limit = resources["limits"]["memory"]
    assert limit.endswith("Gi") and float(limit[:-2]) * 1024 >= 2 * 452


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("replicas=0", "replicas"),
        ("replicas=two", "replicas"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
        ("imag.tag=1", "imag"),  # a misspelt key is not silently ignored
        ("metricsPort=70000", "metricsPort"),
        ("settings.workerModule=fsdp_worker;rm", "workerModule"),
        ("metrics.serviceMonitor.interval=often", "interval"),
    ],
)
def test_an_invalid_value_fails_naming_the_field(value: str, words: str) -> None:
    _refused_naming(stack.helm_template(values=[value]), value, words)


def _refused_naming(done: subprocess.CompletedProcess[str], value: str, words: str) -> None:
    """helm refused `value` by the chart's schema, naming `words`."""
    assert done.returncode != 0, f"{value} was accepted"
    assert "values don't meet the specifications of the schema" in done.stderr, done.stderr
    assert words in done.stderr, done.stderr


def test_metrics_service_monitors_and_tls() -> None:
    plain = stack.render_chart()
    (service,) = _by_kind(plain, "Service")
    assert service["metadata"]["name"] == f"{stack.OP_SA}-metrics"
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert not _by_kind(plain, "ServiceMonitor") and not _by_kind(plain, "PodMonitor")

    docs = stack.render_chart(
        values=[
            "metrics.serviceMonitor.enabled=true",
            "metrics.serviceMonitor.labels.release=prom",
            "metrics.tls.secretName=op-metrics-tls",
            "metrics.tls.clientAuth=true",
        ]
    )
    (monitor,) = _by_kind(docs, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["scheme"] == "https"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]
    pod = _by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["FSDPOP_METRICS_CERT_FILE"] == "/etc/fsdp-operator/metrics-tls/tls.crt"
    assert env["FSDPOP_METRICS_KEY_FILE"] == "/etc/fsdp-operator/metrics-tls/tls.key"
    assert env["FSDPOP_METRICS_CLIENT_CA_FILE"] == "/etc/fsdp-operator/metrics-tls/ca.crt"
    assert {"name": "metrics-tls", "secret": {"secretName": "op-metrics-tls"}} in pod["volumes"]

    (podmonitor,) = _by_kind(
        stack.render_chart(values=["metrics.podMonitor.enabled=true"]), "PodMonitor"
    )
    assert podmonitor["spec"]["podMetricsEndpoints"][0]["scheme"] == "http"
    both = stack.helm_template(
        values=["metrics.podMonitor.enabled=true", "metrics.serviceMonitor.enabled=true"]
    )
    assert both.returncode != 0 and "choose one" in both.stderr


def test_the_chart_refuses_a_cluster_older_than_its_admission_policies() -> None:
    chart = stack.ROOT / "charts" / "fsdp-operator"
    done = subprocess.run(
        [str(stack.helm()), "template", "x", str(chart), "--kube-version", "v1.29.0"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and ">=1.30.0-0" in done.stderr, done.stderr


def test_edit_and_view_users_get_fsdpjob_rights_through_aggregation(
    cluster: controlplane.Cluster,
) -> None:
    """A tenant bound to the built-in `edit` role may run FSDPJobs; `view` may only read them."""
    ns = "tenant-roles"
    # kubectl resolves `fsdpjobs.fsdpoperator.io` by discovery; without the CRD it asks about a
    # core-group resource of that whole name, which no role grants
    stack.install_crd(cluster)
    cluster.kubectl("create", "namespace", ns)
    roles = [
        d
        for d in stack.render_chart(release="agg")
        if d["kind"] == "ClusterRole" and d["metadata"]["name"].startswith("agg-fsdpjob-")
    ]
    cluster.kubectl("apply", "-f", "-", input=stack.as_list(roles))
    cluster.kubectl(
        "create", "rolebinding", "alice-edit", "--clusterrole=edit", "--user=alice", "-n", ns
    )
    cluster.kubectl(
        "create", "rolebinding", "bob-view", "--clusterrole=view", "--user=bob", "-n", ns
    )

    def can(user: str, verb: str) -> bool:
        done = cluster.kubectl(
            "auth", "can-i", verb, "fsdpjobs.fsdpoperator.io", "-n", ns, "--as", user, check=False
        )
        return done.stdout.strip() == "yes"

    # the clusterrole-aggregation controller folds the rules in, a moment after the apply
    poll.until(
        "edit to include FSDPJob create",
        lambda: can("alice", "create"),
        timeout=60,
        diagnosis=lambda: cluster.kubectl(
            "auth",
            "can-i",
            "create",
            "fsdpjobs.fsdpoperator.io",
            "-n",
            ns,
            "--as",
            "alice",
            check=False,
        ).stderr
        + cluster.kubectl("get", "clusterrole", "edit", "-o", "yaml", check=False).stdout,
    )
    poll.until("view to include FSDPJob list", lambda: can("bob", "list"), timeout=60)
    assert can("alice", "delete") and can("bob", "get")
    assert not can("bob", "create") and not can("bob", "delete")
    assert not can("carol", "list")  # bound to nothing


def test_each_runtime_profile_gets_its_own_binding_and_the_rest_the_default() -> None:
    values = yaml.safe_load(
        (stack.ROOT / "examples" / "chart-values" / "gpu-rdma.yaml").read_text()
    )
    profiles = json.dumps(values["runtimeProfiles"])
    docs = stack.render_chart(json_values=[f"runtimeProfiles={profiles}"])
    made = {d["metadata"]["name"]: d["spec"] for d in _by_kind(docs, "FSDPRuntimeProfile")}
    assert made == {
        "fsdp-operator-restricted": {},
        "gpu-rdma": values["runtimeProfiles"]["gpu-rdma"],
    }
    bindings = {
        d["metadata"]["name"]: d["spec"]
        for d in _by_kind(docs, "ValidatingAdmissionPolicyBinding")
        if d["spec"]["policyName"] == "fsdp-operator-runtime-profile-pods"
    }
    label = "fsdpoperator.io/runtime-profile"
    mine = bindings["fsdp-operator-runtime-profile-gpu-rdma"]
    assert mine["paramRef"] == {"name": "gpu-rdma", "parameterNotFoundAction": "Deny"}
    assert mine["matchResources"]["objectSelector"] == {"matchLabels": {label: "gpu-rdma"}}
    default = bindings["fsdp-operator-runtime-profile-pods"]
    assert default["paramRef"]["name"] == "fsdp-operator-restricted"
    assert default["matchResources"]["objectSelector"]["matchExpressions"] == [
        {"key": label, "operator": "NotIn", "values": ["gpu-rdma"]}
    ]
    # switched off, the restricted policy holds every pod to NET_BIND_SERVICE again
    off = stack.render_chart(values=["admissionPolicies.runtimeProfiles=false"])
    assert not _by_kind(off, "FSDPRuntimeProfile")
    restricted = next(d for d in off if d["metadata"]["name"] == "fsdp-operator-restricted-pods")
    assert "IPC_LOCK" not in json.dumps(restricted["spec"])


# --- the values a platform team reaches for: names, identity, env, volumes, as a subchart ---


def test_name_overrides_rename_every_object_and_keep_the_operators_own_references() -> None:
    """fullnameOverride names every object (and the Lease, the ServiceAccount the policies
    trust); nameOverride the name label, which the jobs' NetworkPolicies select on."""
    docs = stack.render_chart(
        release="rel", values=["fullnameOverride=fsdp", "nameOverride=trainer-op"]
    )
    for doc in docs:
        where = f'{doc["kind"]}/{doc["metadata"]["name"]}'
        assert doc["metadata"]["name"].startswith("fsdp"), where
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "trainer-op", where
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel", where
    for where, text in _strings(docs):
        if not where.endswith("app.kubernetes.io/instance"):
            assert text != "rel" and "rel-" not in text and ":rel'" not in text, (where, text)
    assert "system:serviceaccount:fsdp-system:fsdp'" in json.dumps(docs)  # whom policies trust
    deployment = _by_kind(docs, "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "fsdp"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["FSDPOP_LEASE_NAME"] == "fsdp"
    assert env["FSDPOP_OPERATOR_POD_LABELS"] == (
        "app.kubernetes.io/name=trainer-op,app.kubernetes.io/instance=rel"
    )
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    # unset, the names are the release's, as before the overrides existed
    plain = stack.render_chart(release="rel")
    assert {d["metadata"]["name"] for d in plain} >= {"rel", "rel-metrics", "rel-restricted"}


def _strings(node: object, where: str = "") -> list[tuple[str, str]]:
    """(path, text) of every string in rendered objects, for names that must not leak."""
    if isinstance(node, dict):
        return [s for key, value in node.items() for s in _strings(value, f"{where}.{key}")]
    if isinstance(node, list):
        return [s for i, value in enumerate(node) for s in _strings(value, f"{where}[{i}]")]
    return [(where, node)] if isinstance(node, str) else []


def test_service_account_annotations_env_and_volumes_reach_the_operator() -> None:
    docs = stack.render_chart(
        values=["serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/op"],
        json_values=[
            'extraEnv=[{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]',
            'extraVolumes=[{"name": "corp-ca", "configMap": {"name": "corp-ca"}}]',
            'extraVolumeMounts=[{"name": "corp-ca", "mountPath": "/etc/ssl/corp", '
            '"readOnly": true}]',
        ],
    )
    (account,) = _by_kind(docs, "ServiceAccount")
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/op"
    }
    pod = _by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["env"][-1] == {"name": "HTTPS_PROXY", "value": "http://proxy:3128"}
    assert any(e["name"] == "FSDPOP_LEASE_NAME" for e in container["env"])  # the chart's stay
    assert container["volumeMounts"][-1] == {
        "name": "corp-ca",
        "mountPath": "/etc/ssl/corp",
        "readOnly": True,
    }
    assert {"name": "corp-ca", "configMap": {"name": "corp-ca"}} in pod["volumes"]
    assert {"name": "tmp", "emptyDir": {}} in pod["volumes"]
    plain = _by_kind(stack.render_chart(), "ServiceAccount")[0]
    assert "annotations" not in plain["metadata"]


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('extraEnv=[{"value": "x"}]', "name"),
        ('extraVolumeMounts=[{"name": "ca"}]', "mountPath"),
        ('serviceAccount={"annotation": {}}', "annotation"),
        ('fullnameOverride="Not_A_Name"', "fullnameOverride"),
    ],
)
def test_invalid_extra_values_fail_naming_the_field(value: str, words: str) -> None:
    _refused_naming(stack.helm_template(json_values=[value]), value, words)


def test_the_chart_works_as_a_subchart_with_global_values(tmp_path: Path) -> None:
    """Helm hands every subchart its parent's `global` (helm/helm#10392): the schema must
    accept it, or the parent chart fails to render."""
    parent = tmp_path / "platform"
    (parent / "charts").mkdir(parents=True)
    shutil.copytree(CHART, parent / "charts" / "fsdp-operator", symlinks=False)
    (parent / "Chart.yaml").write_text(
        "apiVersion: v2\nname: platform\nversion: 0.0.1\n"
        "dependencies: [{name: fsdp-operator, version: '>=0.0.0-0'}]\n"
    )
    (parent / "values.yaml").write_text(
        "global: {imageRegistry: registry.corp}\nfsdp-operator: {replicas: 3}\n"
    )
    done = subprocess.run(
        [str(stack.helm()), "template", "p", str(parent), "--kube-version", stack.KUBE_VERSION],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    docs = [d for d in yaml.safe_load_all(done.stdout) if d]
    assert _by_kind(docs, "Deployment")[0]["spec"]["replicas"] == 3
