"""The operator stack on a local cluster: CRD, chart RBAC, the operator process, job helpers.

Shared by `make demo`, the integration tests and the benchmarks. The operator runs as
`python -m fsdp_operator` with a ServiceAccount token bound to the chart's ClusterRole
(charts/fsdp-operator/files/rbac-rules.yaml), so a missing or excessive permission shows up.
Workers are the real `fsdp_worker` or the torch-free stand-in, under real torchrun.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from localcluster import controlplane, poll

ROOT = Path(__file__).resolve().parents[1]
OP_NS = "fsdp-system"
OP_SA = "fsdp-operator"
WORKER_UID = 1000
"""The worker image's user (and the operator's pod templates' runAsUser/fsGroup)."""


def _die_with_parent() -> None:
    """Child side of fork: SIGKILL this process when the test runner dies (no orphan operator)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_crd(cluster: controlplane.Cluster) -> None:
    """The FSDPJob and FSDPRuntimeProfile CRDs, once both are Established."""
    for name in ("fsdpjobs", "fsdpruntimeprofiles"):
        cluster.kubectl("apply", "--server-side", "-f", str(ROOT / "crds" / f"{name}.yaml"))
    # Not `kubectl wait`: it fails outright while a new CRD has no status.conditions yet.
    query = "jsonpath={.status.conditions[?(@.type=='Established')].status}"

    def established(name: str) -> bool:
        got = cluster.kubectl("get", "crd", f"{name}.fsdpoperator.io", "-o", query, check=False)
        return got.stdout == "True"

    for name in ("fsdpjobs", "fsdpruntimeprofiles"):
        poll.until(f"the {name} CRD Established", functools.partial(established, name), timeout=60)


def helm() -> Path:
    """The helm binary (built from its Go module into the cache on first use)."""
    out = subprocess.run(
        ["bash", str(ROOT / "localcluster" / "build-helm.sh")],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


KUBE_VERSION = "v1.37.2"
"""The local cluster's Kubernetes (localcluster/build-binaries.sh): `helm template` checks the
chart's kubeVersion against it (a helm built by `go install` would otherwise assume v1.20)."""


def helm_template(
    *,
    namespace: str = OP_NS,
    release: str = OP_SA,
    values: Sequence[str] = (),
    json_values: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart with `--set`-style `values` (KEY=VALUE) and `--set-json`
    ones (KEY=JSON); not checked."""
    argv = [
        str(helm()),
        "template",
        release,
        str(ROOT / "charts" / "fsdp-operator"),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
    ]
    for value in values:
        argv += ["--set", value]
    for value in json_values:
        argv += ["--set-json", value]
    return subprocess.run(argv, capture_output=True, text=True)


def render_chart(
    *,
    namespace: str = OP_NS,
    release: str = OP_SA,
    values: Sequence[str] = (),
    json_values: Sequence[str] = (),
) -> list[dict[str, Any]]:
    """`helm template` of the chart: the objects a `helm install` would create."""
    done = helm_template(
        namespace=namespace, release=release, values=values, json_values=json_values
    )
    if done.returncode != 0:
        raise RuntimeError(f"helm template failed: {done.stderr.strip()}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def install_rbac(cluster: controlplane.Cluster, json_values: Sequence[str] = ()) -> Path:
    """Everything the chart installs but the Deployment: ServiceAccount, ClusterRole and its
    binding, the admission policies and runtime profiles (`json_values`: `--set-json`). Returns a
    kubeconfig acting as that account."""
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": OP_NS}},
        *(d for d in render_chart(json_values=json_values) if d["kind"] != "Deployment"),
    ]
    cluster.kubectl(
        "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    )
    return cluster.kubeconfig_for_serviceaccount(OP_NS, OP_SA)


def uninstall_chart(
    cluster: controlplane.Cluster, *, namespace: str = OP_NS, release: str = OP_SA
) -> None:
    """`helm uninstall --wait`: the operator's pods are gone when it returns."""
    argv = [
        str(helm()),
        "uninstall",
        release,
        "--namespace",
        namespace,
        "--wait",
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]
    subprocess.run(argv, capture_output=True, check=False)


def hostpath_claim(*, namespace: str, name: str, path: str, pv_name: str) -> list[dict[str, Any]]:
    """An RWX PersistentVolumeClaim and the hostPath PersistentVolume it is bound to.

    On this machine (and kind's, with a shared mount) one host directory behaves like an NFS
    export: every node sees the same files.
    """
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": pv_name},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "capacity": {"storage": "1Gi"},
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": path, "type": "Directory"},
            "claimRef": {"namespace": namespace, "name": name},
        },
    }
    pvc = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "",
            "volumeName": pv_name,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    return [pv, pvc]


def as_list(docs: list[dict[str, Any]]) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def install_chart(
    cluster: controlplane.Cluster,
    *,
    values: dict[str, str],
    namespace: str = OP_NS,
    release: str = OP_SA,
    timeout: str = "240s",
) -> None:
    """`helm upgrade --install` of the chart, waiting until its Deployment is available."""
    argv = [
        str(helm()),
        "upgrade",
        "--install",
        release,
        str(ROOT / "charts" / "fsdp-operator"),
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        timeout,
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        pods = cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout
        raise RuntimeError(f"helm install failed: {done.stderr.strip()}\n{pods}")


class ChartOperator:
    """The operator as the chart's Deployment: its pod, logs and metrics, as a user sees them."""

    def __init__(
        self, cluster: controlplane.Cluster, *, namespace: str = OP_NS, release: str = OP_SA
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.release = release
        self.selector = f"app.kubernetes.io/name=fsdp-operator,app.kubernetes.io/instance={release}"

    def pods(self) -> list[dict[str, Any]]:
        found = self.cluster.get_json("pods", "-n", self.namespace, "-l", self.selector)
        return list(found["items"])

    def running_pods(self) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods()
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        ]

    def lease_holder(self) -> str:
        """The replica (pod name) holding the leader Lease, "" when none does."""
        done = self.cluster.kubectl(
            "get", "lease", self.release, "-n", self.namespace, "-o", "json", check=False
        )
        if done.returncode != 0:
            return ""
        return str(json.loads(done.stdout).get("spec", {}).get("holderIdentity") or "")

    def running_pod(self) -> dict[str, Any]:
        """The leader's pod (the replicas stand by while one leads)."""

        def leader() -> dict[str, Any] | None:
            holder = self.lease_holder()
            return next((p for p in self.running_pods() if p["metadata"]["name"] == holder), None)

        return poll.until("a leading operator pod", leader, timeout=60)

    def metrics_url(self, port: int = 8000) -> str:
        return f"http://{self.running_pod()['status']['podIP']}:{port}/metrics"

    def log_tail(self, lines: int = 80) -> str:
        done = self.cluster.kubectl(
            "logs", "-n", self.namespace, "-l", self.selector, f"--tail={lines}", check=False
        )
        return done.stdout + done.stderr


class Operator:
    """`python -m fsdp_operator run` as a child process; kill and start it at will."""

    def __init__(
        self,
        cluster: controlplane.Cluster,
        kubeconfig: Path,
        log_dir: Path,
        *,
        worker_module: str = "fsdp_worker.train.standin",
        identity: str = "",
    ) -> None:
        self.cluster = cluster
        # Leader election: one identity per Operator object, kept across start/kill, so a
        # restarted process takes its own Lease back at once (as a restarted container does).
        self.identity = identity or f"operator-{uuid.uuid4().hex[:8]}"
        self.worker_module = worker_module
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.sees_checkpoints = True
        """False: no storage template, as the chart installs it by default (no checkpoint
        mount); the pods then choose their checkpoints under the operator's rules."""
        self.starts = 0
        self.metrics_port = 0
        self.liveness_url = ""

    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def env(self) -> dict[str, str]:
        pvc = volumes_root(self.cluster)
        self.liveness_url = f"http://127.0.0.1:{free_port()}/healthz"
        env = dict(os.environ)
        self.metrics_port = free_port()
        env.update(
            KUBECONFIG=str(self.kubeconfig),
            FSDPOP_STORAGE_TEMPLATE=str(pvc) + "/{namespace}/{claim}"
            if self.sees_checkpoints
            else "",
            FSDPOP_WORKER_MODULE=self.worker_module,
            FSDPOP_METRICS_PORT=str(self.metrics_port),
            FSDPOP_LIVENESS=self.liveness_url,
            FSDPOP_NODE_EXCLUSION_SECONDS="20",
            FSDPOP_DRAIN_TIMEOUT_SECONDS="30",
            # the local kubelets renew their 4 s Leases every second (kwok's 8 s ones every 2 s):
            # 8 missed is 8 s of silence, as the local node-monitor grace
            FSDPOP_NODE_LEASE_MISSED_RENEWALS=os.environ.get(
                "FSDPOP_NODE_LEASE_MISSED_RENEWALS", "8"
            ),
            FSDPOP_IDENTITY=self.identity,
            FSDPOP_LEASE_NAMESPACE=OP_NS,
        )
        return env

    def start(self) -> None:
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fsdp_operator", "run"],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    def kill(self) -> None:
        """SIGKILL: the operator gets no chance to finish anything."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM, without waiting: a clean shutdown (the leader hands its Lease back)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def sample(self, name: str, **labels: str) -> float | None:
        """The sum of one metric's samples (matching `labels`) on the operator's endpoint; None
        when it is unreachable or has no such sample."""
        try:
            with urllib.request.urlopen(self.metrics_url(), timeout=2) as resp:  # noqa: S310 (http to loopback)
                text = resp.read().decode()
        except OSError:
            return None
        found = [
            s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]
        return sum(found) if found else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        path = self.log_dir / f"operator-{self.starts}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class Jobs:
    """kubectl-level helpers for one test namespace."""

    def __init__(self, cluster: controlplane.Cluster, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    def apply(self, doc: dict[str, Any]) -> None:
        self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=json.dumps(doc))

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.cluster.kubectl(
            "patch",
            "fsdpjob",
            name,
            "-n",
            self.ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": spec}),
        )

    def get(self, name: str) -> dict[str, Any] | None:
        done = self.cluster.kubectl(
            "get", "fsdpjob", name, "-n", self.ns, "-o", "json", check=False
        )
        return json.loads(done.stdout) if done.returncode == 0 else None

    def status(self, name: str) -> dict[str, Any]:
        job = self.get(name)
        return dict((job or {}).get("status") or {})

    def pods(self, name: str | None = None) -> list[dict[str, Any]]:
        sel = f"fsdpoperator.io/job={name}" if name else "fsdpoperator.io/job"
        items = self.cluster.get_json("pods", "-n", self.ns, "-l", sel)["items"]
        return list(items)

    def running_pods(self, name: str, attempt: int) -> list[dict[str, Any]]:
        return [
            p
            for p in self.pods(name)
            if p["metadata"]["labels"].get("fsdpoperator.io/attempt") == str(attempt)
            and p["status"].get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def events(self, name: str) -> list[str]:
        items = self.cluster.get_json(
            "events", "-n", self.ns, "--field-selector", f"involvedObject.name={name}"
        )["items"]
        return [e["reason"] for e in sorted(items, key=lambda e: e.get("firstTimestamp") or "")]

    def messages(self, name: str, reason: str) -> list[str]:
        """The messages of job `name`'s Events with this reason, as `kubectl describe` shows."""
        items = self.cluster.get_json(
            "events", "-n", self.ns, "--field-selector", f"involvedObject.name={name}"
        )["items"]
        return [e.get("message") or "" for e in items if e.get("reason") == reason]

    def diagnosis(self, name: str) -> str:
        """What a user would look at when a wait on job `name` runs out: its status, its
        Events and its pods (phase, node, container states, log tails)."""
        return (
            f"status: {json.dumps(self.status(name), sort_keys=True)}\n"
            f"events: {self.events(name)}\n{self.pods_report(name)}"
        )

    def pods_report(self, name: str, log_lines: int = 25) -> str:
        """Why a job's pods do not run or do not train: each pod's phase, node and container
        states, its last `log_lines` log lines (the pods' logs go with the test's namespace),
        their warning Events, and every node whose conditions are not those of a healthy one (a
        node short of disk rejects pods with DiskPressure, seen only there)."""
        lines = []
        for pod in self.pods(name):
            status = pod.get("status") or {}
            states = []
            for c in status.get("containerStatuses") or []:
                state, detail = next(iter((c.get("state") or {"unknown": {}}).items()))
                states.append(f"{c['name']}={state}({detail.get('reason', '')})")
            node = pod["spec"].get("nodeName", "-")
            lines.append(f"pod {pod['metadata']['name']} {status.get('phase')} on {node} {states}")
            if log_lines and status.get("containerStatuses"):
                lines.extend(f"  | {line}" for line in self._log_tail(pod, log_lines))
        events = self.cluster.get_json("events", "-n", self.ns, "--field-selector", "type=Warning")
        for e in events["items"]:
            if e["involvedObject"].get("kind") == "Pod" and name in e["involvedObject"]["name"]:
                lines.append(f"event {e['involvedObject']['name']} {e['reason']}: {e['message']}")
        for node in self.cluster.get_json("nodes")["items"]:
            odd = [
                f"{c['type']}={c['status']} ({c.get('message', '')})"
                for c in node["status"].get("conditions") or []
                if (c["type"] == "Ready") != (c["status"] == "True")
            ]
            if odd:
                lines.append(f"node {node['metadata']['name']}: {'; '.join(odd)}")
        return "\n".join(lines)

    def evidence(self, name: str) -> str:
        """What the operator kept of the job's failed attempts (their `-why` ConfigMaps: the
        summary and the pods' last log lines), for a test whose attempt's pods are gone."""
        found = self.cluster.get_json(
            "configmaps", "-n", self.ns, "-l", f"fsdpoperator.io/job={name}"
        )
        out = []
        for cm in found["items"]:
            for key, text in sorted((cm.get("data") or {}).items()):
                if key == "summary.txt" or key.startswith("log-"):
                    out.append(f"== {cm['metadata']['name']} {key}\n{text}")
        return "\n".join(out)

    def _log_tail(self, pod: dict[str, Any], lines: int) -> list[str]:
        """A pod's last log lines; its kubelet may be stopped (a lost node): bounded."""
        try:
            done = self.cluster.kubectl(
                "logs",
                "-n",
                self.ns,
                pod["metadata"]["name"],
                "--all-containers",
                f"--tail={lines}",
                "--request-timeout=5s",
                check=False,
                timeout=10,
            )
        except subprocess.TimeoutExpired:
            return ["(its logs did not come in 10 s)"]
        return (done.stdout or done.stderr).splitlines()[-lines:]

    def ensure_pvc(self) -> None:
        """An RWX claim `ckpt` bound to a hostPath PV of its own: one directory on this machine
        that every node mounts, like an NFS export. Workers run as uid/gid 1000 and Kubernetes
        does not apply fsGroup to hostPath volumes, so the directory is made theirs."""
        directory = self.ckpt_dir()
        make_worker_dir(directory)
        docs = hostpath_claim(
            namespace=self.ns, name="ckpt", path=str(directory), pv_name=f"ckpt-{self.ns}"
        )
        self.cluster.kubectl("apply", "-f", "-", input=as_list(docs))

    def ckpt_dir(self, job: str | None = None) -> Path:
        volume = volumes_root(self.cluster) / self.ns / "ckpt"
        return volume / job if job else volume


def make_worker_dir(directory: Path) -> None:
    """A directory the workers (uid/gid 1000) can write, new files keeping its group."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chown(directory, WORKER_UID, WORKER_UID)
    directory.chmod(0o2775)


def volumes_root(cluster: controlplane.Cluster) -> Path:
    """Where the claims' PersistentVolumes live on this machine, one directory per claim."""
    return cluster.state_dir / "volumes"
