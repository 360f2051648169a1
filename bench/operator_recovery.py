"""Benchmark: how fast the operator turns a failure into a replacement attempt.

Starts its own local cluster (real control plane, kubelet nodes) and the operator with the
chart's RBAC, runs stand-in jobs under real torchrun, and measures with one watcher clock:

- crash: the failed pod's Failed phase seen on the API -> the first pod of the next attempt
  seen on the API (goal p50 <= 2 s, p95 <= 5 s);
- node loss: the node turning NotReady (its condition's transition time) and the moment the
  heartbeat stopped -> the operator recording NodeLost (goal: nodeLossGraceSeconds + 5 s).

Prints a table and writes bench/results/operator_recovery.json. Numbers, not assertions.

`--production-defaults` is a run of its own, with the control plane as Kubernetes ships it
(node-monitor-grace-period 50 s, kubelet Leases of 40 s renewed every 10 s) and jobs at the
default nodeLossGraceSeconds (30 s): heartbeats stop (the kubelet is stopped) -> NodeLost and
-> the next attempt's first step, with the operator judging nodes by their Leases (the chart's
default, 2 missed renewals) and, on the same cluster, by NotReady alone (0); then the API
server stalls for longer than a Lease (45 s) while every node is healthy, and the jobs running
then count the nodes the operator declared lost. Writes bench/results/node_loss_production.json.

`--in-place N`: N crashes with the gang recreated against N restarted in place
(failurePolicy.inPlaceRestarts), interleaved on the same draws, from the rank's failure to the
next first step. Writes bench/results/in_place.json.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes

from fsdp_operator.types import names
from harness import stack
from localcluster import components, controlplane, images, nodeconf, poll
from localcluster import faults as lf
from tests.integration import harness

OUT = Path(__file__).resolve().parent / "results" / "operator_recovery.json"
OUT_PRODUCTION = OUT.parent / "node_loss_production.json"
OUT_IN_PLACE = OUT.parent / "in_place.json"
LEASE_ENV = "FSDPOP_NODE_LEASE_MISSED_RENEWALS"


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


def _status_where(jobs: stack.Jobs, name: str, key: str, value: object) -> dict[str, Any] | None:
    """The job's status once its `key` reads `value`."""
    s = jobs.status(name)
    return s if s.get(key) == value else None


def _stepped(jobs: stack.Jobs, name: str, steps: int) -> bool:
    return int(jobs.status(name).get("step") or 0) >= steps


def _running(jobs: stack.Jobs, name: str, count: int) -> list[dict[str, Any]] | None:
    """Attempt 1's pods once `count` of them run."""
    pods = jobs.running_pods(name, 1)
    return pods if len(pods) == count else None


def _trains_again(jobs: stack.Jobs, name: str) -> list[dict[str, Any]] | None:
    """The job's history up to the first attempt after attempt 1 that made a step (a lost
    node judged by NotReady alone is often caught as a Hang first, and the attempt after it
    may land on the lost node again: the chain of attempts is what it cost)."""
    history = jobs.status(name).get("history", [])
    for i, h in enumerate(history):
        if h["attempt"] > 1 and (h.get("timeline") or {}).get("firstStep"):
            return [dict(e) for e in history[: i + 1]]
    return None


def _loss_row(history: list[dict[str, Any]], stopped: float) -> dict[str, float]:
    """Heartbeats stop -> the first verdict, -> NodeLost (when one came), -> the first step
    of the attempt that trained again, and how many attempts that took."""
    after = history[1:]
    first = harness_ts(after[0]["timeline"]["detected"])
    trained = harness_ts(after[-1]["timeline"]["firstStep"])
    lost = [
        harness_ts(h["timeline"]["detected"])
        for h in after
        if h["timeline"].get("cause") == "NodeLost"
    ]
    row = {
        "heartbeat_stop_to_first_verdict": first - stopped,
        "heartbeat_stop_to_first_step": trained - stopped,
        "first_verdict_to_first_step": trained - first,
        "attempts_to_train_again": float(len(after)),
    }
    if lost:
        row["heartbeat_stop_to_node_lost"] = lost[0] - stopped
    return row


def crash_trials(jobs: stack.Jobs, clock: PodClock, n: int) -> list[float]:
    out = []
    for i in range(n):
        name = f"bcrash-{i}"
        jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 4}, training={"steps": 10}))
        poll.until(
            "second attempt",
            functools.partial(_status_where, jobs, name, "attempt", 2),
            timeout=90,
            diagnosis=functools.partial(jobs.diagnosis, name),
        )
        time.sleep(1.0)
        failed = clock.first(lambda p, ph, n=name: p.startswith(f"{n}-a1-") and ph == "Failed")
        created = clock.first(lambda p, ph, n=name: p.startswith(f"{n}-a2-") and ph == "Added")
        if failed and created:
            out.append(created - failed)
            print(f"crash {i}: failed pod seen -> new pod seen {created - failed:.2f}s")
        jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    return out


def node_loss_trials(jobs: stack.Jobs, op: stack.Operator, n: int) -> list[dict[str, float]]:
    faults = lf.Faults.for_cluster(op.cluster.state_dir)
    out = []
    for i in range(n):
        name = f"bnode-{i}"
        jobs.apply(harness.job_doc(name, training={"steps": 4000}))
        pods = poll.until(
            "pods running",
            functools.partial(_running, jobs, name, 2),
            timeout=90,
            diagnosis=functools.partial(jobs.diagnosis, name),
        )
        node = pods[1]["spec"]["nodeName"]
        time.sleep(2.0)
        lost_at = time.time()
        faults.lose_node(node, freeze=names.Label.JOB.value)
        try:
            s = poll.until(
                "NodeLost",
                functools.partial(_status_where, jobs, name, "attempt", 2),
                timeout=120,
                diagnosis=functools.partial(jobs.diagnosis, name),
            )
            cond = next(
                c
                for c in op.cluster.get_json("node", node)["status"]["conditions"]
                if c["type"] == "Ready"
            )
            not_ready = harness_ts(cond["lastTransitionTime"])
            detected = harness_ts(s["history"][0]["ended"])
            row = {
                "heartbeat_stop_to_detect": detected - lost_at,
                "not_ready_to_detect": detected - not_ready,
            }
            out.append(row)
            print(f"node loss {i}: {row}")
        finally:
            faults.restore_node(node)
            jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
            poll.until("node ready", lambda: op.cluster.ready_nodes() >= 3, timeout=60)
    return out


def production_node_loss(
    jobs: stack.Jobs, op: stack.Operator, n: int, missed: int
) -> list[dict[str, float]]:
    """Heartbeats stop -> NodeLost -> first step, with the operator at `missed` renewals."""
    op.stop()
    os.environ[LEASE_ENV] = str(missed)
    op.start()
    if missed:  # a fresh operator judges Leases from the first renewal it sees flow
        poll.until(
            "the operator judging node Leases",
            lambda: _metric(op, "fsdpjob_operator_node_leases_healthy") == 1.0,
            timeout=60,
        )
    faults = lf.Faults.for_cluster(op.cluster.state_dir)
    out = []
    for i in range(n):
        name = f"prod-{missed}-{i}"
        doc = harness.job_doc(name, training={"steps": 100_000})
        doc["spec"]["failurePolicy"]["nodeLossGraceSeconds"] = 30  # the API's default
        jobs.apply(doc)
        pods = poll.until(
            "pods running",
            functools.partial(_running, jobs, name, 2),
            timeout=120,
            diagnosis=functools.partial(jobs.diagnosis, name),
        )
        poll.until(
            "a step",
            functools.partial(_stepped, jobs, name, 5),
            diagnosis=functools.partial(jobs.diagnosis, name),
        )
        node = pods[1]["spec"]["nodeName"]
        stopped = time.time()
        faults.lose_node(node, freeze=names.Label.JOB.value)
        try:
            history = poll.until(
                "the first step of an attempt after the loss",
                functools.partial(_trains_again, jobs, name),
                timeout=240,
                every=1.0,
                diagnosis=functools.partial(jobs.diagnosis, name),
            )
            row = _loss_row(history, stopped)
            causes = " -> ".join(str(h["failure"]["cause"]) for h in history if h.get("failure"))
            message = history[0]["failure"]["message"]
            print(f"missed={missed} node loss {i}: {row} ({causes}; {message})")
            out.append(row)
        finally:
            faults.restore_node(node)
            jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
            poll.until("node ready", lambda: op.cluster.ready_nodes() >= 3, timeout=120)
    return out


def _metric(op: stack.Operator, name: str) -> float | None:
    try:
        with urllib.request.urlopen(op.metrics_url(), timeout=2) as resp:
            page = resp.read().decode()
    except OSError:
        return None
    found = [line.split()[-1] for line in page.splitlines() if line.startswith(name + " ")]
    return float(found[0]) if found else None


def api_server_stall(jobs: stack.Jobs, op: stack.Operator, seconds: float) -> dict[str, Any]:
    """Two jobs train on healthy nodes while the API server answers nothing for `seconds`."""
    names = ["stall-0", "stall-1"]
    for name in names:
        jobs.apply(harness.job_doc(name, training={"steps": 100_000}))
    for name in names:
        poll.until(
            "a step",
            functools.partial(_stepped, jobs, name, 5),
            timeout=120,
            diagnosis=functools.partial(jobs.diagnosis, name),
        )
    lf.Faults.for_cluster(op.cluster.state_dir).stall_apiserver(seconds)
    time.sleep(60.0)  # two Lease periods and more, for anything to be declared
    statuses = [jobs.status(name) for name in names]
    for name in names:
        jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    return {
        "stall_seconds": seconds,
        "jobs": len(names),
        "node_lost_declared": sum(
            1 for s in statuses for h in s.get("history", []) if h.get("cause") == "NodeLost"
        ),
        "restarts": sum(s.get("restarts", {}).get("total", 0) for s in statuses),
        "failures": [  # what a restart, if any, was for
            h["failure"]["message"]
            for s in statuses
            for h in s.get("history", [])
            if h.get("failure")
        ],
        "ready_nodes_after": op.cluster.ready_nodes(),
    }


@contextlib.contextmanager
def _stack() -> Iterator[tuple[stack.Operator, stack.Jobs]]:
    """A cluster of three kubelet nodes, the CRD, the operator with the chart's RBAC and a
    namespace `bench` with its claim; all gone afterwards."""
    with tempfile.TemporaryDirectory() as tmp:
        images.build(images.TEST_TARGETS)
        wanted = controlplane.NodeOptions(3, images=images.TEST_IMAGES)
        cluster = controlplane.Cluster.up(Path(tmp) / "cluster", nodes=wanted)
        try:
            stack.install_crd(cluster)
            op = stack.Operator(cluster, stack.install_rbac(cluster), Path(tmp))
            op.start()
            cluster.kubectl("create", "namespace", "bench")
            jobs = stack.Jobs(cluster, "bench")
            jobs.ensure_pvc()
            try:
                yield op, jobs
            finally:
                op.stop()
        finally:
            cluster.down()


def production(args: argparse.Namespace) -> None:
    components.NODE_MONITOR_GRACE = "50s"  # Kubernetes' default since 1.32
    nodeconf.NODE_LEASE_SECONDS = 40  # the kubelet's default: renewed every 10 s
    with _stack() as (op, jobs):
        by_lease = production_node_loss(jobs, op, args.node_losses, missed=2)
        not_ready = production_node_loss(jobs, op, args.node_losses, missed=0)
        op.stop()
        os.environ[LEASE_ENV] = "2"
        op.start()
        stall = api_server_stall(jobs, op, args.stall_seconds)

    def summary(rows: list[dict[str, float]]) -> dict[str, Any]:
        keys = sorted({k for r in rows for k in r})
        return {
            "n": len(rows),
            **{
                k: {"p50": statistics.median(v), "max": max(v), "n": len(v)}
                for k in keys
                if (v := [r[k] for r in rows if k in r])
            },
            "samples": rows,
        }

    result = {
        "control_plane": {
            "node_monitor_grace_period_seconds": 50,
            "kubelet_lease_seconds": 40,
            "kubelet_renew_seconds": 10,
            "job_nodeLossGraceSeconds": 30,
        },
        "lease_missed_renewals_2": summary(by_lease),
        "not_ready_only": summary(not_ready),
        "api_server_stall": stall,
        "machine": "2 cores, 24 GiB, no GPU; local control plane + kubelet nodes (containerd)",
    }
    OUT_PRODUCTION.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items()}, indent=1))


def restart_trials(jobs: stack.Jobs, n: int) -> dict[str, list[dict[str, float]]]:
    """Crash -> the next first step, gang recreated (inPlaceRestarts 0) against restarted in
    place (2), interleaved on the same fault draws: trial i crashes rank i % 2 at step 12."""
    rows: dict[str, list[dict[str, float]]] = {"recreated": [], "in_place": []}
    for i in range(n):
        for mode, restarts in (("recreated", 0), ("in_place", 2)):
            name = f"b{mode.replace('_', '')}-{i}"
            env = {"STANDIN_FAIL_AT_STEP": 12, "STANDIN_FAIL_RANK": i % 2}
            jobs.apply(harness.job_doc(name, env=env, failurePolicy={"inPlaceRestarts": restarts}))
            done = poll.until(
                "Succeeded",
                functools.partial(_status_where, jobs, name, "phase", "Succeeded"),
                timeout=150,
                every=0.5,
                diagnosis=functools.partial(jobs.diagnosis, name),
            )
            if restarts:
                (r,) = done["history"][0]["restartsInPlace"]
                failed, back = harness_ts(r["failure"]["time"]), harness_ts(r["resumed"])
                row = {"failure_to_first_step": back - failed}
            else:
                tl = done["history"][1]["timeline"]
                failed, back = harness_ts(tl["failed"]), harness_ts(tl["firstStep"])
                seen, launched = harness_ts(tl["detected"]), harness_ts(tl["launched"])
                row = {
                    "failure_to_first_step": back - failed,
                    "failure_to_detected": seen - failed,
                    "detected_to_launched": launched - seen,
                    "launched_to_first_step": back - launched,
                }
            rows[mode].append(row)
            print(f"{mode} {i}: {row}")
            jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    return rows


def in_place(args: argparse.Namespace) -> None:
    with _stack() as (_, jobs):
        rows = restart_trials(jobs, args.in_place)
    result: dict[str, Any] = {
        mode: {
            "n": len(found),
            **{
                k: {"p50": statistics.median(r[k] for r in found), "max": max(r[k] for r in found)}
                for k in found[0]
            },
            "samples": found,
        }
        for mode, found in rows.items()
    }
    result["what"] = (
        "stand-in jobs (2 pods x 1 rank, 0.2 s steps) on kubelet nodes; rank i % 2 crashes at "
        "step 12; seconds from the rank's failure to the first step after it"
    )
    result["machine"] = "2 cores, 24 GiB, no GPU; local control plane + kubelet nodes"
    OUT_IN_PLACE.write_text(json.dumps(result, indent=1))
    print(
        json.dumps(
            {
                k: {kk: vv for kk, vv in v.items() if kk != "samples"} if isinstance(v, dict) else v
                for k, v in result.items()
            },
            indent=1,
        )
    )


def harness_ts(value: str) -> float:
    from fsdp_operator.io import observe

    t = observe.ts(value)
    assert t is not None
    return t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--crashes", type=int, default=10)
    parser.add_argument("--node-losses", type=int, default=3)
    parser.add_argument("--production-defaults", action="store_true")
    parser.add_argument("--stall-seconds", type=float, default=45.0)
    parser.add_argument("--in-place", type=int, default=0, help="trials of each restart mode")
    args = parser.parse_args()
    if args.in_place:
        in_place(args)
        return
    if args.production_defaults:
        production(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        images.build(images.TEST_TARGETS)
        wanted = controlplane.NodeOptions(3, images=images.TEST_IMAGES)
        cluster = controlplane.Cluster.up(Path(tmp) / "cluster", nodes=wanted)
        try:
            cluster.kubectl(
                "apply", "--server-side", "-f", str(harness.ROOT / "crds" / "fsdpjobs.yaml")
            )
            cluster.kubectl("wait", "--for=condition=Established", "crd/fsdpjobs.fsdpoperator.io")
            op = stack.Operator(cluster, stack.install_rbac(cluster), Path(tmp))
            op.start()
            cluster.kubectl("create", "namespace", "bench")
            jobs = stack.Jobs(cluster, "bench")
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
            "n": len(crashes),
            "p50": statistics.median(crashes),
            "p95": _pct(crashes, 0.95),
            "max": max(crashes),
            "samples": crashes,
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
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=1))
    brief = {
        k: {kk: vv for kk, vv in v.items() if kk != "samples"} if isinstance(v, dict) else v
        for k, v in result.items()
    }
    print(json.dumps(brief, indent=1))


if __name__ == "__main__":
    main()
