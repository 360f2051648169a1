"""What one kubelet node is made of, as files: containerd, CNI, kubelet and kube-proxy configs.

Pure: a :class:`NodeLayout` (paths, addresses) in, documents and argument lists out. The
settings this machine needs are named where they are set (containerd's
``restrict_oom_score_adj``, kubelet's ``failCgroupV1: false`` and cgroupfs driver, a node IP on
the cluster bridge). Starting the processes is ``nodes``' job; nothing here spawns one.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from localcluster import network

CLUSTER_DOMAIN = "cluster.local"
KUBELET_PORT = 10250
KUBELET_HEALTHZ_PORT = 10248
STREAM_PORT = 10010
NODE_LEASE_SECONDS = 4
"""Renewed every quarter of this: well inside the controller-manager's 8 s grace."""
CNI_BIN = "/usr/lib/cni"
CGROUP_PARENT = "fsdplc"
"""Node cgroup roots live under ``/<CGROUP_PARENT>/<node>`` in every v1 hierarchy."""


@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """Where one node keeps things: ``state`` is per run, ``store`` (images) survives runs."""

    name: str
    index: int
    state: Path
    store: Path

    @property
    def net(self) -> network.NodeNet:
        return network.node_net(self.index)

    @property
    def socket(self) -> Path:
        return self.state / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.state / "containerd.toml"

    @property
    def kubelet_config(self) -> Path:
        return self.state / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubelet.kubeconfig"

    @property
    def cni_dir(self) -> Path:
        return self.state / "cni"

    @property
    def kubelet_root(self) -> Path:
        return self.state / "kubelet"

    @property
    def cgroup_root(self) -> str:
        return f"/{CGROUP_PARENT}/{self.name}"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def _toml(table: dict[str, Any], prefix: str = "") -> str:
    """Nested dicts as TOML tables (keys are plain or already quoted by the caller)."""
    scalars = [f"{k} = {_toml_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
    out = "\n".join(scalars)
    if prefix and scalars:
        out = f"[{prefix}]\n{out}"
    for key, sub in table.items():
        if isinstance(sub, dict):
            out += "\n\n" + _toml(sub, f"{prefix}.{key}" if prefix else key)
    return out.strip() + "\n"


def containerd_config(node: NodeLayout, *, sandbox_image: str) -> str:
    cri = {
        "sandbox_image": sandbox_image,
        # The sandbox lacks CAP_SYS_RESOURCE: without this every pod sandbox fails with
        # "runc create failed: ... can't get final child's PID from pipe: EOF".
        "restrict_oom_score_adj": True,
        "stream_server_address": node.net.ip,
        "stream_server_port": str(STREAM_PORT),
        "enable_selinux": False,
        "max_container_log_line_size": 16384,
        "containerd": {
            "snapshotter": "overlayfs",
            "default_runtime_name": "runc",
            "runtimes": {
                "runc": {
                    "runtime_type": "io.containerd.runc.v2",
                    "options": {
                        "SystemdCgroup": False,
                        "BinaryName": "runc",
                        "Root": str(node.state / "runc"),
                    },
                }
            },
        },
        "cni": {"bin_dir": CNI_BIN, "conf_dir": str(node.cni_dir), "max_conf_num": 1},
        "registry": {"config_path": ""},
    }
    doc = {
        "version": 2,
        "root": str(node.store / "containerd"),
        "state": str(node.state / "containerd"),
        "disabled_plugins": [
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.internal.v1.tracing",
            "io.containerd.tracing.processor.v1.otlp",
        ],
        "grpc": {"address": str(node.socket)},
        "ttrpc": {"address": str(node.socket) + ".ttrpc"},
        "plugins": {
            '"io.containerd.grpc.v1.cri"': cri,
            '"io.containerd.internal.v1.opt"': {"path": str(node.store / "opt")},
        },
    }
    return _toml(doc)


def cni_config(node: NodeLayout) -> dict[str, Any]:
    """Every node on the one bridge; each draws addresses from its own /24 of it."""
    return {
        "cniVersion": "1.0.0",
        "name": "fsdplc",
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.BRIDGE,
                # The gateway address is set on the bridge by localcluster.network, which also
                # fences forwarding; the plugin must not assign it or masquerade anything.
                "isGateway": False,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(node.state / "ipam"),
                    "ranges": [
                        [
                            {
                                "subnet": str(network.BRIDGE_NET),
                                "rangeStart": node.net.pod_first,
                                "rangeEnd": node.net.pod_last,
                                "gateway": network.GATEWAY,
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0", "gw": network.GATEWAY}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: NodeLayout, *, ca: Path, dns: str) -> dict[str, Any]:
    ip = node.net.ip
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": ip,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        # This machine: hybrid cgroups with v1 controllers, no systemd.
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "clusterDNS": [network.GATEWAY if dns == "" else dns],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(node.state / "resolv.conf"),
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "serializeImagePulls": False,
        "failSwapOn": False,
        "rotateCertificates": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        # No registry can refill an image the kubelet collects: never collect them here.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # Bytes, not a share of the disk: a disk shared with other machines reports its whole
        # size (252 GB here) with far less of it ours, and 2 % of that (5 GB) would put every
        # node under DiskPressure while the images and jobs still fit.
        "evictionHard": {
            "memory.available": "100Mi",
            "nodefs.available": "1Gi",
            "imagefs.available": "1Gi",
            "nodefs.inodesFree": "2%",
        },
        "maxPods": 110,
        "podPidsLimit": -1,
        "shutdownGracePeriod": "0s",
        "volumePluginDir": str(node.state / "volume-plugins"),
        # Not the shared /var/log/pods: each kubelet's container GC deletes the log directory
        # of every pod it does not know, which includes all pods of the other nodes.
        "podLogsDir": str(node.state / "pod-logs"),
        "logging": {"verbosity": 1},
    }


def kubelet_args(node: NodeLayout, *, zone: str) -> list[str]:
    return [
        "kubelet",
        "--config",
        str(node.kubelet_config),
        "--kubeconfig",
        str(node.kubeconfig),
        "--root-dir",
        str(node.kubelet_root),
        "--cert-dir",
        str(node.state / "pki"),
        "--hostname-override",
        node.name,
        "--node-ip",
        node.net.ip,
        "--node-labels",
        f"topology.kubernetes.io/zone={zone}",
        "--register-node=true",
    ]


def containerd_args(node: NodeLayout) -> list[str]:
    return ["/usr/bin/containerd", "--config", str(node.containerd_config)]


def kube_proxy_config(*, kubeconfig: Path, hostname: str) -> dict[str, Any]:
    """One kube-proxy for the machine: every node shares the host's network namespace."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": hostname,
        "mode": "iptables",
        "clusterCIDR": str(network.POD_RANGE),
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # Setting nf_conntrack_max is not permitted in this sandbox; keep the kernel's.
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
        "nodePortAddresses": ["primary"],
    }
