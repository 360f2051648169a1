"""The end-to-end suite's cluster: any kubeconfig, with the chart installed by helm.

Two ways in:

- On this machine (default): the session's local cluster (real kubelets, the project's images
  loaded into every node) and ``localcluster.faults``.
- Any other cluster (``make kind-e2e`` sets these): ``FSDP_E2E_KUBECONFIG``, the images it can
  run (``FSDP_E2E_WORKER_IMAGE``, ``FSDP_E2E_OPERATOR_IMAGE``), a directory every node mounts
  at ``FSDP_E2E_NODE_DIR`` that this machine sees at ``FSDP_E2E_HOST_DIR`` (kind's
  ``extraMounts``), and ``FSDP_E2E_FAULTS=kind`` (faults through ``kubectl exec`` and
  ``docker pause`` of the node's container).

Either way the suite installs the chart (``helm upgrade --install``) into its own namespace
with the operator image and otherwise the chart's defaults (no ``checkpointMount``: the
operator reads no tenant's storage, the pods choose their checkpoints), and uninstalls it when
the suite ends, so no other operator acts on its jobs and it acts on no one else's. Each test
namespace gets its claim from the cluster's default StorageClass here (a real provisioner), a
hostPath volume on the shared directory elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml

from fsdp_operator.types import names
from harness import stack
from localcluster import faults as local_faults
from localcluster import images, poll

NAMESPACE = "fsdp-e2e"
PROFILE = "e2e-rdma"
RELEASE = "fsdp-e2e"
WORKER_UID = stack.WORKER_UID


class Faults(Protocol):
    def kill_rank(self, namespace: str, pod: str, *, rank: int) -> object: ...
    def lose_node(self, node: str, *, freeze: str = "") -> None: ...
    def restore_node(self, node: str) -> None: ...


class Kube:
    """kubectl and helm against one kubeconfig (the parts of ``Cluster`` the suite uses)."""

    def __init__(self, kubeconfig: Path, kubectl: str) -> None:
        self.kubeconfig = kubeconfig
        self._kubectl = kubectl

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        argv = [self._kubectl, "--kubeconfig", str(self.kubeconfig), *args]
        done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()}")
        return done

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


class KindFaults:
    """Faults for a kind cluster: a rank killed from inside its pod, a node container paused."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube

    def kill_rank(self, namespace: str, pod: str, *, rank: int) -> object:
        code = (
            "import os, signal\n"
            "for p in filter(str.isdigit, os.listdir('/proc')):\n"
            "    try:\n"
            "        env = open(f'/proc/{p}/environ', 'rb').read().split(b'\\0')\n"
            "        comm = open(f'/proc/{p}/comm').read().strip()\n"
            "    except OSError: continue\n"
            f"    if b'RANK={rank}' in env or comm == 'rank-{rank}':\n"  # rank-N: warm.py's
            "        os.kill(int(p), signal.SIGKILL)\n"
        )
        return self.kube.kubectl("exec", "-n", namespace, pod, "--", "python", "-c", code)

    def lose_node(self, node: str, *, freeze: str = "") -> None:
        subprocess.run(["docker", "pause", node], check=True)  # every pod stops with it

    def restore_node(self, node: str) -> None:
        subprocess.run(["docker", "unpause", node], check=True)


class E2E:
    """What a test needs: the cluster, its faults, the shared volume and the images."""

    def __init__(
        self,
        *,
        kube: Any,
        faults: Faults,
        host_dir: Path,
        node_dir: str,
        worker_image: str,
        operator_image: str,
        dynamic: bool = False,
    ) -> None:
        self.kube, self.faults = kube, faults
        self.host_dir, self.node_dir = host_dir, node_dir
        self.worker_image, self.operator_image = worker_image, operator_image
        self.operator = stack.ChartOperator(kube, namespace=NAMESPACE, release=RELEASE)
        self.dynamic = dynamic
        self.claims: dict[tuple[str, str], Path] = {}
        """(namespace, claim) -> the claim's directory as this machine sees it."""

    def gang_only(self, namespace: str, job: str) -> None:
        """A NetworkPolicy that lets only the job's own pods into its pods, as a tenant's
        default-deny does: the operator's scrape of rank 0 gets no answer, the gang's own
        traffic passes, and so do the kubelet's probes (they come from the pod's node).
        Enforced here by kube-network-policies (localcluster/netpol), on kind by kindnet."""
        job_label = {names.Label.JOB.value: job}
        policy = {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": f"{job}-gang-only", "namespace": namespace},
            "spec": {
                "podSelector": {"matchLabels": job_label},
                "policyTypes": ["Ingress"],
                "ingress": [{"from": [{"podSelector": {"matchLabels": job_label}}]}],
            },
        }
        self.kube.kubectl("apply", "-f", "-", input=json.dumps(policy))

    def tenant_policies(self, namespace: str) -> None:
        """examples/networkpolicy.yaml, for this operator's namespace: deny by default, let
        FSDPJobs' gangs, DNS and the operator's scrape through."""
        docs = list(
            yaml.safe_load_all((stack.ROOT / "examples" / "networkpolicy.yaml").read_text())
        )
        for doc in docs:
            for rule in doc["spec"].get("ingress", []):
                for peer in rule["from"]:
                    labels = peer.get("namespaceSelector", {}).get("matchLabels", {})
                    if labels.get("kubernetes.io/metadata.name") == "fsdp-system":
                        labels["kubernetes.io/metadata.name"] = NAMESPACE
        self.kube.kubectl("apply", "-n", namespace, "-f", "-", input=stack.as_list(docs))

    def claim(self, namespace: str, name: str = "ckpt") -> Path:
        """A ReadWriteMany claim in `namespace`; returns its directory as this machine sees it.

        On this machine the cluster's default StorageClass provisions it (a real provisioner,
        `localcluster/provisioner`), as a tenant's claim would be; elsewhere it is bound to a
        hostPath volume on the shared directory.
        """
        host = self._provisioned(namespace, name) if self.dynamic else self._static(namespace, name)
        self.claims[namespace, name] = host
        return host

    def _provisioned(self, namespace: str, name: str) -> Path:
        claim = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }
        self.kube.kubectl("apply", "-f", "-", input=json.dumps(claim))

        def bound() -> str | None:
            got = self.kube.get_json("pvc", "-n", namespace, name)
            return got["spec"].get("volumeName") if got["status"].get("phase") == "Bound" else None

        def why() -> str:
            return self.kube.kubectl("describe", "pvc", "-n", namespace, name, check=False).stdout

        volume = poll.until(f"claim {namespace}/{name} bound", bound, timeout=90, diagnosis=why)
        return Path(self.kube.get_json("pv", volume)["spec"]["hostPath"]["path"])

    def _static(self, namespace: str, name: str) -> Path:
        """An RWX claim bound to a hostPath PV on the shared directory.

        The directory is made the workers' (uid/gid 1000): Kubernetes applies fsGroup to
        volumes that support ownership management, and hostPath and NFS exports do not.
        """
        host = self.host_dir / namespace / name
        try:
            stack.make_worker_dir(host)
        except PermissionError:  # not root (a hosted runner): let uid 1000 write all the same
            host.mkdir(parents=True, exist_ok=True)
            host.chmod(0o777)
        docs = stack.hostpath_claim(
            namespace=namespace,
            name=name,
            pv_name=f"{namespace}-{name}",
            path=f"{self.node_dir}/{namespace}/{name}",
        )
        self.kube.kubectl("apply", "-f", "-", input=stack.as_list(docs))
        return host


def _local(request: pytest.FixtureRequest) -> E2E:
    cluster = request.getfixturevalue("cluster")
    root = stack.volumes_root(cluster)
    root.mkdir(parents=True, exist_ok=True)
    return E2E(
        kube=cluster,
        faults=local_faults.Faults.for_cluster(cluster.state_dir),
        host_dir=root,
        node_dir=str(root),
        worker_image=images.WORKER,
        operator_image=images.OPERATOR,
        dynamic=True,
    )


def _remote() -> E2E:
    env = os.environ
    kube = Kube(Path(env["FSDP_E2E_KUBECONFIG"]), shutil.which("kubectl") or "kubectl")
    if env.get("FSDP_E2E_FAULTS", "kind") != "kind":
        raise pytest.UsageError("FSDP_E2E_FAULTS: only 'kind' is known besides this machine")
    return E2E(
        kube=kube,
        faults=KindFaults(kube),
        host_dir=Path(env["FSDP_E2E_HOST_DIR"]),
        node_dir=env["FSDP_E2E_NODE_DIR"],
        worker_image=env["FSDP_E2E_WORKER_IMAGE"],
        operator_image=env["FSDP_E2E_OPERATOR_IMAGE"],
    )


def _split(ref: str) -> tuple[str, str]:
    repository, _, tag = ref.rpartition(":")
    return repository, tag


@pytest.fixture(scope="package")
def e2e(request: pytest.FixtureRequest) -> Iterator[E2E]:
    env = _remote() if os.environ.get("FSDP_E2E_KUBECONFIG") else _local(request)
    kube = env.kube
    stack.install_crd(kube)
    kube.kubectl("create", "namespace", NAMESPACE, check=False)
    repository, tag = _split(env.operator_image)
    # The chart's defaults but for the image and two timings: no checkpointMount, so the
    # operator reads no tenant's storage and the pods choose their checkpoints (auto), as in a
    # default install (docs/contract.md).
    values = {
        "image.repository": repository,
        "image.tag": tag,
        "image.pullPolicy": "Never",
        "settings.nodeExclusionSeconds": "20",
        "settings.drainTimeoutSeconds": "30",
        # the kubelets here renew their 4 s Leases every second: 8 missed is 8 s of silence,
        # the local node-monitor grace (the default 2 is 22.5 s on a kubelet's default Lease)
        "settings.nodeLeaseMissedRenewals": "8",
        # a runtime profile as an admin writes one for RDMA (no devices here): the crash and
        # node loss scenario runs under it; it lists that test's namespace itself
        f"runtimeProfiles.{PROFILE}.capabilities": "{IPC_LOCK}",
        f"runtimeProfiles.{PROFILE}.shmSize": "512Mi",
        f"runtimeProfiles.{PROFILE}.env[0].name": "NCCL_SOCKET_IFNAME",
        f"runtimeProfiles.{PROFILE}.env[0].value": "eth0",
        # the suite's namespaces run their tenants' own policies (examples/networkpolicy.yaml,
        # gang_only: the operator kept from rank 0's metrics), applied while attempt 1 runs;
        # the jobs' own (networkPolicy.enabled) is judged at each attempt's gang, so until the
        # next attempt it would still open what those close (docs/operations.md says to turn it
        # off there); tests/integration covers it.
        "networkPolicy.enabled": "false",
    }
    stack.install_chart(kube, values=values, namespace=NAMESPACE, release=RELEASE)
    try:
        yield env
    finally:
        stack.uninstall_chart(kube, namespace=NAMESPACE, release=RELEASE)


@pytest.fixture
def namespace(e2e: E2E) -> Iterator[str]:
    """A namespace that enforces Pod Security "restricted", with an RWX claim `ckpt`."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    e2e.kube.kubectl("create", "namespace", name)
    e2e.kube.kubectl("label", "namespace", name, "pod-security.kubernetes.io/enforce=restricted")
    e2e.claim(name)
    yield name
    e2e.kube.kubectl("delete", "namespace", name, "--wait=false", check=False)


def spare_job(
    e2e: E2E, name: str, *, nproc: int, steps: int, **failure_policy: Any
) -> dict[str, Any]:
    """examples/tiny-cpu.yaml as 2 pods of `nproc` real torch ranks and a warm spare, restarts
    in place, a lost node seen in 4 s and the start of a gang of real torch ranks given its own
    deadline; `failure_policy` adds to spec.failurePolicy."""
    doc: dict[str, Any] = yaml.safe_load((stack.ROOT / "examples" / "tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(
        image=e2e.worker_image,
        nprocPerNode=nproc,
        spares=1,
        resources={"requests": {"cpu": "500m", "memory": "1Gi"}},
    )
    doc["spec"]["training"]["steps"] = steps
    # progressDeadlineSeconds / 4 is the scrape period (15 s)
    doc["spec"]["failurePolicy"].update(
        nodeLossGraceSeconds=4,
        progressDeadlineSeconds=60,
        startupDeadlineSeconds=240,
        inPlaceRestarts=2,
        **failure_policy,
    )
    return doc
