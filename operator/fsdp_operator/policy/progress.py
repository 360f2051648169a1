"""status.progress: how far a job is (step / training.steps) and when it should finish.

The estimate is the steps left x the recent seconds per step / the goodput of the recent
window: a job that restarts, or waits on saves, finishes later than its step time alone says,
by as much as it has lately. The window is the attempts that ran in the last WINDOW_SECONDS,
whole (history keeps attempts, not instants); its goodput leaves out the job's first start and
Kueue's wait, which the remaining steps will not pay again. Pure, and called once per pass
(accounting.account): no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

from fsdp_operator.policy import goodput
from fsdp_operator.types import status

WINDOW_SECONDS = 3600.0
"""The attempts whose goodput paces the estimate: those running, or ended within this long."""
ONE_OFF = frozenset({goodput.STARTUP, goodput.QUEUED})
"""Lost time the remaining steps will not pay again: the first start, Kueue's wait."""
NO_ESTIMATE = frozenset({status.Phase.FAILED, status.Phase.SUSPENDED})
"""Phases whose finish no pace predicts: over for good, or waiting on a user."""


def progress(s: status.FSDPJobStatus, *, steps: int, now: float) -> status.Progress | None:
    """The job's progress as of `now`; None while no step is known (a fresh job)."""
    if s.phase is status.Phase.SUCCEEDED:
        return status.Progress(percent=100.0, estimated_seconds_remaining=0)
    if s.step is None:
        return None
    done = min(max(s.step, 0), steps)
    percent = round(100.0 * done / steps, 1)
    return status.Progress(
        percent=percent, estimated_seconds_remaining=remaining(s, left=steps - done, now=now)
    )


def remaining(s: status.FSDPJobStatus, *, left: int, now: float) -> int | None:
    """Wall seconds to the last step at the recent pace; None until a step time and a goodput
    are measured, and for a job that failed or is suspended."""
    if s.phase in NO_ESTIMATE:
        return None
    if left <= 0:
        return 0
    per_step = step_seconds(s)
    fraction = window_goodput(s, now=now)
    if per_step is None or fraction is None:
        return None
    return round(left * per_step / fraction)


def step_seconds(s: status.FSDPJobStatus) -> float | None:
    """Seconds per step: the current attempt's own (rank 0's sums), else the job's mean (an
    attempt that has not stepped yet trains as the ones before it did)."""
    entry = s.history[-1] if s.history else None
    if entry is not None and entry.attempt == s.attempt and (entry.steps_run or 0) > 0:
        return (entry.train_seconds or 0.0) / (entry.steps_run or 1) or None
    return goodput.mean_step(s.history) or None


def window_goodput(s: status.FSDPJobStatus, *, now: float) -> float | None:
    """Productive seconds / wall seconds of the attempts in the window, less one-off time;
    None before any productive second."""
    end = s.finished if s.finished is not None else now
    recent = [e for e in s.history if e.ended is None or e.ended >= end - WINDOW_SECONDS]
    if not recent:
        return None
    start = _began(recent[0])
    total = goodput.Part()
    mean = goodput.mean_step(s.history)
    for entry in recent:
        total.add(goodput.contribution(entry, now=end, mean_step=mean))
    wall = end - (start if start is not None else end)
    counted = wall - sum(total.lost.get(cause, 0.0) for cause in ONE_OFF)
    if total.productive <= 0 or counted <= 0:
        return None
    return min(1.0, total.productive / counted)


def _began(entry: status.HistoryEntry) -> float | None:
    """When an attempt's time starts to count: its predecessor's failure (the recovery is its
    cost), else its launch, else its pods' creation."""
    tl = entry.timeline
    if tl is not None and tl.failed is not None:
        return tl.failed
    if tl is not None and tl.launched is not None:
        return tl.launched
    return entry.started
