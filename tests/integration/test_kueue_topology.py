"""An FSDPJob under Kueue's topology-aware scheduling and its `waitForPodsReady`, on the local
cluster's kubelet nodes (a real Kueue v0.17.0; its own process, configured for this module).

The nodes are labelled into two blocks, two nodes and one; a job of two whole-node pods asks,
by its annotation `kueue.x-k8s.io/podset-required-topology`, for one block: every attempt's
pods must land in the block of two. Kueue's `waitForPodsReady` runs with a timeout shorter than
the job's own progress deadline, so Kueue, not the operator, gives up on a gang that never gets
Ready; its recovery timeout is longer than a restart, so a crash is the operator's to handle in
the admitted group.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from fsdp_operator.types import status as st
from localcluster import controlplane, poll
from localcluster import kueue as lk
from tests.integration import harness

# The module's first test also waits for Kueue's build, which `make test` starts beside pytest
# (on a fresh machine it may still be compiling): more than the 300 s default.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
BLOCK = "fsdpop.test/block"
HOSTNAME = "kubernetes.io/hostname"
TOPOLOGY = "fsdpop-blocks"
GROUP = "kueue.x-k8s.io/pod-group-name"
# Kueue's; its recovery timeout is twice that (localcluster/kueue.py). Above a start plus rank
# 0's readiness probe period (progressDeadlineSeconds / 6: 15 s), below the job's progress
# deadline (90 s): Kueue, not the operator, gives up on the gang that never gets Ready.
PODS_READY_TIMEOUT = 40
PROGRESS_DEADLINE = 90


@pytest.fixture(scope="module")
def kueue(cluster: controlplane.Cluster) -> Iterator[lk.Kueue]:
    k = lk.Kueue(cluster, pods_ready_timeout=PODS_READY_TIMEOUT)
    k.start()
    try:
        yield k
    finally:
        k.stop()


def _gpu_pods_on_nodes(cluster: controlplane.Cluster) -> list[str]:
    """Pods bound to a node, not ended, that ask for GPUs (Kueue's TAS counts them as used)."""
    items = cluster.get_json("pods", "-A")["items"]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']} on {p['spec']['nodeName']}"
        f" ({p['status'].get('phase')})"
        for p in items
        if p["spec"].get("nodeName")
        and p["status"].get("phase") not in ("Succeeded", "Failed")
        and any(
            lk.GPU in ((c.get("resources") or {}).get("requests") or {})
            for c in p["spec"]["containers"]
        )
    ]


def _node_states(cluster: controlplane.Cluster) -> dict[str, str]:
    out = {}
    for node in cluster.get_json("nodes")["items"]:
        ready = next(
            (c["status"] for c in node["status"].get("conditions") or [] if c["type"] == "Ready"),
            "Unknown",
        )
        taints = [t["key"] for t in node["spec"].get("taints") or []]
        out[node["metadata"]["name"]] = f"Ready={ready} taints={taints}"
    return out


@pytest.fixture
def blocks(cluster: controlplane.Cluster) -> Iterator[dict[str, str]]:
    """node -> block: the first node alone in b2, the others in b1. Waits until every node is
    Ready, untainted and holds no GPU pod (a job an earlier test left ending), since a whole-node
    pod needs all 8 of a node's GPUs free in Kueue's view."""
    poll.until(
        "every node Ready, untainted, its GPUs free",
        lambda: all(v == "Ready=True taints=[]" for v in _node_states(cluster).values())
        and not _gpu_pods_on_nodes(cluster),
        timeout=240,
        diagnosis=lambda: f"nodes {_node_states(cluster)}; GPU pods {_gpu_pods_on_nodes(cluster)}",
    )
    nodes = sorted(_node_states(cluster))
    assert len(nodes) >= 3, nodes
    placed = {node: ("b2" if i == 0 else "b1") for i, node in enumerate(nodes[:3])}
    for node, block in placed.items():
        cluster.kubectl("label", "node", node, f"{BLOCK}={block}", "--overwrite")
    try:
        yield placed
    finally:
        for node in placed:
            cluster.kubectl("label", "node", node, f"{BLOCK}-", check=False)


def _context(jobs: harness.Jobs, kueue: lk.Kueue, name: str) -> str:
    s = jobs.status(name)
    group = (s.get("queue") or {}).get("podGroup")
    wl = kueue.workload(jobs.ns, group) if group else None
    pods = [
        (
            p["metadata"]["name"],
            p["status"].get("phase"),
            p["spec"].get("nodeName"),
            p["spec"].get("schedulingGates"),
            p["spec"].get("nodeSelector"),
        )
        for p in jobs.pods(name)
    ]
    return "\n".join(
        [
            f"status: {json.dumps(s)[:3000]}",
            f"events: {jobs.events(name)}",
            f"workload {group}: {json.dumps((wl or {}).get('status'))[:2000]}",
            f"pods: {pods}",
            f"kueue log:\n{lk.procs.tail(kueue.log, 20)}",
        ]
    )


def _admitted_since(wl: dict | None) -> str | None:
    conds = {c["type"]: c for c in ((wl or {}).get("status") or {}).get("conditions") or []}
    admitted = conds.get("Admitted") or {}
    return admitted.get("lastTransitionTime") if admitted.get("status") == "True" else None


def test_topology_and_pods_ready_timeout_work_with_the_operator(
    jobs: harness.Jobs, kueue: lk.Kueue, blocks: dict[str, str], operator: harness.Operator
) -> None:
    """Attempt 1's gang never meets (rank 0 never Ready): Kueue's waitForPodsReady evicts the
    group after its 40 s, before the job's 90 s progress deadline; the operator reads that as
    Kueue's eviction (Preempted: no budget, no failure) and the group is re-admitted. Attempt 2
    trains, then a rank crashes: attempt 3 replaces the pods in the same admitted group within
    Kueue's recovery timeout (no second eviction). Every attempt's pods sit in block b1."""
    kueue.enable(jobs.ns)
    kueue.topology(TOPOLOGY, [BLOCK, HOSTNAME])
    cq = f"cq-{jobs.ns}"
    kueue.queue(jobs.ns, name="tas", cluster_queue=cq, gpus=16, topology=TOPOLOGY)
    name = harness.unique("kq-tas")
    doc = harness.job_doc(
        name,
        replicas=2,
        minReplicas=2,
        training={"steps": 160},
        resources={"limits": {lk.GPU: 8}},  # a whole node each (docs/operations.md, Kueue)
        failurePolicy={"progressDeadlineSeconds": PROGRESS_DEADLINE},
        env={
            "STANDIN_MEET_SECONDS": "600",  # attempt 1 only: rank 0 never Ready
            "STANDIN_FAIL_AT_STEP": "100",  # 20 s in: rank 0 Ready, the group PodsReady
            "STANDIN_FAIL_ATTEMPT": "2",
            "STANDIN_FAIL_RANK": "1",
        },
    )
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "tas"}
    doc["metadata"]["annotations"] = {"kueue.x-k8s.io/podset-required-topology": BLOCK}
    jobs.apply(doc)
    ctx = lambda: _context(jobs, kueue, name)  # noqa: E731
    placed: dict[str, set[str]] = {}  # attempt -> the nodes its pods ran on
    groups: dict[str, set[str]] = {}  # attempt -> its pods' Kueue pod group

    def seen(test: Callable[[dict], bool]) -> Callable[[], dict | None]:
        """A wait's condition on the job's status that also notes where its pods run."""

        def check() -> dict | None:
            for p in jobs.pods(name):
                labels = p["metadata"]["labels"]
                attempt = labels["fsdpoperator.io/attempt"]
                groups.setdefault(attempt, set()).add(labels[GROUP])
                if node := p["spec"].get("nodeName"):
                    placed.setdefault(attempt, set()).add(node)
            s = jobs.status(name)
            return s if test(s) else None

        return check

    first = poll.until(
        f"{name} attempt 1 running",
        seen(lambda s: s.get("phase") == "Running"),
        timeout=120,
        diagnosis=ctx,
    )
    group = first["queue"]["podGroup"]
    wl = kueue.workload(jobs.ns, group)
    assert wl is not None
    assert wl["spec"]["podSets"][0]["topologyRequest"]["required"] == BLOCK, wl["spec"]
    assignment = wl["status"]["admission"]["podSetAssignments"][0]
    assert assignment.get("topologyAssignment"), assignment

    evicted = poll.until(
        f"{name} evicted by Kueue's PodsReady timeout",
        seen(lambda s: bool(s.get("history") and s["history"][0].get("cause"))),
        timeout=PODS_READY_TIMEOUT + 60,
        diagnosis=ctx,
    )
    first_end = evicted["history"][0]
    assert first_end["cause"] == st.Cause.PREEMPTED.value, evicted["history"]

    def preempted_said() -> list[str]:
        """The job's Preempted Events' words (the Event is written after the status that
        records the cause: read at once, it can be missing on a loaded machine)."""
        return [
            e["message"]
            for e in jobs.cluster.get_json(
                "events", "-n", jobs.ns, "--field-selector", f"involvedObject.name={name}"
            )["items"]
            if e["reason"] == st.Cause.PREEMPTED.value
        ]

    said = poll.until(f"{name}: a Preempted Event", preempted_said, timeout=30, diagnosis=ctx)
    assert "PodsReadyTimeout" in said[0], said  # Kueue's reason, in the job's Event

    def trains_again(s: dict) -> bool:
        again = s.get("attempt") == 3 and s.get("phase") == "Running"
        return again and (s.get("step") or 0) > (s.get("resumedFromStep") or 0)

    s = poll.until(
        f"{name} attempt 3 trains in the same group",
        seen(trains_again),
        timeout=240,
        diagnosis=ctx,
    )
    # one pod group throughout: attempt 2's pods waited for the evicted group's re-admission
    # (Kueue's requeue backoff), attempt 3's replaced attempt 2's crashed gang in the group
    # whose admission is still the one attempt 2 trained under: no eviction, no requeue
    # (Kueue's recovery timeout did not run out)
    assert groups["1"] == groups["2"] == groups["3"] == {group}, groups
    t = st.parse_rfc3339
    admitted = _admitted_since(kueue.workload(jobs.ns, group))
    attempt2 = s["history"][1]
    assert admitted is not None, _context(jobs, kueue, name)
    # re-admitted after Kueue's eviction (RFC 3339 seconds), before attempt 2's crash
    assert (
        t(first_end["ended"]) - 2 <= t(admitted) <= t(attempt2["ended"])
    ), f"admitted {admitted}\n{_context(jobs, kueue, name)}"
    causes = [h.get("cause") for h in s["history"]]
    assert causes[:2] == [st.Cause.PREEMPTED.value, st.Cause.CRASH.value], s["history"]
    assert s["queue"]["podGroup"] == group, s["queue"]
    done = poll.until(
        f"{name} Succeeded",
        seen(lambda d: d.get("phase") == "Succeeded"),
        timeout=180,
        diagnosis=ctx,
    )
    assert done["attempt"] == 3 and done["replicas"] == 2, done
    assert done["restarts"]["application"] == 1 and done["restarts"]["infrastructure"] == 0
    assert done["reliability"]["failures"] == 1, done["reliability"]  # the crash, not Kueue's
    wl = kueue.workload(jobs.ns, group)
    conds = {c["type"]: c for c in (wl or {}).get("status", {}).get("conditions") or []}
    assert conds.get("Finished", {}).get("status") == "True", conds
    assert jobs.events(name).count(st.Cause.PREEMPTED.value) == 1, jobs.events(name)
    in_b1 = {node for node, block in blocks.items() if block == "b1"}
    assert set(placed) == {"1", "2", "3"}, placed
    assert all(nodes <= in_b1 for nodes in placed.values()), (placed, blocks)
    nan = float("nan")
    print(
        f"PodsReady eviction -> attempt 2 running (re-admitted) "
        f"{done['history'][1].get('recoverSeconds') or nan:.1f}s; crash -> attempt 3 running in "
        f"the same group {done['history'][2].get('recoverSeconds') or nan:.1f}s"
    )
