"""What one pass's decision means for the operator's metrics (metrics.py holds the series).

Called where decisions are applied (reconcile.py), so the API layer and the metrics module
never need to know what a Decision is.
"""

from __future__ import annotations

from fsdp_operator.io import metrics
from fsdp_operator.policy import decide
from fsdp_operator.types import names, observed, status


def record(*, job: names.JobRef, obs: observed.Observed, decision: decide.Decision) -> None:
    s = decision.status
    metrics.count_phase(job.namespace, job.name, s.phase.value)
    failure = decision.failure
    if failure is not None:
        metrics.FAILURES.labels(failure.cause.value).inc()
        metrics.count_failure(job.namespace, job.name, failure.cause.value)
        metrics.DETECT.labels(failure.cause.value).observe(max(0.0, obs.now - failure.time))
    for restart in decision.in_place:
        metrics.RESTARTS_IN_PLACE.labels(restart.failure.cause.value).inc()
    if decision.launch is not None and decision.launch.attempt > 1:
        cause = s.history[-2].cause if len(s.history) > 1 else None
        metrics.RESTARTS.labels(cause.value if cause else "Unknown").inc()
        if len(s.history) > 1 and s.history[-2].steps_lost:
            metrics.STEPS_LOST.inc(s.history[-2].steps_lost or 0)
    if decision.recovered is not None and decision.recovered.recover_seconds is not None:
        metrics.RECOVER.observe(decision.recovered.recover_seconds)
    checkpoint = s.last_checkpoint
    if checkpoint is not None and checkpoint.time is not None:
        age = max(0.0, obs.now - checkpoint.time)
        metrics.CKPT_AGE.labels(job.namespace, job.name).set(age)
        metrics.CKPT_TIME.labels(job.namespace, job.name).set(checkpoint.time)
    metrics.QUEUE_WAIT.labels(job.namespace, job.name).set(queue_wait(s, obs.now))
    _record_cost(job, decision)


def queue_wait(s: status.FSDPJobStatus, now: float) -> float:
    """The current attempt's wait for Kueue's admission: as measured once admitted, so far
    while Queued, 0 for a job that names no queue."""
    if s.queue is None:
        return 0.0
    if s.queue.queued_seconds is not None:
        return s.queue.queued_seconds
    if s.phase is status.Phase.QUEUED and s.attempt_started is not None:
        return max(0.0, now - s.attempt_started)
    return 0.0


def _record_cost(job: names.JobRef, decision: decide.Decision) -> None:
    """Time to resume (once per restart), goodput and lost time, checkpoint interval."""
    s = decision.status
    resumed = decision.resumed
    timeline = resumed.timeline if resumed is not None else None
    if timeline is not None and timeline.failed is not None:  # a restart, not the first start
        for phase, seconds in status.breakdown(timeline):
            if seconds is not None:
                metrics.RESUME_PHASE.labels(phase).observe(seconds)
        total = status.time_to_resume(timeline)
        if total is not None:
            cause = timeline.cause.value if timeline.cause else "Unknown"
            metrics.RESUME.labels(cause).observe(total)
    goodput = s.goodput
    if goodput is not None:
        metrics.GOODPUT.labels(job.namespace, job.name).set(goodput.fraction)
        metrics.PRODUCTIVE.labels(job.namespace, job.name).set(goodput.productive_seconds)
        metrics.WALL.labels(job.namespace, job.name).set(goodput.wall_seconds)
        metrics.set_lost(job.namespace, job.name, goodput.lost_seconds)
    slow = s.slow_rank
    metrics.set_slow_rank(job.namespace, job.name, slow.slowdown if slow is not None else None)
    if s.checkpoint_interval is not None:
        interval = s.checkpoint_interval.steps
        metrics.CHECKPOINT_INTERVAL.labels(job.namespace, job.name).set(interval)
