"""Certificates and kubeconfigs for the local control plane, made by kubeadm's own phases.

``kubeadm init phase certs all`` writes the cluster CA, the etcd CA, every serving and client
certificate of the control plane and the service-account key pair; ``kubeadm init phase
kubeconfig`` writes the components' kubeconfigs; ``kubeadm kubeconfig user`` writes the rest
(kube-proxy, each kubelet, service-account tokens). The layout is kubeadm's, so a reader who
knows a kubeadm cluster knows this one. Keys are ECDSA P-256: fast to make.

Kubelets serve with a certificate they sign themselves, and the API server does not verify it:
kubeadm's default arrangement (it issues no kubelet serving certificates).

This module runs only the ``kubeadm`` binary it is given (argument lists, never a shell) and
writes only under the directories it is given; it starts no long-lived process.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import yaml

API_VERSION = "kubeadm.k8s.io/v1beta4"
SERVICE_CIDR = "10.96.0.0/16"
CLUSTER_DOMAIN = "cluster.local"
COMPONENTS = ("controller-manager", "scheduler")
"""The ``kubeadm init phase kubeconfig`` phases used. The admin kubeconfig is a ``kubeconfig
user`` in system:masters: kubeadm's ``admin.conf`` group is bound only by a full ``init``."""


class KubeadmError(RuntimeError):
    """A kubeadm command failed; the message carries its command line and output."""


class Kubeadm:
    """One cluster's kubeadm configuration, PKI directory and kubeconfig directory."""

    def __init__(
        self,
        binary: Path,
        *,
        config: Path,
        certificates: Path,
        kubeconfigs: Path,
    ) -> None:
        self.binary = binary
        self.config = config
        self.certificates = certificates
        self.kubeconfigs = kubeconfigs

    @property
    def ca(self) -> Path:
        return self.certificates / "ca.crt"

    def write_config(
        self, *, address: str, port: int, kubernetes_version: str, server_names: tuple[str, ...]
    ) -> None:
        """kubeadm's InitConfiguration and ClusterConfiguration for an API server on
        ``address:port``; ``server_names`` are extra names on its serving certificate."""
        init = {
            "apiVersion": API_VERSION,
            "kind": "InitConfiguration",
            "localAPIEndpoint": {"advertiseAddress": address, "bindPort": port},
            "nodeRegistration": {"name": "control-plane"},
        }
        loopback = ["127.0.0.1", "localhost"]
        cluster = {
            "apiVersion": API_VERSION,
            "kind": "ClusterConfiguration",
            "kubernetesVersion": kubernetes_version,
            "certificatesDir": str(self.certificates),
            "encryptionAlgorithm": "ECDSA-P256",
            "controlPlaneEndpoint": f"{address}:{port}",
            "networking": {"serviceSubnet": SERVICE_CIDR, "dnsDomain": CLUSTER_DOMAIN},
            "apiServer": {"certSANs": list(server_names)},
            "etcd": {"local": {"serverCertSANs": loopback, "peerCertSANs": loopback}},
        }
        self.config.write_text(yaml.safe_dump_all([init, cluster], sort_keys=False))

    def init_phases(self) -> None:
        """Every certificate, key and component kubeconfig the control plane starts with."""
        self._run("init", "phase", "certs", "all")
        for phase in COMPONENTS:
            self._run(
                "init", "phase", "kubeconfig", phase, "--kubeconfig-dir", str(self.kubeconfigs)
            )

    def component(self, name: str) -> Path:
        """A component kubeconfig written by :meth:`init_phases` (``scheduler.conf`` ...)."""
        return self.kubeconfigs / f"{name}.conf"

    def user(
        self,
        path: Path,
        *,
        client: str,
        groups: tuple[str, ...] = (),
        token: str | None = None,
    ) -> Path:
        """Write a kubeconfig for ``client`` to ``path`` (owner-only): a client certificate
        with ``groups`` as its organizations, or the bearer ``token`` when given."""
        argv = ["kubeconfig", "user", "--client-name", client]
        argv += [f"--org={group}" for group in groups]
        if token is not None:
            argv += ["--token", token]
        document = self._run(*argv)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(document)
        return path

    def _run(self, *args: str) -> str:
        argv = [str(self.binary), *args, "--config", str(self.config)]
        done = subprocess.run(argv, capture_output=True, text=True)
        if done.returncode != 0:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-15:])
            raise KubeadmError(f"`{' '.join(argv)}` exited {done.returncode}:\n{tail}")
        return done.stdout
