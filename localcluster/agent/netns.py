"""Pod networking on this machine: one bridge per agent, one network namespace per pod.

Every name the agent makes carries ``fsdplc-<instance>`` (namespaces, /etc/netns dirs, the
cgroup) or ``lc<instance>`` (links: Linux caps them at 15 characters), and each live agent
registers its pid under /run/fsdplc, so a later start removes what a crashed run left behind
without touching a concurrent agent's. Addresses come from a /16 that no route on this host
uses yet; nothing is routed off the bridge. This module must not touch /etc/hosts or
/etc/resolv.conf of the host: per-namespace files go under /etc/netns/<ns>/, which
``ip netns exec`` bind-mounts over /etc inside the namespace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
import threading
from pathlib import Path

PREFIX = "fsdplc"
RUN_DIR = Path("/run/fsdplc")
NETNS_ETC = Path("/etc/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup/unified")
SHM_ROOT = Path("/dev/shm")
"""Memory-backed emptyDir volumes live under ``/dev/shm/fsdplc-<instance>/``."""
CLUSTER_DOMAIN = "cluster.local"
MOUNTPOINTS = RUN_DIR / "mountpoints"
"""Mount points the launchers had to create on the host (shared by all agents)."""


class NetError(RuntimeError):
    """An iproute2 command failed."""


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_instance(instance: str) -> None:
    """Remove every namespace, link, /etc/netns dir and cgroup of one agent instance."""
    stem = f"{PREFIX}-{instance}"
    for name in ip("netns", "list", check=False).split():
        if name.startswith(stem + "-"):
            for pid in ip("netns", "pids", name, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), 9)
            ip("netns", "del", name, check=False)
    ip("link", "del", f"lc{instance}br", check=False)
    if NETNS_ETC.is_dir():
        for entry in NETNS_ETC.glob(f"{stem}-*"):
            shutil.rmtree(entry, ignore_errors=True)
    remove_cgroup_tree(CGROUP_ROOT / stem)
    shutil.rmtree(SHM_ROOT / stem, ignore_errors=True)
    (RUN_DIR / f"{instance}.json").unlink(missing_ok=True)


def remove_cgroup_tree(root: Path) -> None:
    if not root.is_dir():
        return
    with contextlib.suppress(OSError):
        (root / "cgroup.kill").write_text("1")
    for path in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            path.rmdir()
    with contextlib.suppress(OSError):
        root.rmdir()


def cleanup_stale() -> None:
    """Clean up after agents that died without cleaning up (their registered pid is gone)."""
    live = set()
    for entry in RUN_DIR.glob("*.json") if RUN_DIR.is_dir() else []:
        pid = json.loads(entry.read_text()).get("pid", 0)
        if _alive(pid):
            live.add(entry.stem)
        else:
            cleanup_instance(entry.stem)
    for name in ip("netns", "list", check=False).split():
        parts = name.split("-")
        if name.startswith(PREFIX + "-") and len(parts) > 2 and parts[1] not in live:
            cleanup_instance(parts[1])
    if not live:
        _remove_mountpoints()


def _remove_mountpoints() -> None:
    """Remove the (empty) mount points launchers created on the host; only with no agent left.

    A container that expects /ckpt needs /ckpt to exist on the host to bind-mount onto it.
    """
    if not MOUNTPOINTS.exists():
        return
    for line in sorted(set(MOUNTPOINTS.read_text().splitlines()), key=len, reverse=True):
        path = Path(line)
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            elif path.is_file() and path.stat().st_size == 0:
                path.unlink()
    MOUNTPOINTS.unlink(missing_ok=True)


def _free_subnet() -> ipaddress.IPv4Network:
    used = [
        ipaddress.ip_network(line.split()[0], strict=False)
        for line in ip("-4", "route", "show", "table", "all").splitlines()
        if line and line.split()[0][0].isdigit()
    ]
    for second in [244, *range(245, 255), *range(200, 244)]:
        candidate = ipaddress.IPv4Network(f"10.{second}.0.0/16")
        if not any(candidate.overlaps(u) for u in used if u.prefixlen > 0):
            return candidate
    raise NetError("no free 10.x.0.0/16 for pod addresses")


@dataclasses.dataclass
class PodNet:
    """One pod's network namespace and the host end of its veth."""

    netns: str
    veth: str
    ip: str


class Network:
    """The agent's bridge and the pod namespaces on it."""

    def __init__(self, *, nodes: int) -> None:
        RUN_DIR.mkdir(parents=True, exist_ok=True)
        # Two agents starting at once must not both pick the same free subnet or instance.
        with (RUN_DIR / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cleanup_stale()
            self.instance = secrets.token_hex(2)
            while (RUN_DIR / f"{self.instance}.json").exists():
                self.instance = secrets.token_hex(2)
            self.stem = f"{PREFIX}-{self.instance}"
            self.bridge = f"lc{self.instance}br"
            (RUN_DIR / f"{self.instance}.json").write_text(json.dumps({"pid": os.getpid()}))
            self.subnet = _free_subnet()
            self._make_bridge(nodes)
        self._lock = threading.Lock()
        self._counter = 0
        self._used: set[str] = set()

    def _make_bridge(self, nodes: int) -> None:
        base = self.subnet.network_address
        self.gateway = str(base + 1)
        self._node_ips = [str(base + 256 * (i + 1) + 1) for i in range(nodes)]
        ip("link", "add", self.bridge, "type", "bridge")
        ip("addr", "add", f"{self.gateway}/{self.subnet.prefixlen}", "dev", self.bridge)
        for node_ip in self._node_ips:
            ip("addr", "add", f"{node_ip}/32", "dev", self.bridge)
        ip("link", "set", self.bridge, "up")

    def node_ip(self, index: int) -> str:
        return self._node_ips[index]

    def _allocate(self, node_index: int) -> tuple[int, str]:
        with self._lock:
            self._counter += 1
            base = self.subnet.network_address + 256 * (node_index + 1)
            for host in range(2, 255):
                address = str(base + host)
                if address not in self._used:
                    self._used.add(address)
                    return self._counter, address
        raise NetError(f"node {node_index}: no free pod address")

    def add_pod(
        self, *, node_index: int, hostname: str, fqdn: str | None, namespace: str
    ) -> PodNet:
        """Make a namespace with an address on the bridge, its resolv.conf and hosts."""
        n, address = self._allocate(node_index)
        pod = PodNet(netns=f"{self.stem}-{n}", veth=f"lc{self.instance}v{n}", ip=address)
        try:
            ip("netns", "add", pod.netns)
            ip("link", "add", pod.veth, "type", "veth", "peer", "name", "eth0", "netns", pod.netns)
            ip("link", "set", pod.veth, "master", self.bridge, "up")
            ns = ("-n", pod.netns)
            ip(*ns, "link", "set", "lo", "up")
            ip(*ns, "addr", "add", f"{address}/{self.subnet.prefixlen}", "dev", "eth0")
            ip(*ns, "link", "set", "eth0", "up")
            ip(*ns, "route", "add", "default", "via", self.gateway)
            self._write_etc(pod, hostname=hostname, fqdn=fqdn, namespace=namespace)
        except Exception:
            self.remove_pod(pod)
            raise
        return pod

    def _write_etc(self, pod: PodNet, *, hostname: str, fqdn: str | None, namespace: str) -> None:
        etc = NETNS_ETC / pod.netns
        etc.mkdir(parents=True, exist_ok=True)
        search = f"{namespace}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}"
        (etc / "resolv.conf").write_text(
            f"search {search}\nnameserver {self.gateway}\noptions ndots:5\n"
        )
        names = f"{fqdn}\t{hostname}" if fqdn else hostname
        (etc / "hosts").write_text(
            "# Kubernetes-managed hosts file (process node).\n"
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            f"{pod.ip}\t{names}\n"
        )
        (etc / "hostname").write_text(hostname + "\n")

    def remove_pod(self, pod: PodNet) -> None:
        """Delete the namespace (which takes its veth pair along) and its /etc/netns dir."""
        for pid in ip("netns", "pids", pod.netns, check=False).split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), 9)
        ip("netns", "del", pod.netns, check=False)
        ip("link", "del", pod.veth, check=False)
        shutil.rmtree(NETNS_ETC / pod.netns, ignore_errors=True)
        with self._lock:
            self._used.discard(pod.ip)

    def set_link(self, pod: PodNet, *, up: bool) -> None:
        """Cut or restore a pod's only link (the host end of its veth)."""
        ip("link", "set", pod.veth, "up" if up else "down")

    def destroy(self) -> None:
        with (RUN_DIR / ".lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            cleanup_instance(self.instance)
            cleanup_stale()
