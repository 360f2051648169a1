"""Pod networking on process nodes: own addresses, cluster DNS inside the namespaces, TCP.

Two pods behind a headless Service find each other by DNS name (the short name through the
search path, and the full name) and talk TCP both ways; a ClusterIP Service's name gives its
virtual IP and an outside name does not resolve (cluster DNS forwards nothing); the host,
where the operator runs, reaches a pod's address directly.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from localcluster import network, poll
from localcluster.controlplane import Cluster
from tests.cluster._podkit import apply, python_pod, running, terminated, wait_phase

pytestmark = pytest.mark.cluster

PORT = 7000
PEER = """
import json, os, socket, sys, threading, time
me, peer, ns = os.environ["ME"], os.environ["PEER"], os.environ["NS"]
served = threading.Event()
server = socket.create_server(("0.0.0.0", PORT_NUMBER))
def serve():
    while True:
        conn, _ = server.accept()
        conn.sendall(b"hello from " + me.encode() + b" " + conn.recv(64))
        conn.close()
        served.set()
threading.Thread(target=serve, daemon=True).start()
deadline, last = time.time() + 60, None
while time.time() < deadline:
    try:
        with socket.create_connection((peer + ".peers", PORT_NUMBER), timeout=2) as conn:
            conn.sendall(me.encode())
            reply = conn.recv(128).decode()
        break
    except OSError as exc:
        last = exc
        time.sleep(0.5)
else:
    sys.exit(f"cannot reach {peer}.peers: {last}")
full = socket.gethostbyname(f"{peer}.peers.{ns}.svc.cluster.local")
service = sorted({a[4][0] for a in socket.getaddrinfo(f"peers.{ns}.svc.cluster.local", None)})
virtual = socket.gethostbyname(f"peers-vip.{ns}.svc.cluster.local")
try:
    outside = socket.gethostbyname("example.com")
except socket.gaierror as exc:
    outside = f"not resolved: {exc.errno}"
served.wait(60)
# Stay up a little so the peer's last connection finds us.
time.sleep(3)
open("/dev/termination-log", "w").write(json.dumps(
    {"reply": reply, "full": full, "service": service, "virtual": virtual, "outside": outside}))
""".replace("PORT_NUMBER", str(PORT))


def _peer(name: str, other: str, namespace: str) -> dict[str, object]:
    pod = python_pod(name, PEER, labels={"app": "peer"}, hostname=name, subdomain="peers")
    pod["spec"]["containers"][0]["env"] = [
        {"name": "ME", "value": name},
        {"name": "PEER", "value": other},
        {"name": "NS", "value": namespace},
    ]
    return pod


def test_pods_reach_each_other_by_dns_name_over_tcp(cluster: Cluster, kube_namespace: str) -> None:
    spec: dict[str, object] = {
        "selector": {"app": "peer"},
        "ports": [{"name": "tcp", "port": PORT}],
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers"},
        "spec": {**spec, "clusterIP": "None"},
    }
    vip = {**service, "metadata": {"name": "peers-vip"}, "spec": spec}
    peers = (_peer("a", "b", kube_namespace), _peer("b", "a", kube_namespace))
    apply(cluster, kube_namespace, service, vip, *peers)
    a = wait_phase(cluster, kube_namespace, "a", ("Succeeded", "Failed"), timeout=120)
    b = wait_phase(cluster, kube_namespace, "b", ("Succeeded", "Failed"), timeout=120)
    for pod in (a, b):
        assert pod["status"]["phase"] == "Succeeded", terminated(pod).get("message")
    seen_a = json.loads(terminated(a)["message"])
    seen_b = json.loads(terminated(b)["message"])
    assert seen_a["reply"] == "hello from b a"
    assert seen_b["reply"] == "hello from a b"
    assert seen_a["full"] == b["status"]["podIP"]
    assert seen_b["full"] == a["status"]["podIP"]
    assert a["status"]["podIP"] != b["status"]["podIP"]
    both = sorted([a["status"]["podIP"], b["status"]["podIP"]])
    assert both in (seen_a["service"], seen_b["service"])
    # A ClusterIP Service resolves to its virtual IP (kube-proxy serves it); nothing is
    # forwarded off the cluster, so an outside name does not resolve.
    cluster_ip = cluster.get_json("service", "peers-vip", "-n", kube_namespace)["spec"]["clusterIP"]
    assert seen_a["virtual"] == seen_b["virtual"] == cluster_ip
    assert seen_a["outside"].startswith("not resolved"), seen_a["outside"]


def test_host_reaches_pod_address(cluster: Cluster, kube_namespace: str) -> None:
    server = (
        "import socket\ns = socket.create_server(('0.0.0.0', 8080))\n"
        "while True:\n    c, _ = s.accept(); c.sendall(b'metrics'); c.close()\n"
    )
    apply(cluster, kube_namespace, python_pod("web", server))
    ip = running(cluster, kube_namespace, "web")["status"]["podIP"]

    def fetch() -> bytes:
        try:
            with socket.create_connection((ip, 8080), timeout=1) as conn:
                return conn.recv(16)
        except OSError:
            return b""

    assert poll.until("host -> pod TCP", fetch, timeout=20) == b"metrics"


def test_the_gateway_keeps_its_mac_when_pods_join(cluster: Cluster, kube_namespace: str) -> None:
    """A Linux bridge with no MAC of its own takes its lowest port's, so a new pod's veth could
    change the gateway's MAC under the running pods: their ARP entries then point at a MAC no
    one answers, and DNS, the API server and Services go dark for them until the entries expire
    (seen: keepers lost their coordinator's name and stopped a healthy gang). The bridge's MAC
    is set, and five pods joining leave it as it was."""
    sysfs = Path("/sys/class/net") / network.BRIDGE
    assert (sysfs / "address").read_text().strip() == network.BRIDGE_MAC
    assert (sysfs / "addr_assign_type").read_text().strip() == "3", "set, not inherited"
    sleeper = "import time\nwhile True: time.sleep(1)"
    pods = [python_pod(f"joiner-{i}", sleeper) for i in range(5)]
    apply(cluster, kube_namespace, *pods)
    for pod in pods:
        running(cluster, kube_namespace, pod["metadata"]["name"])
    assert (sysfs / "address").read_text().strip() == network.BRIDGE_MAC
