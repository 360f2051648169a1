"""bench/fleet.py's clock: when each pod and FSDPJob of one namespace was first seen in a state.

Two watches (pods, FSDPJobs), each a list and then a watch from its resourceVersion, read as raw
JSON: decoding thousands of pod events into the kubernetes client's models would cost this
2-core machine more CPU than the operator under test. Every time is this process's wall clock
when the event arrived, so the differences between them are what an observer of the API sees.
Reads the API only; the queries on what was seen never touch it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from fsdp_operator.types import names
from localcluster import kubeclient

JOBS_PATH = "/apis/fsdpoperator.io/v1alpha1/namespaces/{ns}/fsdpjobs"
PODS_PATH = "/api/v1/namespaces/{ns}/pods"


class Watcher:
    """One collection, listed and then watched; ``on_event(type, object, seen_at)`` per change."""

    def __init__(
        self,
        kube: kubeclient.Kube,
        path: str,
        on_event: Callable[[str, dict[str, Any], float], None],
    ) -> None:
        self.kube, self.path, self.on_event = kube, path, on_event
        self.synced = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"watch {path}")
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()  # the thread ends at its next event or watch timeout (daemon)

    def _run(self) -> None:
        version: str | None = None
        while not self._stop.is_set():
            try:
                if version is None:
                    version = self._list()
                version = self._watch(version)
            except kubeclient.KubeError as exc:
                if exc.status == 410:  # too old: list again
                    version = None
                else:
                    time.sleep(1.0)
            except Exception:  # a read timeout on a busy server, a cut stream: list again
                # (an uncaught one ended this thread, froze the clock, and the bench waited out
                # its 30 minutes). States seen again at the re-list keep their first times.
                time.sleep(1.0)
                version = None

    def _list(self) -> str:
        listing = self.kube.get(self.path)
        now = time.time()
        for obj in listing["items"]:
            self.on_event("ADDED", obj, now)
        self.synced.set()
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, version: str) -> str | None:
        for event in self.kube.watch(self.path, resource_version=version, timeout_s=30):
            now, kind, obj = time.time(), event["type"], event["object"]
            if kind == "ERROR":
                return None
            version = obj.get("metadata", {}).get("resourceVersion", version)
            if kind != "BOOKMARK":
                self.on_event(kind, obj, now)
            if self._stop.is_set():
                break
        return version


@dataclasses.dataclass
class Pod:
    job: str
    attempt: int | None
    added: float | None = None
    running: float | None = None
    failed: float | None = None

    def saw(self, kind: str, obj: dict[str, Any], now: float) -> None:
        """The first time it was seen ADDED, Running and Failed."""
        if kind == "ADDED" and self.added is None:
            self.added = now
        phase = (obj.get("status") or {}).get("phase")
        if phase == "Running" and self.running is None:
            self.running = now
        elif phase == "Failed" and self.failed is None:
            self.failed = now


class Clock:
    """What the watches saw in one namespace: pods by name, each job's first Running per attempt."""

    def __init__(self, kube: kubeclient.Kube, namespace: str, *, pods_per_job: int) -> None:
        self.pods_per_job = pods_per_job
        self._lock = threading.Lock()
        self.pods: dict[str, Pod] = {}
        self.running: dict[tuple[str, int], float] = {}
        self.watchers = [
            Watcher(kube, PODS_PATH.format(ns=namespace), self._pod),
            Watcher(kube, JOBS_PATH.format(ns=namespace), self._job),
        ]
        for watcher in self.watchers:
            if not watcher.synced.wait(60):
                raise RuntimeError(f"no list of {watcher.path} within 60 s")

    def stop(self) -> None:
        for watcher in self.watchers:
            watcher.stop()

    def _pod(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        with self._lock:
            job, attempt = labels.get(names.Label.JOB.value, ""), names.parse_attempt(labels)
            self.pods.setdefault(meta["name"], Pod(job=job, attempt=attempt)).saw(kind, obj, now)

    def _job(self, kind: str, obj: dict[str, Any], now: float) -> None:
        status = obj.get("status") or {}
        if status.get("phase") == "Running" and status.get("attempt"):
            with self._lock:
                self.running.setdefault((obj["metadata"]["name"], int(status["attempt"])), now)

    # --- queries (in memory) ------------------------------------------------------------------
    def _attempt(self, job: str, attempt: int) -> list[Pod]:
        with self._lock:
            return [p for p in self.pods.values() if p.job == job and p.attempt == attempt]

    def job_running(self, job: str, attempt: int) -> float | None:
        with self._lock:
            return self.running.get((job, attempt))

    def all_running(self, jobs: list[str]) -> bool:
        return all(self.job_running(j, 1) is not None for j in jobs)

    def last_running(self, jobs: list[str]) -> float:
        return max(self.job_running(j, 1) or 0.0 for j in jobs)

    def last_pod_running(self) -> float:
        with self._lock:
            return max((p.running for p in self.pods.values() if p.running), default=0.0)

    def pods_running(self, job: str, attempt: int) -> float | None:
        """When the last pod of the attempt was first seen Running (None before all were)."""
        times = [p.running for p in self._attempt(job, attempt)]
        if len(times) < self.pods_per_job or None in times:
            return None
        return max(t for t in times if t is not None)

    def job_lags(self, jobs: list[str]) -> list[float]:
        """Per job: its first Running (attempt 1) minus the moment all its pods were Running."""
        lags = []
        for job in jobs:
            pods, running = self.pods_running(job, 1), self.job_running(job, 1)
            if pods is not None and running is not None:
                lags.append(running - pods)
        return lags

    def _failed(self, job: str, attempt: int) -> float | None:
        return min((p.failed for p in self._attempt(job, attempt) if p.failed), default=None)

    def replaced_after(self, job: str, *, attempt: int) -> float | None:
        """A pod of the attempt seen Failed -> every pod of the next attempt seen ADDED."""
        failed = self._failed(job, attempt)
        added = [p.added for p in self._attempt(job, attempt + 1)]
        if failed is None or len(added) < self.pods_per_job or None in added:
            return None
        return max(t for t in added if t is not None) - failed

    def recovered_after(self, job: str, *, attempt: int) -> float | None:
        """A pod of the attempt seen Failed -> the job Running in the next attempt."""
        failed, running = self._failed(job, attempt), self.job_running(job, attempt + 1)
        return None if failed is None or running is None else running - failed

    def summary(self, jobs: list[str]) -> str:
        with self._lock:
            pods = list(self.pods.values())
            running = len({j for j, a in self.running if a == 1})
        up = sum(1 for p in pods if p.running)
        return f"{running}/{len(jobs)} jobs Running; {len(pods)} pods seen, {up} Running"
