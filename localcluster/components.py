"""Command lines and files for the control-plane components: pure paths-and-ports in, argv out.

The certificates and kubeconfigs they point at are kubeadm's (``kubeadm``), in kubeadm's layout.
Starting, waiting for and stopping the processes is ``controlplane``'s job; nothing here spawns a
process.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from localcluster import kubeadm, network, nodes

SERVICE_CIDR = kubeadm.SERVICE_CIDR
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"
NODE_MONITOR_GRACE = "8s"
"""Node lifecycle grace: a node whose lease stops renewing turns NotReady after this."""
OWNED = (
    "pki",
    "etcd",
    "logs",
    "kubeconfigs",
    "nodes",
    "kubectl-cache",
    "scheduler.yaml",
    "kube-proxy.yaml",
    "volumes",
    "flexvolume",
    "kubeadm.yaml",
    "Corefile",
    "s3",
)
PROVISIONER = "fsdpoperator.io/local-dir"
"""The volume provisioner's name, as a StorageClass names it (``provisioner/main.go``)."""
STORAGE_CLASS = "local-dir"
"""The default StorageClass: a directory of this machine per claim, which every node mounts."""
PORTS = (
    "etcd",
    "etcd-peer",
    "apiserver",
    "controller-manager",
    "scheduler",
    "dns-ready",
    "provisioner-metrics",
    "s3",
)
"""The ports ``up`` picks at run time, under the names the command lines here read them by."""
SERVER_NAMES = ("127.0.0.1", "localhost")
"""Names on the API server's certificate besides kubeadm's own (its address, the kubernetes
Service's IP and names)."""


@dataclasses.dataclass
class Layout:
    """Where things live under the state directory."""

    root: Path

    def __post_init__(self) -> None:
        self.root = self.root.resolve()
        self.pki = self.root / "pki"
        self.logs = self.root / "logs"
        self.kubeconfigs = self.root / "kubeconfigs"
        self.admin = self.root / "kubeconfig"
        self.state = self.root / "cluster.json"
        # Beside harness.stack's hand-made volumes (volumes/<namespace>/<claim>).
        self.dynamic_volumes = self.root / "volumes" / "dynamic"
        self.object_store = self.root / "s3"  # the S3 server's buckets, one directory each

    def kubeadm(self, bin_dir: Path) -> kubeadm.Kubeadm:
        return kubeadm.Kubeadm(
            bin_dir / "kubeadm",
            config=self.root / "kubeadm.yaml",
            certificates=self.pki,
            kubeconfigs=self.kubeconfigs,
        )

    def self_signed(self, component: str) -> Path:
        """Where ``component`` (controller-manager, scheduler) writes the certificate it signs
        itself and serves with: kubeadm issues none for them."""
        return self.pki / component / f"kube-{component}.crt"


def reset(layout: Layout) -> None:
    """Remove what a previous run left, touching only paths this module owns.

    A node's mounts (container root filesystems, token volumes) are undone first: rmtree
    would otherwise descend through them.
    """
    nodes.unmount_under(layout.root)
    for name in (*OWNED, "kubeconfig", "cluster.json"):
        path = layout.root / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    layout.root.mkdir(parents=True, exist_ok=True, mode=0o700)
    for sub in (layout.pki, layout.logs, layout.kubeconfigs):
        sub.mkdir(mode=0o700)


def etcd_args(layout: Layout, ports: dict[str, int]) -> list[str]:
    client, peer = f"https://127.0.0.1:{ports['etcd']}", f"https://127.0.0.1:{ports['etcd-peer']}"
    p = layout.pki
    return [
        "etcd",
        "--name",
        "local",
        "--data-dir",
        str(layout.root / "etcd"),
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        f"local={peer}",
        "--initial-cluster-state",
        "new",
        "--cert-file",
        str(p / "etcd" / "server.crt"),
        "--key-file",
        str(p / "etcd" / "server.key"),
        "--trusted-ca-file",
        str(p / "etcd" / "ca.crt"),
        "--client-cert-auth",
        "--peer-cert-file",
        str(p / "etcd" / "peer.crt"),
        "--peer-key-file",
        str(p / "etcd" / "peer.key"),
        "--peer-trusted-ca-file",
        str(p / "etcd" / "ca.crt"),
        "--peer-client-cert-auth",
        # A throwaway test cluster: durability across power loss buys nothing, fsync costs seconds.
        "--unsafe-no-fsync",
        "--log-level",
        "warn",
    ]


def apiserver_args(layout: Layout, ports: dict[str, int]) -> list[str]:
    p = layout.pki
    return [
        "kube-apiserver",
        # On the cluster bridge: pods reach it through the `kubernetes` Service (kube-proxy),
        # host processes directly; nothing else on the machine's network sees it.
        "--bind-address",
        network.GATEWAY,
        "--advertise-address",
        network.GATEWAY,
        "--secure-port",
        str(ports["apiserver"]),
        "--etcd-servers",
        f"https://127.0.0.1:{ports['etcd']}",
        "--etcd-cafile",
        str(p / "etcd" / "ca.crt"),
        "--etcd-certfile",
        str(p / "apiserver-etcd-client.crt"),
        "--etcd-keyfile",
        str(p / "apiserver-etcd-client.key"),
        "--tls-cert-file",
        str(p / "apiserver.crt"),
        "--tls-private-key-file",
        str(p / "apiserver.key"),
        "--client-ca-file",
        str(p / "ca.crt"),
        "--authorization-mode",
        "Node,RBAC",
        "--enable-admission-plugins",
        "NodeRestriction,PodSecurity",
        "--allow-privileged=true",  # so that PodSecurity, not this flag, is what rejects pods
        "--service-account-issuer",
        SA_ISSUER,
        "--service-account-key-file",
        str(p / "sa.pub"),
        "--service-account-signing-key-file",
        str(p / "sa.key"),
        "--service-cluster-ip-range",
        SERVICE_CIDR,
        "--kubelet-client-certificate",
        str(p / "apiserver-kubelet-client.crt"),
        "--kubelet-client-key",
        str(p / "apiserver-kubelet-client.key"),
        "--kubelet-preferred-address-types",
        "InternalIP",
        "--profiling=false",
    ]


def _component_serving(layout: Layout, name: str, port: int) -> list[str]:
    kubeconfig = str(layout.kubeconfigs / f"{name}.conf")
    return [
        "--authentication-kubeconfig",
        kubeconfig,
        "--authorization-kubeconfig",
        kubeconfig,
        "--bind-address",
        "127.0.0.1",
        "--secure-port",
        str(port),
        # No --tls-cert-file: it signs its own, here (kubeadm's arrangement).
        "--cert-dir",
        str(layout.self_signed(name).parent),
        "--profiling=false",
    ]


def controller_manager_args(layout: Layout, ports: dict[str, int]) -> list[str]:
    name = "controller-manager"
    return [
        "kube-controller-manager",
        "--kubeconfig",
        str(layout.kubeconfigs / f"{name}.conf"),
        *_component_serving(layout, name, ports[name]),
        "--controllers",
        "*",
        "--use-service-account-credentials=true",
        "--service-account-private-key-file",
        str(layout.pki / "sa.key"),
        "--root-ca-file",
        str(layout.pki / "ca.crt"),
        "--node-monitor-grace-period",
        NODE_MONITOR_GRACE,
        "--node-monitor-period",
        "2s",
        "--leader-elect=false",
        # The default 20 qps throttles start-up, when every controller gets its own account.
        "--kube-api-qps",
        "200",
        "--kube-api-burst",
        "400",
        # Its default is under /usr/libexec, which it would create on the host.
        "--flex-volume-plugin-dir",
        str(layout.root / "flexvolume"),
    ]


def scheduler_args(layout: Layout, ports: dict[str, int]) -> list[str]:
    config = layout.root / "scheduler.yaml"
    config.write_text(
        json.dumps(
            {
                "apiVersion": "kubescheduler.config.k8s.io/v1",
                "kind": "KubeSchedulerConfiguration",
                "clientConnection": {"kubeconfig": str(layout.kubeconfigs / "scheduler.conf")},
                "leaderElection": {"leaderElect": False},
            }
        )
    )
    return [
        "kube-scheduler",
        "--config",
        str(config),
        *_component_serving(layout, "scheduler", ports["scheduler"]),
    ]


COREFILE = """\
{domain}:53 in-addr.arpa:53 {{
    bind {address}
    ready 127.0.0.1:{ready}
    errors
    kubernetes {domain} in-addr.arpa {{
        kubeconfig {kubeconfig}
        ttl 5
    }}
}}
.:53 {{
    bind {address}
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def coredns_args(layout: Layout, ports: dict[str, int], *, kubeconfig: Path) -> list[str]:
    """CoreDNS on the bridge's gateway, which every kubelet names as ``clusterDNS``.

    It answers for the cluster domain and reverse lookups from the API server's Services and
    EndpointSlices, and NXDOMAIN for every other name: it forwards nothing, so the host's
    resolver is never involved. ``/ready`` on loopback turns 200 once it has synced.
    """
    corefile = layout.root / "Corefile"
    corefile.write_text(
        COREFILE.format(
            domain=kubeadm.CLUSTER_DOMAIN,
            address=network.GATEWAY,
            ready=ports["dns-ready"],
            kubeconfig=kubeconfig,
        )
    )
    return ["coredns", "-conf", str(corefile)]


def provisioner_args(layout: Layout, ports: dict[str, int], *, kubeconfig: Path) -> list[str]:
    """The volume provisioner (``provisioner/main.go``, on the sig-storage provisioner library).

    For each claim of :data:`STORAGE_CLASS` it makes a directory under ``dynamic_volumes``,
    owned by the workers' uid and gid 1000 (Kubernetes applies no ``fsGroup`` to hostPath),
    and binds the claim to a hostPath volume on it; the class's ``Delete`` removes the
    directory with the claim. ``/metrics`` on loopback answers once it runs.
    """
    return [
        "local-dir-provisioner",
        "--kubeconfig",
        str(kubeconfig),
        "--base-dir",
        str(layout.dynamic_volumes),
        "--metrics-address",
        f"127.0.0.1:{ports['provisioner-metrics']}",
    ]


def storage_class() -> dict[str, Any]:
    """The cluster's default StorageClass, which the volume provisioner serves.

    Binding is Immediate: the directory is on the machine every node runs on, so there is no
    node to wait for. A claim without ``storageClassName`` gets this class (the API server's
    DefaultStorageClass admission).
    """
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {
            "name": STORAGE_CLASS,
            "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
        },
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }


def netpol_rbac(user: str) -> dict[str, Any]:
    """What kube-network-policies' own install.yaml grants its controller (list and watch of
    pods, namespaces and NetworkPolicies), bound to ``user``."""
    name = "kube-network-policies"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
            {
                "apiGroups": ["networking.k8s.io"],
                "resources": ["networkpolicies"],
                "verbs": ["list", "watch"],
            },
        ],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }
    return {"apiVersion": "v1", "kind": "List", "items": [role, binding]}
