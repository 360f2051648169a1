"""The operator's own Prometheus metrics: jobs by phase, restarts by cause, detection latency,
recovery duration, time to resume by phase, steps lost, goodput and lost time by cause,
checkpoint age and interval. Recording only: no decisions, no API calls.
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
RESUME_PHASE = prom.Histogram(
    "fsdpjob_time_to_resume_phase_seconds",
    "Per restart: seconds of each phase from the failure to the first step after resuming "
    "(detect, teardown, schedule, start, rendezvous, load, firstStep)", ["phase"],
    buckets=_BUCKETS,
)  # fmt: skip
RESUME = prom.Histogram(
    "fsdpjob_time_to_resume_seconds", "Failure -> first step of the next attempt", ["cause"],
    buckets=_BUCKETS,
)  # fmt: skip
GOODPUT = prom.Gauge(
    "fsdpjob_goodput_ratio", "Share of wall time on steps that count", ["namespace", "job"]
)
LOST = prom.Gauge(
    "fsdpjob_lost_seconds", "Wall time that did not advance training, by cause",
    ["namespace", "job", "cause"],
)  # fmt: skip
CHECKPOINT_INTERVAL = prom.Gauge(
    "fsdpjob_checkpoint_interval_steps", "Steps between checkpoints the workers use now",
    ["namespace", "job"],
)  # fmt: skip
CKPT_AGE = prom.Gauge(
    "fsdpjob_checkpoint_age_seconds", "Age of the newest complete checkpoint", ["namespace", "job"]
)

PASSES = prom.Counter("fsdpjob_reconcile_passes_total", "Reconcile passes run (all jobs)")
API_REQUESTS = prom.Counter(
    "fsdpjob_operator_api_requests_total",
    "Requests the operator's passes sent to the API server (kopf's watches not included)",
    ["verb", "resource"],
)
FENCED = prom.Counter(
    "fsdpjob_operator_writes_fenced_total",
    "Writes refused before sending because this replica was not (or no longer) the leader",
)
LEADER = prom.Gauge("fsdpjob_operator_leader", "1 while this replica holds the leader Lease")
SCRAPES = prom.Counter(
    "fsdpjob_operator_scrapes_total", "Scrapes of rank 0's metrics endpoint", ["result"]
)

for _phase in st.Phase:
    JOBS.labels(_phase.value).set(0)

_lock = threading.Lock()
_phases: dict[tuple[str, str], str] = {}
_phase_counts: dict[str, int] = {}
_causes: dict[tuple[str, str], set[str]] = {}  # LOST series per job, removed with the job


def record(*, job: names.JobRef, obs: ob.Observed, decision: dc.Decision) -> None:
    s = decision.status
    _count_phase((job.namespace, job.name), s.phase.value)
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
    _record_cost(job, decision)


def _record_cost(job: names.JobRef, decision: dc.Decision) -> None:
    """Time to resume (once per restart), goodput and lost time, checkpoint interval."""
    s = decision.status
    resumed = decision.resumed
    tl = resumed.timeline if resumed is not None else None
    if tl is not None and tl.failed is not None:  # a restart, not the job's first start
        for phase, seconds in st.breakdown(tl):
            if seconds is not None:
                RESUME_PHASE.labels(phase).observe(seconds)
        total = st.time_to_resume(tl)
        if total is not None:
            RESUME.labels(tl.cause.value if tl.cause else "Unknown").observe(total)
    g = s.goodput
    if g is not None:
        GOODPUT.labels(job.namespace, job.name).set(g.fraction)
        with _lock:
            known = _causes.setdefault((job.namespace, job.name), set())
            known.update(g.lost_seconds)
        for cause in known:
            LOST.labels(job.namespace, job.name, cause).set(g.lost_seconds.get(cause, 0.0))
    if s.checkpoint_interval is not None:
        CHECKPOINT_INTERVAL.labels(job.namespace, job.name).set(s.checkpoint_interval.steps)


def _count_phase(key: tuple[str, str], phase: str | None) -> None:
    """Jobs by phase, kept as counts (a pass costs the same with 10 jobs or 10,000)."""
    with _lock:
        old = _phases.pop(key, None)
        if phase is not None:
            _phases[key] = phase
        if old == phase:
            return
        for value, delta in ((old, -1), (phase, 1)):
            if value is not None:
                _phase_counts[value] = _phase_counts.get(value, 0) + delta
                JOBS.labels(value).set(_phase_counts[value])


def forget(namespace: str, name: str) -> None:
    _count_phase((namespace, name), None)
    with _lock:
        causes = _causes.pop((namespace, name), set())
    for gauge in (CKPT_AGE, GOODPUT, CHECKPOINT_INTERVAL):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for cause in causes:
        with contextlib.suppress(KeyError):
            LOST.remove(namespace, name, cause)
