"""Benchmark: how fast the operator turns a failure into a replacement attempt.

Starts its own local cluster (real control plane, kubelet nodes) and the operator with the
chart's RBAC, runs stand-in jobs under real torchrun, and measures with one watcher clock:

- crash: the failed pod's Failed phase seen on the API -> the first pod of the next attempt
  seen on the API (goal p50 <= 2 s, p95 <= 5 s);
- node loss: the node turning NotReady (its condition's transition time) and the moment the
  heartbeat stopped -> the operator recording NodeLost (goal: nodeLossGraceSeconds + 5 s).

Prints a table and writes bench/results/operator_recovery.json. Numbers, not assertions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import kubernetes

from localcluster import controlplane, images
from localcluster import faults as lf
from tests.integration import harness

OUT = Path(__file__).resolve().parent / "results" / "operator_recovery.json"


class PodClock:
    """Watches pods of one namespace; remembers when each (pod, phase) was first seen."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.seen: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        client = kubernetes.config.new_client_from_config(str(kubeconfig))
        self.core = kubernetes.client.CoreV1Api(client)
        self.ns = namespace
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            w = kubernetes.watch.Watch()
            for ev in w.stream(self.core.list_namespaced_pod, self.ns, timeout_seconds=30):
                pod = ev["object"]
                key = (pod.metadata.name, "Added" if ev["type"] == "ADDED" else pod.status.phase)
                self.seen.setdefault(key, time.time())
                if self._stop.is_set():
                    w.stop()
                    break

    def first(self, pred: Any) -> float | None:
        hits = [t for (name, phase), t in self.seen.items() if pred(name, phase)]
        return min(hits) if hits else None

    def stop(self) -> None:
        self._stop.set()


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def crash_trials(jobs: harness.Jobs, clock: PodClock, n: int) -> list[float]:
    out = []
    for i in range(n):
        name = f"bcrash-{i}"
        jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 4}, training={"steps": 10}))
        harness.wait_for("second attempt", lambda n=name: jobs.status(n).get("attempt") == 2,
                         timeout=90)  # fmt: skip
        time.sleep(1.0)
        failed = clock.first(lambda p, ph, n=name: p.startswith(f"{n}-a1-") and ph == "Failed")
        created = clock.first(lambda p, ph, n=name: p.startswith(f"{n}-a2-") and ph == "Added")
        if failed and created:
            out.append(created - failed)
            print(f"crash {i}: failed pod seen -> new pod seen {created - failed:.2f}s")
        jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    return out


def node_loss_trials(jobs: harness.Jobs, op: harness.Operator, n: int) -> list[dict[str, float]]:
    faults = lf.Faults.for_cluster(op.cluster.state_dir)
    out = []
    for i in range(n):
        name = f"bnode-{i}"
        jobs.apply(harness.job_doc(name, training={"steps": 4000}))
        pods = harness.wait_for("pods running", lambda n=name: len(jobs.running_pods(n, 1)) == 2
                                and jobs.running_pods(n, 1), timeout=90)  # fmt: skip
        node = pods[1]["spec"]["nodeName"]
        time.sleep(2.0)
        lost_at = time.time()
        faults.lose_node(node)
        try:
            s = harness.wait_for("NodeLost", lambda n=name: (s := jobs.status(n)).get("attempt")
                                 == 2 and s, timeout=120)  # fmt: skip
            cond = next(c for c in op.cluster.get_json("node", node)["status"]["conditions"]
                        if c["type"] == "Ready")  # fmt: skip
            not_ready = harness_ts(cond["lastTransitionTime"])
            detected = harness_ts(s["history"][0]["ended"])
            row = {"heartbeat_stop_to_detect": detected - lost_at,
                   "not_ready_to_detect": detected - not_ready}  # fmt: skip
            out.append(row)
            print(f"node loss {i}: {row}")
        finally:
            faults.restore_node(node)
            jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
            harness.wait_for("node ready", lambda: op.cluster.ready_nodes() >= 3, timeout=60)
    return out


def harness_ts(value: str) -> float:
    from fsdp_operator import observe

    t = observe.ts(value)
    assert t is not None
    return t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crashes", type=int, default=10)
    parser.add_argument("--node-losses", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        images.build(images.TEST_TARGETS)
        wanted = controlplane.NodeOptions(3, images=images.TEST_IMAGES)
        cluster = controlplane.Cluster.up(Path(tmp) / "cluster", nodes=wanted)
        try:
            cluster.kubectl(
                "apply", "--server-side", "-f", str(harness.ROOT / "crds" / "fsdpjobs.yaml")
            )
            cluster.kubectl("wait", "--for=condition=Established", "crd/fsdpjobs.fsdpoperator.io")
            op = harness.Operator(cluster, harness.install_rbac(cluster), Path(tmp))
            op.start()
            cluster.kubectl("create", "namespace", "bench")
            jobs = harness.Jobs(cluster, "bench")
            jobs.ensure_pvc()
            clock = PodClock(cluster.kubeconfig, "bench")
            crashes = crash_trials(jobs, clock, args.crashes)
            losses = node_loss_trials(jobs, op, args.node_losses)
            clock.stop()
            op.stop()
        finally:
            cluster.down()
    result = {
        "crash_failed_to_new_pod_seconds": {
            "n": len(crashes), "p50": statistics.median(crashes), "p95": _pct(crashes, 0.95),
            "max": max(crashes), "samples": crashes,
        },
        "node_loss": {
            "n": len(losses),
            "nodeLossGraceSeconds": 4,
            "node_monitor_grace_period_seconds": 8,
            "not_ready_to_detect_max": max(r["not_ready_to_detect"] for r in losses),
            "heartbeat_stop_to_detect_max": max(r["heartbeat_stop_to_detect"] for r in losses),
            "samples": losses,
        },
        "machine": "2 cores, 24 GiB, no GPU; local control plane + kubelet nodes (containerd)",
    }  # fmt: skip
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    brief = {k: {kk: vv for kk, vv in v.items() if kk != "samples"} if isinstance(v, dict) else v
             for k, v in result.items()}  # fmt: skip
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
