"""The operator's own Prometheus metrics: jobs by phase, restarts by cause, detection latency,
recovery duration, steps lost, checkpoint age. Recording only: no decisions, no API calls.
"""

from __future__ import annotations

import contextlib
import threading

import prometheus_client as prom

from fsdp_operator import decide as dc
from fsdp_operator import names
from fsdp_operator import observed as ob
from fsdp_operator import status as st

_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 120, 300, 600)

JOBS = prom.Gauge("fsdpjob_jobs", "FSDPJobs by phase", ["phase"])
FAILURES = prom.Counter("fsdpjob_failures_total", "Failures detected, by cause", ["cause"])
RESTARTS = prom.Counter(
    "fsdpjob_restarts_total", "Attempts started after a failure or a planned stop", ["cause"]
)
DETECT = prom.Histogram(
    "fsdpjob_failure_detection_seconds", "Failure happened -> operator observed it", ["cause"],
    buckets=_BUCKETS,
)  # fmt: skip
RECOVER = prom.Histogram(
    "fsdpjob_recovery_seconds", "Failure observed -> all pods of the next attempt Running",
    buckets=_BUCKETS,
)  # fmt: skip
STEPS_LOST = prom.Counter("fsdpjob_steps_lost_total", "Training steps redone after restarts")
CKPT_AGE = prom.Gauge(
    "fsdpjob_checkpoint_age_seconds", "Age of the newest complete checkpoint", ["namespace", "job"]
)

_lock = threading.Lock()
_phases: dict[tuple[str, str], str] = {}


def record(*, job: names.JobRef, obs: ob.Observed, decision: dc.Decision) -> None:
    s = decision.status
    with _lock:
        _phases[(job.namespace, job.name)] = s.phase.value
        for phase in st.Phase:
            JOBS.labels(phase.value).set(sum(1 for p in _phases.values() if p == phase.value))
    f = decision.failure
    if f is not None:
        FAILURES.labels(f.cause.value).inc()
        DETECT.labels(f.cause.value).observe(max(0.0, obs.now - f.time))
    if decision.launch is not None and decision.launch.attempt > 1:
        cause = s.history[-2].cause if len(s.history) > 1 else None
        RESTARTS.labels(cause.value if cause else "Unknown").inc()
        if len(s.history) > 1 and s.history[-2].steps_lost:
            STEPS_LOST.inc(s.history[-2].steps_lost or 0)
    if decision.recovered is not None and decision.recovered.recover_seconds is not None:
        RECOVER.observe(decision.recovered.recover_seconds)
    ck = s.last_checkpoint
    if ck is not None and ck.time is not None:
        CKPT_AGE.labels(job.namespace, job.name).set(max(0.0, obs.now - ck.time))


def forget(namespace: str, name: str) -> None:
    with _lock:
        _phases.pop((namespace, name), None)
    with contextlib.suppress(KeyError):
        CKPT_AGE.remove(namespace, name)
