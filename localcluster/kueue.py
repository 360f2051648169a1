"""Kueue on the local cluster: its CRDs, its controller process, and its webhooks by URL.

Kueue (sigs.k8s.io/kueue, built from its Go module by ``build-kueue.sh``) is one binary. Its
webhooks cannot be switched off; as in Kueue's own integration framework they are served here
to the API server by URL (``https://127.0.0.1:<port>``) with a certificate made for that
address, instead of through a Service. Only the plain-pod integration runs, and only in
namespaces labelled ``NAMESPACE_LABEL``: pod creation elsewhere in a shared test cluster never
passes through Kueue (its pod webhook fails closed), and ``stop`` removes the webhooks again.

    with Kueue(cluster) as kueue:
        kueue.enable(namespace)
        ...
"""

from __future__ import annotations

import base64
import contextlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from localcluster import controlplane, kubeclient, poll, procs

NAMESPACE_LABEL = "fsdpop.test/kueue"
"""Namespaces whose pods Kueue manages (its managedJobsNamespaceSelector and pod webhooks)."""
WEBHOOK_NAMES = {
    "MutatingWebhookConfiguration": "fsdpop-kueue-mutating",
    "ValidatingWebhookConfiguration": "fsdpop-kueue-validating",
}
GPU = "nvidia.com/gpu"


def find_kueue_dir() -> Path:
    """Kueue's build directory (bin/kueue, crds/, webhook/), building it on first use;
    ``FSDPOP_KUEUE_DIR`` overrides."""
    return controlplane.built_dir("build-kueue.sh", override="FSDPOP_KUEUE_DIR")


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def write_certs(directory: Path) -> bytes:
    """A CA and a serving certificate for 127.0.0.1 (tls.crt, tls.key, as controller-runtime
    reads them from its cert dir); returns the CA's PEM for the webhooks' caBundle."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=fsdpop-kueue-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        cwd=directory,
    )
    (directory / "san.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        cwd=directory,
    )
    _openssl(
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
        "-out",
        "tls.crt",
        cwd=directory,
    )
    return (directory / "ca.crt").read_bytes()


METRICS_CERTS = Path("/etc/kueue/metrics/certs")
"""Where Kueue reads its metrics server's certificate when its internal certificate management
is off: a fixed path (cmd/kueue/main.go), a mounted Secret in a real deployment."""


def _install_metrics_certs(certs: Path) -> None:
    METRICS_CERTS.mkdir(parents=True, exist_ok=True)
    for name in ("tls.crt", "tls.key"):
        tmp = METRICS_CERTS / f".{name}.tmp"
        tmp.write_bytes((certs / name).read_bytes())
        tmp.chmod(0o600)
        tmp.replace(METRICS_CERTS / name)


def _ours(webhook: dict[str, Any]) -> bool:
    """Kueue's webhooks for its own kinds and for plain pods (the integration run here)."""
    for rule in webhook.get("rules") or []:
        if "kueue.x-k8s.io" in rule.get("apiGroups", []) or "pods" in rule.get("resources", []):
            return True
    return False


def webhook_configs(manifests: str, *, port: int, ca: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, pointed at ``https://127.0.0.1:<port><path>`` and
    limited: pods only in labelled namespaces, no webhooks for integrations not run here."""
    bundle = base64.b64encode(ca).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc["metadata"] = {"name": WEBHOOK_NAMES[doc["kind"]]}
        kept = []
        for hook in doc.get("webhooks") or []:
            if not _ours(hook):
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": bundle}
            if any("pods" in r.get("resources", []) for r in hook.get("rules") or []):
                hook["namespaceSelector"] = {"matchLabels": {NAMESPACE_LABEL: "true"}}
            kept.append(hook)
        doc["webhooks"] = kept
        out.append(doc)
    return out


def config(
    *,
    webhook_port: int,
    health_port: int,
    metrics_port: int,
    cert_dir: Path,
    pods_ready_timeout: int | None = None,
) -> str:
    """Kueue's Configuration: plain pods only, in labelled namespaces, no leader election,
    certificates given (internal certificate management off: no Service to issue them for).

    `pods_ready_timeout` (seconds) turns on waitForPodsReady: an admitted group whose pods are
    not all Ready that long after admission is evicted and requeued (backoff 1 s, doubling, at
    most 4 s here, so a test sees the re-admission); its recoveryTimeout, while an admitted
    group's pods are replaced, is twice that."""
    doc: dict[str, Any] = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": "kueue-system",
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": f"127.0.0.1:{metrics_port}"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "managedJobsNamespaceSelector": {"matchLabels": {NAMESPACE_LABEL: "true"}},
        "integrations": {"frameworks": ["pod"]},
    }
    if pods_ready_timeout is not None:
        doc["waitForPodsReady"] = {
            "timeout": f"{pods_ready_timeout}s",
            "recoveryTimeout": f"{2 * pods_ready_timeout}s",
            "blockAdmission": False,
            "requeuingStrategy": {
                "timestamp": "Eviction",
                "backoffBaseSeconds": 1,
                "backoffMaxSeconds": 4,
            },
        }
    return yaml.safe_dump(doc)


class Kueue:
    """Kueue's controller on one cluster; ``start``/``stop`` or use it as a context manager."""

    def __init__(
        self,
        cluster: controlplane.Cluster,
        *,
        kueue_dir: Path | None = None,
        pods_ready_timeout: int | None = None,
    ) -> None:
        self.cluster = cluster
        self._kueue_dir = kueue_dir
        self.pods_ready_timeout = pods_ready_timeout
        self._dir = cluster.state_dir / "kueue"
        self._procs: procs.Registry | None = None
        self.kube = kubeclient.Kube(cluster.kubeconfig)
        self.health_port = 0

    @property
    def log(self) -> Path:
        return self.cluster.logs / "kueue.log"

    def __enter__(self) -> Kueue:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, *, timeout: float = 180.0) -> None:
        """CRDs, the controller, its webhooks; returns once the webhooks answer through the API
        server. Anything started is stopped again if a step fails."""
        kdir = self._kueue_dir or find_kueue_dir()
        deadline = time.monotonic() + timeout
        self._dir.mkdir(parents=True, exist_ok=True)
        ca = write_certs(self._dir / "certs")
        _install_metrics_certs(self._dir / "certs")
        webhook_port, self.health_port, metrics_port = (controlplane.free_port() for _ in range(3))
        (self._dir / "config.yaml").write_text(
            config(
                webhook_port=webhook_port,
                health_port=self.health_port,
                metrics_port=metrics_port,
                cert_dir=self._dir / "certs",
                pods_ready_timeout=self.pods_ready_timeout,
            )
        )
        self._procs = procs.Registry(self._dir / "kueue.json")
        try:
            crds = sorted((kdir / "crds").glob("*.yaml"))
            self.cluster.kubectl(
                "apply",
                "--server-side",
                "--force-conflicts",
                *[a for f in crds for a in ("-f", str(f))],
            )
            self.cluster.kubectl(
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                *[a for f in crds for a in ("-f", str(f))],
            )
            self._apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kueue-system"}}
            )
            argv = [
                str(kdir / "bin" / "kueue"),
                f"--kubeconfig={self.cluster.kubeconfig}",
                f"--config={self._dir / 'config.yaml'}",
                "--feature-gates=VisibilityOnDemand=false",
                "--zap-log-level=2",
            ]
            self._procs.spawn("kueue", argv, log=self.log, cwd=self._dir)
            manifests = (kdir / "webhook" / "manifests.yaml").read_text()
            for doc in webhook_configs(manifests, port=webhook_port, ca=ca):
                self._apply(doc)
            self._wait_ready(deadline)
        except BaseException:
            self.stop()
            raise

    def _apply(self, doc: dict[str, Any]) -> None:
        path = self._dir / f"{doc['kind'].lower()}-{doc['metadata']['name']}.json"
        path.write_text(json.dumps(doc))
        self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(path))

    def _wait_ready(self, deadline: float) -> None:
        """Kueue's readiness, then a ResourceFlavor created through its webhook (a dry run):
        the API server reaches the webhook by URL."""
        probe = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": "fsdpop-probe"},
        }
        last = ""

        def ready() -> bool:
            nonlocal last
            if self._procs is not None and not self._procs.alive():
                raise controlplane.ControlPlaneError(
                    f"kueue exited; {self.log}:\n{procs.tail(self.log)}"
                )
            if not procs.http_ok(f"http://127.0.0.1:{self.health_port}/readyz"):
                return False
            try:
                self.kube.request(
                    "POST",
                    "/apis/kueue.x-k8s.io/v1beta2/resourceflavors",
                    body=probe,
                    query={"dryRun": "All"},
                )
                return True
            except kubeclient.KubeError as exc:
                last = str(exc)
                return False

        try:
            poll.until("kueue ready", ready, timeout=deadline - time.monotonic(), every=0.5)
        except poll.TimedOut as exc:
            raise controlplane.ControlPlaneError(
                f"kueue not ready (last: {last}); {self.log}:\n{procs.tail(self.log)}"
            ) from exc

    def enable(self, namespace: str) -> None:
        """Let Kueue manage the pods of `namespace` (its label)."""
        self.cluster.kubectl("label", "namespace", namespace, f"{NAMESPACE_LABEL}=true")

    def queue(
        self,
        namespace: str,
        *,
        name: str = "team",
        cluster_queue: str = "fsdpop-gpus",
        gpus: int = 4,
        preemption: bool = True,
        topology: str | None = None,
    ) -> None:
        """A ResourceFlavor, a ClusterQueue with quota for `gpus` GPUs (CPU and memory ample)
        and a LocalQueue `name` in `namespace` pointing at it. With `topology` (a Topology's
        name, ``topology``) the flavor is that topology's own (topology-aware scheduling)."""
        flavor_name = f"{topology}-flavor" if topology else "default-flavor"
        flavor: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ResourceFlavor",
            "metadata": {"name": flavor_name},
        }
        if topology:  # a TAS flavor needs node labels: every kubelet sets this one
            flavor["spec"] = {"topologyName": topology, "nodeLabels": {"kubernetes.io/os": "linux"}}
        cq: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cluster_queue},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", GPU],
                        "flavors": [
                            {
                                "name": flavor_name,
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "64"},
                                    {"name": "memory", "nominalQuota": "256Gi"},
                                    {"name": GPU, "nominalQuota": str(gpus)},
                                ],
                            }
                        ],
                    }
                ],
            },
        }
        if preemption:
            cq["spec"]["preemption"] = {"withinClusterQueue": "LowerPriority"}
        lq = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue},
        }
        for doc in (flavor, cq, lq):
            self._apply(doc)

    def topology(self, name: str, levels: list[str]) -> None:
        """A Topology: node labels from the widest domain to the narrowest (Kueue's
        topology-aware scheduling places a pod group within one domain of a level a job asks
        for, by its pods' `kueue.x-k8s.io/podset-*-topology` annotations)."""
        self._apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "Topology",
                "metadata": {"name": name},
                "spec": {"levels": [{"nodeLabel": label} for label in levels]},
            }
        )

    def priority_class(self, name: str, value: int) -> None:
        """A WorkloadPriorityClass (label kueue.x-k8s.io/priority-class on a job names it)."""
        self._apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
        )

    def workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.kube.get_or_none(
            f"/apis/kueue.x-k8s.io/v1beta2/namespaces/{namespace}/workloads/{name}"
        )

    def stop(self) -> None:
        """Remove the webhooks first (pod creation must never again wait on a stopped Kueue),
        then stop the controller. Its CRDs and queues stay: harmless without it."""
        for kind, name in WEBHOOK_NAMES.items():
            plural = kind.lower() + "s"
            with contextlib.suppress(kubeclient.KubeError):
                self.kube.request(
                    "DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{name}"
                )
        if self._procs is not None:
            self._procs.stop_all(grace=10.0)
            self._procs = None
        self._release_pods()

    def _release_pods(self) -> None:
        """Kueue's finalizer off the pods it managed: without Kueue nothing would remove it,
        and their namespaces could never be deleted."""
        with contextlib.suppress(kubeclient.KubeError):
            held = self.kube.get("/api/v1/pods", labelSelector="kueue.x-k8s.io/managed=true")
            for pod in held.get("items") or []:
                meta = pod["metadata"]
                kept = [
                    f for f in meta.get("finalizers") or [] if not f.startswith("kueue.x-k8s.io/")
                ]
                with contextlib.suppress(kubeclient.KubeError):
                    self.kube.request(
                        "PATCH",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        body=[{"op": "replace", "path": "/metadata/finalizers", "value": kept}],
                        content_type="application/json-patch+json",
                    )
