"""The host side of the local cluster's network: one bridge, node addresses, fences.

Every node's pods join one Linux bridge (``fsdplc0``), so pod-to-pod traffic across nodes is
plain L2 on this machine. The bridge holds the gateway (also the API server's and cluster DNS's
address) and one /32 per node (kubelets refuse a loopback node IP). Nothing the cluster
addresses may leave the machine: the pod range and the service range get blackhole routes
under the bridge's own, and a filter chain drops anything from the pod range that would be
forwarded off the bridge. The ranges are the cluster's own and fixed, so one cluster runs per
machine at a time.

This module runs ``ip`` and ``iptables`` with argument lists; it knows nothing about pods.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import json
import os
import subprocess
from pathlib import Path

BRIDGE = "fsdplc0"
BRIDGE_MAC = "02:fd:70:00:00:01"
"""The bridge's own MAC (locally administered): fixed, so that pods joining never change it."""
POD_RANGE = ipaddress.ip_network("10.244.0.0/16")
"""Owned by the local cluster; blackholed below the bridge's half."""
BRIDGE_NET = ipaddress.ip_network("10.244.0.0/17")
SERVICE_RANGE = ipaddress.ip_network("10.96.0.0/16")
GATEWAY = "10.244.0.1"
FENCE_CHAIN = "FSDPLC-FENCE"
POLICY_CHAIN = "FSDPLC-NETPOL"
POLICY_QUEUE = 100
"""The NFQUEUE the NetworkPolicy controller (localcluster/netpol) reads."""
MAX_NODES = 200
USERS = Path("/run/fsdplc/network")
"""One file per cluster using the bridge: its state dir and a live process of it."""


class NetworkError(RuntimeError):
    """An ``ip`` or ``iptables`` command failed."""


def _run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise NetworkError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


@dataclasses.dataclass(frozen=True)
class NodeNet:
    """One node's addresses: its InternalIP and the range its pods draw from."""

    index: int

    @property
    def ip(self) -> str:
        return str(BRIDGE_NET.network_address + 10 + self.index)

    @property
    def pod_first(self) -> str:
        return str(BRIDGE_NET.network_address + 256 * (self.index + 1) + 2)

    @property
    def pod_last(self) -> str:
        return str(BRIDGE_NET.network_address + 256 * (self.index + 1) + 254)

    @property
    def pod_cidr(self) -> str:
        return f"{BRIDGE_NET.network_address + 256 * (self.index + 1)}/24"


def node_net(index: int) -> NodeNet:
    if not 0 <= index < min(MAX_NODES, BRIDGE_NET.num_addresses // 256 - 1):
        raise NetworkError(f"node index {index} is outside 0..{MAX_NODES - 1}")
    return NodeNet(index)


def claim(owner: str, *, nodes: int, pid: int) -> None:
    """Record that the cluster in ``owner`` (its state dir, alive while ``pid`` is) uses it.

    Several control planes may share the bridge (each on its own API server port), but only
    one may run nodes: node addresses, cgroup roots and kube-proxy's rules are per machine.
    """
    USERS.mkdir(parents=True, exist_ok=True)
    for entry in USERS.iterdir():
        data = json.loads(entry.read_text())
        if not _alive(int(data["pid"])):
            entry.unlink(missing_ok=True)
        elif nodes and data["nodes"] and data["owner"] != owner:
            raise NetworkError(
                f"the cluster in {data['owner']} runs nodes on this machine; stop it first"
                " (python -m localcluster --state-dir DIR down)"
            )
    record = {"owner": owner, "pid": pid, "nodes": nodes}
    (USERS / _key(owner)).write_text(json.dumps(record))


def release(owner: str) -> bool:
    """Forget ``owner``; True when no other live cluster uses the network any more."""
    (USERS / _key(owner)).unlink(missing_ok=True)
    if not USERS.is_dir():
        return True
    return not [e for e in USERS.iterdir() if _alive(int(json.loads(e.read_text())["pid"]))]


def _key(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()[:16]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def up(nodes: int) -> None:
    """Create the bridge with the gateway and ``nodes`` node addresses, routes and fences."""
    if not _run("ip", "-o", "link", "show", BRIDGE, check=False):
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
    # A bridge without an address of its own takes its lowest port's: every new pod's veth
    # could change the gateway's MAC under the running pods, whose ARP entries then point at
    # a MAC no one answers until they expire (tens of seconds without DNS, the API server or
    # services). Seen: keepers that resolve their coordinator's name each ask lost it when a
    # test started other pods, and stopped a healthy gang. Set, it stays (CNI's bridge does
    # the same).
    _run("ip", "link", "set", BRIDGE, "address", BRIDGE_MAC)
    _ensure_address(f"{GATEWAY}/{BRIDGE_NET.prefixlen}")
    for i in range(nodes):
        _ensure_address(f"{node_net(i).ip}/32")
    _run("ip", "link", "set", BRIDGE, "up")
    for net in (POD_RANGE, SERVICE_RANGE):
        _run("ip", "route", "replace", "blackhole", str(net))
    _fence()
    _policy_queue()


def _ensure_address(cidr: str) -> None:
    if f" {cidr} " not in _run("ip", "-o", "-4", "addr", "show", "dev", BRIDGE):
        _run("ip", "addr", "add", cidr, "dev", BRIDGE)


def _fence() -> None:
    """Drop pod-range packets forwarded anywhere but the bridge (ip_forward may be on)."""
    rules = [[d, str(POD_RANGE), "!", "-o", BRIDGE, "-j", "DROP"] for d in ("-s", "-d")]
    _chain(FENCE_CHAIN, rules, first=True)


def _policy_queue() -> None:
    """Hand each new connection between pods (bridged, so it passes FORWARD) to the
    NetworkPolicy controller's NFQUEUE (localcluster/netpol), which accepts or drops it. The
    upstream controller queues with nftables' own queue expression, which this kernel lacks;
    iptables' NFQUEUE target is the same queue. ``--queue-bypass``: with no controller
    listening, packets pass. Traffic between a pod and its node (the kubelet's probes, the
    cluster DNS, the API server) never crosses FORWARD: node traffic is always allowed."""
    queue = ["-j", "NFQUEUE", "--queue-num", str(POLICY_QUEUE), "--queue-bypass"]
    rules = [
        ["-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "RETURN"],
        ["-s", str(POD_RANGE), "-d", str(POD_RANGE), *queue],
    ]
    _chain(POLICY_CHAIN, rules, first=False)


def _chain(name: str, rules: list[list[str]], *, first: bool) -> None:
    """Chain ``name`` holding exactly ``rules``, jumped to from FORWARD (first or last)."""
    if _run("iptables", "-w", "-n", "-L", name, check=False):
        _run("iptables", "-w", "-F", name)
    else:
        _run("iptables", "-w", "-N", name)
    for rule in rules:
        _run("iptables", "-w", "-A", name, *rule)
    jump = ("FORWARD", "-j", name)
    if subprocess.run(["iptables", "-w", "-C", *jump], capture_output=True).returncode != 0:
        _run("iptables", "-w", "-I" if first else "-A", *jump)


def down() -> None:
    """Remove the bridge, routes, fence and policy queue (pods' veths go with the bridge's
    ports)."""
    _run("ip", "link", "del", BRIDGE, check=False)
    for net in (POD_RANGE, SERVICE_RANGE):
        _run("ip", "route", "del", "blackhole", str(net), check=False)
    for chain in (FENCE_CHAIN, POLICY_CHAIN):
        _run("iptables", "-w", "-D", "FORWARD", "-j", chain, check=False)
        _run("iptables", "-w", "-F", chain, check=False)
        _run("iptables", "-w", "-X", chain, check=False)
