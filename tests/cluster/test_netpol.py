"""NetworkPolicies are enforced on the kubelet nodes (kube-network-policies, localcluster/netpol):
a pod a policy isolates takes traffic only from the pods it allows, on every node, while its
node's kubelet still probes it. What a tenant's default-deny does to the operator's scrape
(issue 21) rests on exactly these three facts."""

from __future__ import annotations

import json

import pytest

from localcluster import poll
from localcluster.controlplane import Cluster
from tests.cluster._podkit import apply, get_pod, python_pod, running, wait_phase

pytestmark = pytest.mark.cluster

SERVER = (
    "import http.server\n"
    "http.server.ThreadingHTTPServer(('', 8080), http.server.SimpleHTTPRequestHandler)"
    ".serve_forever()\n"
)


def _client(name: str, ip: str, *, role: str, node: str) -> dict[str, object]:
    code = (
        "import sys, urllib.request\n"
        "try:\n"
        f"    urllib.request.urlopen('http://{ip}:8080/', timeout=3).read()\n"
        "except Exception as err:\n"
        "    open('/dev/termination-log', 'w').write(repr(err)); sys.exit(1)\n"
    )
    return python_pod(name, code, labels={"role": role}, node=node)


def _outcome(cluster: Cluster, namespace: str, name: str) -> str:
    pod = wait_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout=90)
    return str(pod["status"]["phase"])


def test_an_isolated_pod_takes_only_allowed_peers_and_its_kubelets_probes(
    cluster: Cluster, kube_namespace: str
) -> None:
    nodes = sorted(n["metadata"]["name"] for n in cluster.get_json("nodes")["items"])
    probe = {"httpGet": {"path": "/", "port": 8080}, "periodSeconds": 1, "failureThreshold": 2}
    server = python_pod("server", SERVER, labels={"app": "server"}, node=nodes[0])
    server["spec"]["containers"][0]["readinessProbe"] = probe
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": "friends-only"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "server"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [{"podSelector": {"matchLabels": {"role": "friend"}}}]}],
        },
    }
    apply(cluster, kube_namespace, server)
    ip = running(cluster, kube_namespace, "server")["status"]["podIP"]
    apply(cluster, kube_namespace, _client("before", ip, role="stranger", node=nodes[1]))
    assert _outcome(cluster, kube_namespace, "before") == "Succeeded", "no policy yet: open"
    apply(cluster, kube_namespace, policy)

    # The controller programs the policy on its own watch: strangers are refused once it has.
    tries = iter(range(20))

    def refused() -> bool:
        name = f"stranger-{next(tries)}"
        apply(cluster, kube_namespace, _client(name, ip, role="stranger", node=nodes[1]))
        return _outcome(cluster, kube_namespace, name) == "Failed"

    poll.until("a stranger refused by the policy", refused, timeout=120)
    # from the server's own node too: pods there are isolated just the same
    apply(cluster, kube_namespace, _client("neighbour", ip, role="stranger", node=nodes[0]))
    assert _outcome(cluster, kube_namespace, "neighbour") == "Failed"
    stranger = get_pod(cluster, kube_namespace, "neighbour")
    assert stranger is not None
    assert "timed out" in stranger["status"]["containerStatuses"][0]["state"]["terminated"].get(
        "message", ""
    ), json.dumps(stranger["status"])
    # a connection to an address no pod holds (a pod just gone) is judged too, and the
    # controller lives on (v0.8.0 without its NRI plugin died on one: localcluster/netpol)
    nobody = ip.rsplit(".", 1)[0] + ".250"
    apply(cluster, kube_namespace, _client("to-nobody", nobody, role="friend", node=nodes[1]))
    assert _outcome(cluster, kube_namespace, "to-nobody") == "Failed"
    assert cluster.component_status()["netpol"], "the policy controller still runs"
    apply(cluster, kube_namespace, _client("friend", ip, role="friend", node=nodes[-1]))
    assert _outcome(cluster, kube_namespace, "friend") == "Succeeded", "allowed peers pass"
    # the kubelet's probe comes from the node: the policy leaves it alone
    pod = get_pod(cluster, kube_namespace, "server")
    assert pod is not None
    ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", pod["status"]
