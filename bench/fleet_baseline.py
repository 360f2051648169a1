"""bench/fleet.py's baseline: the control plane's own controller doing the same work.

The operator's fleet figures are as fast as this machine's API server, scheduler and kwok let
them be; a slower machine would read as a slower operator. So each size also runs the nearest
thing Kubernetes does by itself, in the same cluster and the same run: plain ReplicaSets with
the same pods (replicas = the FSDPJob's pods, the same GPU request, node selector and
toleration), brought up, and one pod of distinct random ReplicaSets failed by kwok's chaos stage
exactly as bench/fleet.py fails rank 0. The ReplicaSet controller then creates one replacement
pod; the operator tears the whole attempt down and creates every pod of the next one, so a ratio
near 1 means the operator adds little to what the control plane costs anyway. (Not batch/v1
Jobs: kwok completes a Job's pods at once, as a finished container would.)

Measured from one pod watch (fleet_clock.Watcher), this process's clock:
- apply -> every pod Running (`base_apply_to_all_pods_running_s`);
- the failed pod seen Failed -> its replacement seen ADDED, p50/p95 (`base_replace_p50_s`, ...).
"""

from __future__ import annotations

import dataclasses
import random
import threading
import time
from typing import Any

from bench import fleet_clock
from bench.fleet_clock import Pod
from localcluster import images, kubeclient, kwok, nodes, poll

JOB_LABEL = "fsdp.bench/baseline"
JOBS_PATH = "/apis/apps/v1/namespaces/{ns}/replicasets"


def job_doc(name: str, *, pods: int, gpus_per_pod: int) -> dict[str, Any]:
    """A ReplicaSet with the pods of bench/fleet.py's FSDPJob; a failed pod is replaced."""
    container = {
        "name": "worker",
        "image": images.WORKER,
        "resources": {"limits": {nodes.GPU_RESOURCE: str(gpus_per_pod)}},
    }
    labels = {JOB_LABEL: name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": pods,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": kwok.NODE_SELECTOR,
                    "tolerations": [kwok.toleration()],
                    "containers": [container],
                },
            },
        },
    }


class PodClock:
    """When each pod of the namespace was first seen ADDED, Running and Failed."""

    def __init__(self, kube: kubeclient.Kube, namespace: str) -> None:
        self._lock = threading.Lock()
        self.pods: dict[str, Pod] = {}
        path = fleet_clock.PODS_PATH.format(ns=namespace)
        self.watcher = fleet_clock.Watcher(kube, path, self._pod)
        if not self.watcher.synced.wait(60):
            raise RuntimeError(f"no list of {path} within 60 s")

    def _pod(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        with self._lock:
            job = (meta.get("labels") or {}).get(JOB_LABEL, "")
            self.pods.setdefault(meta["name"], Pod(job, None)).saw(kind, obj, now)

    def first_of(self, job: str) -> str:
        """The name of one of the job's pods (the one to fail)."""
        with self._lock:
            return min(name for name, p in self.pods.items() if p.job == job)

    def running(self) -> list[float]:
        with self._lock:
            return [p.running for p in self.pods.values() if p.running is not None]

    def of(self, job: str) -> list[Pod]:
        with self._lock:
            return [dataclasses.replace(p) for p in self.pods.values() if p.job == job]

    def replaced_after(self, job: str) -> float | None:
        """The job's first pod seen Failed -> a pod created after it seen ADDED."""
        pods = self.of(job)
        failed = min((p.failed for p in pods if p.failed is not None), default=None)
        if failed is None:
            return None
        later = [p.added for p in pods if p.added is not None and p.added > failed]
        return min(later) - failed if later else None


def measure(
    fleet: kwok.Fleet,
    *,
    jobs: int,
    pods_per_job: int,
    gpus_per_pod: int,
    failures: int,
    spacing: float,
    seed: int,
    wait_seconds: float,
) -> dict[str, Any]:
    """One size's baseline in its own namespace, deleted afterwards."""
    cluster, kube = fleet.cluster, kubeclient.Kube(fleet.cluster.kubeconfig)
    ns = f"base-{jobs}"
    cluster.kubectl("create", "namespace", ns)
    clock = PodClock(kube, ns)
    names = [f"base-{i:05d}" for i in range(jobs)]
    try:
        row = _bring_up(kube, clock, ns, names, pods_per_job, gpus_per_pod, wait_seconds)
        victims = random.Random(seed).sample(names, min(failures, jobs))
        return row | _failures(
            fleet, clock, ns, victims, spacing=spacing, wait_seconds=wait_seconds
        )
    finally:
        clock.watcher.stop()
        cluster.kubectl("delete", "namespace", ns, "--timeout=300s", check=False, timeout=330)


def _bring_up(
    kube: kubeclient.Kube,
    clock: PodClock,
    ns: str,
    names: list[str],
    pods_per_job: int,
    gpus_per_pod: int,
    wait_seconds: float,
) -> dict[str, Any]:
    from bench.fleet import _pool  # the operator's jobs are created by the same 8 threads

    applied = time.time()
    path = JOBS_PATH.format(ns=ns)
    docs = [job_doc(n, pods=pods_per_job, gpus_per_pod=gpus_per_pod) for n in names]
    with _pool() as pool:
        list(pool.map(lambda doc: kube.request("POST", path, body=doc), docs))
    want = len(names) * pods_per_job
    poll.until(
        f"{want} baseline pods Running",
        lambda: len(clock.running()) >= want,
        timeout=wait_seconds,
        every=0.5,
        diagnosis=lambda: f"{len(clock.running())} of {want} Running",
    )
    return {"base_apply_to_all_pods_running_s": max(clock.running()) - applied}


def _failures(
    fleet: kwok.Fleet,
    clock: PodClock,
    ns: str,
    victims: list[str],
    *,
    spacing: float,
    wait_seconds: float,
) -> dict[str, Any]:
    for job in victims:
        fleet.fail_pod(ns, clock.first_of(job), exit_code=1)
        time.sleep(spacing)
    poll.until(
        "baseline replacement pods",
        lambda: all(clock.replaced_after(j) is not None for j in victims),
        timeout=wait_seconds,
        every=0.5,
    )
    got = sorted(t for j in victims if (t := clock.replaced_after(j)) is not None)
    return {
        "base_failures": len(victims),
        "base_replace_p50_s": got[round(0.5 * (len(got) - 1))],
        "base_replace_p95_s": got[round(0.95 * (len(got) - 1))],
    }


def ratios(row: dict[str, Any]) -> dict[str, float | None]:
    """The operator's figures over the baseline's, measured in the same run."""

    def over(mine: str, base: str) -> float | None:
        a, b = row.get(mine), row.get(base)
        return (
            round(a / b, 2)
            if isinstance(a, float | int) and isinstance(b, float | int) and b > 0
            else None
        )

    return {
        "ratio_all_running": over("apply_to_all_running_s", "base_apply_to_all_pods_running_s"),
        "ratio_replace_p50": over("replace_p50_s", "base_replace_p50_s"),
        "ratio_replace_p95": over("replace_p95_s", "base_replace_p95_s"),
    }
