"""The operator's own Prometheus metrics: jobs by phase, restarts by cause, detection latency,
recovery duration, time to resume by phase, steps lost, goodput and lost time by cause,
checkpoint age and interval. The series and their bookkeeping only: what a pass's decision
means for them is recording.py's; no decisions, no API calls here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping

import prometheus_client as prom

from fsdp_operator.types import status

# To hours: a restart that waits for quota (Kueue) or for a node to come back takes that long,
# and a histogram that stops at 600 s says only "more than 10 minutes" (issue 47).
_BUCKETS = (0.25, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 120, 300, 600, 1800, 3600, 7200, 14400)

JOBS = prom.Gauge("fsdpjob_jobs", "FSDPJobs by phase", ["phase"])
FAILURES = prom.Counter("fsdpjob_failures_total", "Failures detected, by cause", ["cause"])
RESTARTS = prom.Counter(
    "fsdpjob_restarts_total", "Attempts started after a failure or a planned stop", ["cause"]
)
RESTARTS_IN_PLACE = prom.Counter(
    "fsdpjob_restarts_in_place_total",
    "Rank failures restarted inside the running pods (failurePolicy.inPlaceRestarts)",
    ["cause"],
)
DETECT = prom.Histogram(
    "fsdpjob_failure_detection_seconds",
    "Failure happened -> operator observed it",
    ["cause"],
    buckets=_BUCKETS,
)
RECOVER = prom.Histogram(
    "fsdpjob_recovery_seconds",
    "Failure observed -> all pods of the next attempt Running",
    buckets=_BUCKETS,
)
EVIDENCE = prom.Histogram(
    "fsdpjob_evidence_seconds",
    "Per failure: reading the attempt's log tails and keeping its evidence, before teardown",
    buckets=_BUCKETS,
)
STEPS_LOST = prom.Counter("fsdpjob_steps_lost_total", "Training steps redone after restarts")
RESUME_PHASE = prom.Histogram(
    "fsdpjob_time_to_resume_phase_seconds",
    "Per restart: seconds of each phase from the failure to the first step after resuming "
    "(detect, teardown, schedule, start, rendezvous, load, firstStep)",
    ["phase"],
    buckets=_BUCKETS,
)
RESUME = prom.Histogram(
    "fsdpjob_time_to_resume_seconds",
    "Failure -> first step of the next attempt",
    ["cause"],
    buckets=_BUCKETS,
)
# Per-job series are labelled job_namespace and job_name: `namespace` and `job` are the labels
# Prometheus gives every scraped target, and would turn ours into exported_namespace/_job.
JOB = ["job_namespace", "job_name"]
GOODPUT = prom.Gauge("fsdpjob_goodput_ratio", "Share of wall time on steps that count", JOB)
# Totals, not counters: productive seconds fall back when a failure turns steps into steps redone.
# The low-goodput alert takes delta() of both over a window, so a collapse shows within hours.
PRODUCTIVE = prom.Gauge(
    "fsdpjob_goodput_productive_seconds", "Wall time on steps that count, since first launch", JOB
)
WALL = prom.Gauge("fsdpjob_goodput_wall_seconds", "Wall time since the first launch", JOB)
LOST = prom.Gauge(
    "fsdpjob_lost_seconds", "Wall time that did not advance training, by cause", [*JOB, "cause"]
)
CHECKPOINT_INTERVAL = prom.Gauge(
    "fsdpjob_checkpoint_interval_steps", "Steps between checkpoints the workers use now", JOB
)
SLOW_RANK_SLOWDOWN = prom.Gauge(
    "fsdpjob_slow_rank_slowdown",
    "The rank rank 0 names slow: its compute per step over the other ranks' median (absent: none)",
    JOB,
)
CKPT_AGE = prom.Gauge(
    "fsdpjob_checkpoint_age_seconds",
    "Age of the newest complete checkpoint at the job's last pass (see the timestamp)",
    JOB,
)
CKPT_TIME = prom.Gauge(
    "fsdpjob_checkpoint_timestamp_seconds",
    "When the newest complete checkpoint was sealed (unix seconds): alert on time() minus it, "
    "which keeps growing when passes stop",
    JOB,
)
JOB_PHASE = prom.Gauge(
    "fsdpjob_job_phase",
    "1 for each job's current phase (one series per job): joins per-job alerts to running jobs",
    [*JOB, "phase"],
)
JOB_FAILURES = prom.Counter(
    "fsdpjob_job_failures_total", "Failures detected, per job and cause", [*JOB, "cause"]
)
RECONCILE_ERRORS = prom.Counter(
    "fsdpjob_reconcile_errors_total",
    "Reconcile passes that failed (the job's ReconcileError condition says why)",
    ["reason"],
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
NODES_LEASE_LOST = prom.Gauge(
    "fsdpjob_operator_nodes_lease_lost", "Nodes whose kubelet stopped renewing their Lease"
)
NODE_LEASES_HEALTHY = prom.Gauge(
    "fsdpjob_operator_node_leases_healthy",
    "1 while the watch of node Leases is open and renewals flow (else no node is lost by Lease)",
)
SCRAPES = prom.Counter(
    "fsdpjob_operator_scrapes_total", "Scrapes of rank 0's metrics endpoint", ["result"]
)

for _phase in status.Phase:
    JOBS.labels(_phase.value).set(0)

_lock = threading.Lock()
_phases: dict[tuple[str, str], str] = {}
_phase_counts: dict[str, int] = {}
_causes: dict[tuple[str, str], set[str]] = {}  # LOST series per job, removed with the job
_failed: dict[tuple[str, str], set[str]] = {}  # JOB_FAILURES series per job, the same


def count_phase(namespace: str, name: str, phase: str | None) -> None:
    """Jobs by phase, kept as counts (a pass costs the same with 10 jobs or 10,000); None: the
    job is no longer counted."""
    key = (namespace, name)
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
        if old is not None:
            with contextlib.suppress(KeyError):
                JOB_PHASE.remove(namespace, name, old)
        if phase is not None:
            JOB_PHASE.labels(namespace, name, phase).set(1)


def set_lost(namespace: str, name: str, lost_seconds: Mapping[str, float]) -> None:
    """Lost time by cause; a cause seen once stays in the series (at 0) until forget()."""
    with _lock:
        known = _causes.setdefault((namespace, name), set())
        known.update(lost_seconds)
        causes = sorted(known)
    for cause in causes:
        LOST.labels(namespace, name, cause).set(lost_seconds.get(cause, 0.0))


QUEUE_WAIT = prom.Gauge(
    "fsdpjob_queue_wait_seconds",
    "How long the current attempt waited, or has waited so far, for Kueue to admit its pods "
    "(0: the job names no queue)",
    JOB,
)


def set_slow_rank(namespace: str, name: str, slowdown: float | None) -> None:
    """The named slow rank's slowdown; the series goes when none is named (None)."""
    if slowdown is not None:
        SLOW_RANK_SLOWDOWN.labels(namespace, name).set(slowdown)
        return
    with contextlib.suppress(KeyError):
        SLOW_RANK_SLOWDOWN.remove(namespace, name)


def count_failure(namespace: str, name: str, cause: str) -> None:
    """One more failure of this job: which job is in a restart storm can be asked."""
    with _lock:
        _failed.setdefault((namespace, name), set()).add(cause)
    JOB_FAILURES.labels(namespace, name, cause).inc()


def forget(namespace: str, name: str) -> None:
    count_phase(namespace, name, None)
    with _lock:
        causes = _causes.pop((namespace, name), set())
        failed = _failed.pop((namespace, name), set())
    gauges = (CKPT_AGE, CKPT_TIME, GOODPUT, PRODUCTIVE, WALL, CHECKPOINT_INTERVAL, QUEUE_WAIT)
    for gauge in (*gauges, SLOW_RANK_SLOWDOWN):
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, name)
    for series, seen in ((LOST, causes), (JOB_FAILURES, failed)):
        for cause in seen:
            with contextlib.suppress(KeyError):
                series.remove(namespace, name, cause)


def serve(port: int, *, certfile: str = "", keyfile: str = "", client_cafile: str = "") -> None:
    """The metrics endpoint on `port`: plain HTTP, or TLS (mutual TLS with a client CA)."""
    if bool(certfile) != bool(keyfile):
        raise ValueError(
            "FSDPOP_METRICS_CERT_FILE and FSDPOP_METRICS_KEY_FILE: set both (TLS) or neither"
        )
    if client_cafile and not certfile:
        raise ValueError("FSDPOP_METRICS_CLIENT_CA_FILE needs FSDPOP_METRICS_CERT_FILE/KEY_FILE")
    prom.start_http_server(
        port,
        certfile=certfile or None,
        keyfile=keyfile or None,
        client_cafile=client_cafile or None,
        client_auth_required=bool(client_cafile),
    )
