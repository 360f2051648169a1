"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, controller-manager, scheduler.

``Cluster.up`` has kubeadm's phases write certificates and kubeconfigs, starts each component
as a plain subprocess (no shell) on ports picked at run time, waits until it is healthy, and
records what it started in ``<state_dir>/cluster.json`` so another process (the CLI's
``down``/``status``) can find it.
The cluster's network (``network``: one bridge, fenced) comes first, so the API server can
listen on the bridge; cluster DNS (CoreDNS), the volume provisioner with its default
StorageClass, the S3 server (``objectstore``) and then kubelet nodes (``nodes``,
``nodeconf``) come last.

Component command lines live in ``components``. This module does not build binaries
(``build-binaries.sh`` does) or images (``images`` does).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from localcluster import components, images, network, nodeconf, nodes, objectstore, poll, procs


class ControlPlaneError(RuntimeError):
    """The control plane could not be started, found or reached."""


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its stderr."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(f"kubectl {' '.join(args)} exited {returncode}: {stderr.strip()}")
        self.returncode = returncode
        self.stderr = stderr


@dataclasses.dataclass(frozen=True)
class NodeOptions:
    """The kubelet nodes to start (CPU and memory are the machine's own, as a kubelet reports)."""

    nodes: int = 0
    """How many nodes, each a kubelet with its own containerd; 0 starts none."""
    gpus_per_node: int = 8
    """``nvidia.com/gpu`` capacity advertised on each node (an extended resource)."""
    images: tuple[str, ...] = ()
    """Images every node's containerd must hold besides the pause image (loaded by digest)."""
    zones: int = 2
    """Nodes are labelled ``topology.kubernetes.io/zone=zone-<i mod zones>``."""


def find_bin_dir() -> Path:
    """The directory of the control-plane binaries, building them on first use.

    ``FSDPOP_BIN_DIR`` overrides; otherwise ``build-binaries.sh`` (idempotent, fast when cached)
    prints it as its last line.
    """
    return built_dir("build-binaries.sh", override="FSDPOP_BIN_DIR")


def built_dir(script_name: str, *, override: str) -> Path:
    """The directory a build script next to this module prints as its last line (building on
    first use), or ``$override`` when set."""
    if given := os.environ.get(override):
        return Path(given)
    script = Path(__file__).with_name(script_name)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.strip():
        tail = "\n".join(out.stderr.splitlines()[-20:])
        raise ControlPlaneError(f"{script} exited {out.returncode}:\n{tail}")
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    # Another process may take the port between close and use; startup then fails loudly
    # with the component's log, which is rare enough on loopback to accept.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """A running local control plane; create with :meth:`up` or :meth:`attach`."""

    def __init__(self, state_dir: Path, *, bin_dir: Path, ports: dict[str, int]) -> None:
        self._layout = components.Layout(Path(state_dir))
        self.bin_dir = Path(bin_dir)
        self.ports = dict(ports)
        self._procs = procs.Registry(self._layout.state)
        self._kubeadm = self._layout.kubeadm(self.bin_dir)

    # --- paths ---------------------------------------------------------------------------
    @property
    def state_dir(self) -> Path:
        return self._layout.root

    @property
    def kubeconfig(self) -> Path:
        """The admin (system:masters) kubeconfig."""
        return self._layout.admin

    @property
    def logs(self) -> Path:
        """One ``<component>.log`` per process."""
        return self._layout.logs

    @property
    def dynamic_volumes(self) -> Path:
        """Where the provisioner makes each claim's directory, ``<namespace>-<claim>-<pv>``."""
        return self._layout.dynamic_volumes

    @property
    def object_store(self) -> objectstore.ObjectStore:
        """The cluster's S3 server: its endpoints (host, pods) and root keys."""
        keys = objectstore.Keys(**self._procs.meta["s3"])
        return objectstore.ObjectStore(host=network.GATEWAY, port=self.ports["s3"], keys=keys)

    @property
    def server(self) -> str:
        return f"https://{network.GATEWAY}:{self.ports['apiserver']}"

    # --- lifecycle -----------------------------------------------------------------------
    @classmethod
    def up(
        cls,
        state_dir: Path,
        *,
        nodes: NodeOptions | None = None,
        bin_dir: Path | None = None,
        timeout: float = 120.0,
    ) -> Cluster:
        """Start a fresh cluster in ``state_dir`` and return once it is usable.

        Usable means: apiserver ``/readyz`` ok, controller-manager and scheduler healthy, the
        ``default`` ServiceAccount exists, and the requested nodes are Ready. Anything started
        is stopped again if a step fails.
        """
        layout = components.Layout(Path(state_dir))
        if procs.Registry(layout.state).alive():
            raise ControlPlaneError(f"a cluster is already running in {layout.root}; run down")
        components.reset(layout)
        cluster = cls(layout.root, bin_dir=bin_dir or find_bin_dir(), ports={})
        cluster.ports = {name: free_port() for name in components.PORTS}
        try:
            cluster._start(nodes or NodeOptions(), deadline=time.monotonic() + timeout)
        except BaseException:
            cluster.down()
            raise
        return cluster

    @classmethod
    def attach(cls, state_dir: Path) -> Cluster:
        """The cluster a previous ``up`` (maybe in another process) left in ``state_dir``."""
        layout = components.Layout(Path(state_dir))
        try:
            meta = json.loads(layout.state.read_text())["meta"]
        except (FileNotFoundError, KeyError, json.JSONDecodeError) as err:
            raise ControlPlaneError(f"no cluster recorded in {layout.root}") from err
        return cls(layout.root, bin_dir=Path(meta["bin_dir"]), ports=meta["ports"])

    def down(self, *, grace: float = 10.0) -> None:
        """Stop nodes (their containers too), then every recorded process, then the network."""
        count = int(self._procs.meta.get("nodes", 0))
        self._procs.stop_named(
            lambda name: name.startswith(("kubelet-", "kube-proxy")), grace=grace
        )
        for i in range(count):
            node = nodes.layout(self.state_dir, i)
            nodes.kill_containers(node.cgroup_root)
            if node.socket.exists():
                nodes.forget_containers(nodes.ctr_command(node.socket))
            nodes.kill_shims(node.socket)
        self._procs.stop_all(grace=grace)
        for i in range(count):
            node = nodes.layout(self.state_dir, i)
            nodes.remove_state(node)
            nodes.remove_cgroup_root(node.cgroup_root)
        if count:  # kube-proxy's own way to remove the iptables rules it made
            subprocess.run(
                [str(self.bin_dir / "kube-proxy"), "--cleanup"], capture_output=True, check=False
            )
        if network.release(str(self.state_dir)):
            network.down()

    def started_lines(self) -> list[str]:
        """What runs, one line each: control-plane components and each node's processes."""
        lines = [f"{name:28} pid {self._procs.pid(name) or '-'}" for name in self._procs.status()]
        for i in range(int(self._procs.meta.get("nodes", 0))):
            node = nodes.layout(self.state_dir, i)
            lines.append(
                f"{node.name}: InternalIP {node.net.ip}, pods {node.net.pod_cidr}, "
                f"containerd {node.socket}, image store {node.store}"
            )
        return lines

    def component_status(self) -> dict[str, bool]:
        """Each recorded component and whether its process is still running."""
        return self._procs.status()

    def _start(self, wanted: NodeOptions, *, deadline: float) -> None:
        self._procs.meta = {
            "bin_dir": str(self.bin_dir),
            "ports": self.ports,
            "nodes": wanted.nodes,
        }
        network.claim(str(self.state_dir), nodes=wanted.nodes, pid=os.getpid())
        network.up(wanted.nodes)
        self._write_pki()
        self._spawn("etcd", components.etcd_args(self._layout, self.ports))
        etcd = self._procs.pid("etcd")
        network.claim(str(self.state_dir), nodes=wanted.nodes, pid=etcd or os.getpid())
        self._wait_etcd(deadline)
        self._spawn("apiserver", components.apiserver_args(self._layout, self.ports))
        self._wait("apiserver", f"{self.server}/readyz", deadline)
        # What `kubeadm init phase bootstrap-token` grants the API server's kubelet client (that
        # phase also makes join tokens, which nothing here uses): logs, exec, port-forward.
        self.kubectl(
            "create",
            "clusterrolebinding",
            "kubeadm:apiserver-kubelet-client",
            "--clusterrole=system:kubelet-api-admin",
            "--user=kube-apiserver-kubelet-client",
        )
        self._spawn(
            "controller-manager", components.controller_manager_args(self._layout, self.ports)
        )
        self._spawn("scheduler", components.scheduler_args(self._layout, self.ports))
        for name in ("controller-manager", "scheduler"):
            ca = self._layout.self_signed(name)
            self._wait(name, self._health_url(name), deadline, ca=ca)
        self._poll("controller-manager", self._default_account_exists, deadline)
        dns = components.coredns_args(self._layout, self.ports, kubeconfig=self.kubeconfig)
        self._spawn("cluster-dns", dns)
        ready = f"http://127.0.0.1:{self.ports['dns-ready']}/ready"
        self._poll("cluster-dns", functools.partial(procs.http_ok, ready), deadline)
        self._start_storage(deadline)
        self._start_object_store(deadline)
        if wanted.nodes:
            self._start_nodes(wanted, deadline=deadline)

    def _start_storage(self, deadline: float) -> None:
        """The volume provisioner and the default StorageClass it serves."""
        argv = components.provisioner_args(self._layout, self.ports, kubeconfig=self.kubeconfig)
        self._spawn("storage-provisioner", argv)
        self.kubectl("create", "-f", "-", input=json.dumps(components.storage_class()))
        metrics = f"http://127.0.0.1:{self.ports['provisioner-metrics']}/metrics"
        self._poll("storage-provisioner", functools.partial(procs.http_ok, metrics), deadline)

    def _start_object_store(self, deadline: float) -> None:
        """versitygw on the bridge's gateway with fresh root keys, named in the cluster by a
        Service without a selector (objectstore.py says why each choice)."""
        keys = objectstore.Keys.fresh()
        self._procs.meta["s3"] = dataclasses.asdict(keys)  # cluster.json is the owner's (0700)
        self._layout.object_store.mkdir(mode=0o700, exist_ok=True)
        binary = built_dir("build-versitygw.sh", override="FSDPOP_VERSITYGW")
        port, data = self.ports["s3"], self._layout.object_store
        argv = objectstore.server_args(binary=binary, host=network.GATEWAY, port=port, data=data)
        log = self.logs / "s3.log"
        self._procs.spawn("s3", argv, log=log, cwd=self.state_dir, env=keys.server_env())
        objects = objectstore.service_objects(host=network.GATEWAY, port=port)
        self.kubectl(
            "apply",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}),
        )
        self._poll("s3", self.object_store.answers, deadline)

    def _start_nodes(self, wanted: NodeOptions, *, deadline: float) -> None:
        refs = (images.PAUSE, *(r for r in wanted.images if r != images.PAUSE))
        layouts = [nodes.layout(self.state_dir, i) for i in range(wanted.nodes)]
        for node in layouts:
            # Containers a cluster killed without `down` left in this node's cgroup root.
            nodes.kill_containers(node.cgroup_root)
            nodes.prepare(node=node, pki=self._kubeadm, sandbox_image=images.PAUSE)
            self._spawn(f"containerd-{node.name}", nodeconf.containerd_args(node))
            name = f"containerd-{node.name}"
            nodes.wait_socket(node.socket, functools.partial(self._alive, name))
        # Every node's images side by side: on a fresh machine each node unpacks the 5.9 GB
        # worker (about 2 minutes), and one after another that was the slowest part of a first
        # `make test`'s cluster start. One after another when the disk holds only one node's
        # peak at a time (its blobs are dropped once unpacked).
        side_by_side = _fits(layouts, refs=refs)
        with concurrent.futures.ThreadPoolExecutor(len(layouts) if side_by_side else 1) as pool:
            for _ in pool.map(functools.partial(_load, refs=refs), layouts):
                pass
        # Loading a 7 GB image into a fresh node takes minutes; the kubelets then get a fresh
        # minute to register and turn Ready.
        deadline = max(deadline, time.monotonic() + 60.0)
        for node in layouts:
            zone = f"zone-{node.index % max(1, wanted.zones)}"
            # Every kubelet serves the device-plugin registry on one fixed path, whatever its
            # --root-dir: it deletes the sockets there and binds. Two starting together race
            # (one binds between the other's delete and bind, and exits with EADDRINUSE), so
            # each kubelet is started once the one before it has bound.
            nodes.DEVICE_PLUGIN_SOCKET.unlink(missing_ok=True)
            self._spawn(f"kubelet-{node.name}", nodeconf.kubelet_args(node, zone=zone))
            self._poll(f"kubelet-{node.name}", nodes.DEVICE_PLUGIN_SOCKET.exists, deadline)
        self._start_kube_proxy(hostname=layouts[0].name)
        self._start_network_policies([node.name for node in layouts])
        for node in layouts:
            ready = functools.partial(self.node_ready, node.name)
            self._poll(f"kubelet-{node.name}", ready, deadline)
            nodes.advertise_gpus(self.kubectl, node.name, wanted.gpus_per_node)
        # The kubelet copies patched capacity into allocatable on its next status update; the
        # scheduler places GPU pods by allocatable, so the cluster is not up before that.
        for node in layouts:
            gpus = functools.partial(self._allocatable_gpus, node.name, wanted.gpus_per_node)
            self._poll(f"kubelet-{node.name}", gpus, deadline)

    def _start_kube_proxy(self, *, hostname: str) -> None:
        kubeconfig = self._kubeadm.user(
            self._layout.kubeconfigs / "kube-proxy.conf", client="system:kube-proxy"
        )
        config = self.state_dir / "kube-proxy.yaml"
        config.write_text(
            json.dumps(nodeconf.kube_proxy_config(kubeconfig=kubeconfig, hostname=hostname))
        )
        self._spawn("kube-proxy", ["kube-proxy", "--config", str(config)])

    def _start_network_policies(self, node_names: list[str]) -> None:
        """NetworkPolicies enforced by the upstream kube-network-policies controller, one for
        every node (netpol/main.go says why), with the rights its own manifest grants."""
        user = "system:kube-network-policies"
        kubeconfig = self._kubeadm.user(self._layout.kubeconfigs / "netpol.conf", client=user)
        self.kubectl("apply", "-f", "-", input=json.dumps(components.netpol_rbac(user)))
        argv = [
            "netpol",
            f"--kubeconfig={kubeconfig}",
            f"--node={node_names[0]}",
            f"--queue={network.POLICY_QUEUE}",
        ]
        self._spawn("netpol", argv)

    def _default_account_exists(self) -> bool:
        done = self.kubectl("get", "serviceaccount", "default", "--namespace=default", check=False)
        return done.returncode == 0

    def _alive(self, name: str) -> bool:
        return self._procs.status().get(name, False)

    def _spawn(self, name: str, argv: list[str]) -> None:
        if not argv[0].startswith("/"):
            argv = [str(self.bin_dir / argv[0]), *argv[1:]]
        self._procs.spawn(name, argv, log=self.logs / f"{name}.log", cwd=self.state_dir)

    def _health_url(self, name: str) -> str:
        return f"https://127.0.0.1:{self.ports[name]}/healthz"

    def _wait(self, name: str, url: str, deadline: float, *, ca: Path | None = None) -> None:
        """Poll ``url`` (anonymous, verified against ``ca``, the cluster CA by default)."""
        trusted = ca or self._kubeadm.ca
        self._poll(name, lambda: procs.https_ok(url, ca=trusted), deadline)

    def _wait_etcd(self, deadline: float) -> None:
        pki = self._layout.pki / "etcd"
        client = (pki / "healthcheck-client.crt", pki / "healthcheck-client.key")
        url = f"https://127.0.0.1:{self.ports['etcd']}/health"
        ready = functools.partial(procs.https_ok, url, ca=pki / "ca.crt", client=client)
        self._poll("etcd", ready, deadline)

    def _poll(self, name: str, ready: Callable[[], bool], deadline: float) -> None:
        """Wait for `name` to be ready by `deadline`; its exit ends the wait at once."""

        def up() -> bool:
            if ready():
                return True
            if not self._procs.status().get(name, False):
                raise ControlPlaneError(f"{name} exited:\n{procs.tail(self.logs / f'{name}.log')}")
            return False

        try:
            poll.until(f"{name} ready", up, timeout=deadline - time.monotonic(), every=0.2)
        except poll.TimedOut as exc:
            raise ControlPlaneError(
                f"{name} not ready in time:\n{procs.tail(self.logs / f'{name}.log')}"
            ) from exc

    # --- clients -------------------------------------------------------------------------
    def kubectl(
        self,
        *args: str,
        kubeconfig: Path | None = None,
        input: str | None = None,
        check: bool = True,
        timeout: float = 60.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run the cluster's own kubectl with ``args`` (admin unless ``kubeconfig`` is given).

        Raises :class:`KubectlError` (with stderr) on a non-zero exit when ``check``.
        """
        argv = [
            str(self.bin_dir / "kubectl"),
            "--kubeconfig",
            str(kubeconfig or self.kubeconfig),
            "--cache-dir",
            str(self.state_dir / "kubectl-cache"),
            *args,
        ]
        done = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise KubectlError(args, done.returncode, done.stderr)
        return done

    def get_json(self, *args: str) -> Any:
        """``kubectl get <args> -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def kubeconfig_for_serviceaccount(
        self, namespace: str, name: str, *, duration: str = "24h"
    ) -> Path:
        """A kubeconfig that authenticates as ServiceAccount ``namespace/name``.

        The token comes from the TokenRequest API (``kubectl create token``), bound to the
        account and expiring after ``duration``; the account needs RBAC bindings to do anything.
        """
        token = self.kubectl(
            "create", "token", name, "--namespace", namespace, "--duration", duration
        ).stdout.strip()
        path = self._layout.kubeconfigs / f"sa-{namespace}-{name}.conf"
        client = f"system:serviceaccount:{namespace}:{name}"
        return self._kubeadm.user(path, client=client, token=token)

    def node_ready(self, name: str) -> bool:
        done = self.kubectl("get", "node", name, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        conditions = json.loads(done.stdout).get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def _allocatable_gpus(self, name: str, count: int) -> bool:
        done = self.kubectl("get", "node", name, "-o", "json", check=False)
        if done.returncode != 0:
            return False
        allocatable = json.loads(done.stdout).get("status", {}).get("allocatable") or {}
        return allocatable.get(nodes.GPU_RESOURCE) == str(count)

    def ready_nodes(self) -> int:
        """How many Node objects report Ready=True."""
        nodes = self.get_json("nodes")["items"]
        return sum(
            any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
            for n in nodes
            if n.get("status", {}).get("conditions")
        )

    def _write_pki(self) -> None:
        """kubeadm's certificates and component kubeconfigs, and the admin kubeconfig."""
        version = subprocess.run(
            [str(self._kubeadm.binary), "version", "-o", "short"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        self._kubeadm.write_config(
            address=network.GATEWAY,
            port=self.ports["apiserver"],
            kubernetes_version=version,
            server_names=components.SERVER_NAMES,
        )
        self._kubeadm.init_phases()
        self._kubeadm.user(self.kubeconfig, client="kubernetes-admin", groups=("system:masters",))


DISK_RESERVE = 3 << 30
"""Bytes left free beside the images' peak: the jobs' checkpoints, the logs, etcd."""


def _fits(layouts: Sequence[nodeconf.NodeLayout], *, refs: Sequence[str]) -> bool:
    """Whether every node can load ``refs`` side by side; False when only one at a time fits.

    Raises ControlPlaneError naming the bytes needed and free when not even one node fits: a
    node out of space mid-import leaves a cluster whose pods never start.
    """
    if not layouts:
        return True
    where = layouts[0].store.parent
    needs = [images.disk_needed(address=node.socket, refs=refs) for node in layouts]
    free = shutil.disk_usage(where).free
    if sum(needs) + DISK_RESERVE <= free:
        return True
    gib = 1 << 30
    if max(needs) + DISK_RESERVE > free:
        raise ControlPlaneError(
            f"loading the images into the nodes needs {max(needs) / gib:.1f} GiB at its peak "
            f"(one node at a time; {sum(needs) / gib:.1f} GiB side by side) and "
            f"{DISK_RESERVE / gib:.0f} GiB beside it, but the disk of {where} has {free / gib:.1f} "
            "GiB free: free some space (removing a stopped cluster's node stores there "
            "costs a fresh import)"
        )
    print(
        f"loading the nodes' images one at a time: {sum(needs) / gib:.1f} GiB side by side "
        f"would not fit in {free / gib:.1f} GiB free",
        file=sys.stderr,
        flush=True,
    )
    return False


def _load(node: nodeconf.NodeLayout, *, refs: Sequence[str]) -> None:
    """``refs`` into ``node``'s containerd (only what it lacks), then drop their layer blobs."""
    images.ensure_loaded(address=node.socket, refs=refs)
    for ref in refs:
        nodes.discard_layers(nodes.ctr_command(node.socket), ref)
