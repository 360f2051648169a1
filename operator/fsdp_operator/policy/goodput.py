"""Goodput: the fraction of a job's wall time spent on steps that count, and where the rest went.

Pure accounting over status.history (no I/O, no clock reads). Each attempt contributes:
- its training seconds (rank 0's own sum of step times), less the steps a later restart redid;
- the time from the previous attempt's stop (or, for the first attempt, its launch) to its own
  first step, charged to the cause of that stop ("Startup" for the first attempt);
- the steps it computed that were thrown away (steps lost x its mean step time), charged to the
  cause that ended it;
- the seconds its training waited on checkpoint saves ("CheckpointSave");
- per restart in place, the time from the rank's failure to the next generation's first step
  and the steps it trained again, charged to the failure's cause.
What no measurement explains (scrape gaps, logging, a rank 0 that died before its last scrape)
is "Other", so the parts always add up to the wall time. Time an attempt's pods waited for
Kueue's admission is "Queued": it is the cluster's, so `fraction` leaves it out of the wall.
Attempts that fall off the history (its limit) are folded into totals first, so a job with
hundreds of restarts keeps its figure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from fsdp_operator.types import status

STARTUP = "Startup"
QUEUED = "Queued"  # waiting for Kueue's admission: the cluster's time, outside `fraction`
CHECKPOINT_SAVE = "CheckpointSave"
OTHER = "Other"
UNKNOWN = "Unknown"


@dataclasses.dataclass
class Part:
    productive: float = 0.0
    redone: float = 0.0
    lost: dict[str, float] = dataclasses.field(default_factory=dict)

    def charge(self, cause: str, seconds: float) -> None:
        if seconds > 0:
            self.lost[cause] = self.lost.get(cause, 0.0) + seconds

    def add(self, other: Part) -> None:
        self.productive += other.productive
        self.redone += other.redone
        for cause, seconds in other.lost.items():
            self.charge(cause, seconds)


def _stopped_at(entry: status.HistoryEntry) -> float | None:
    """When the attempt stopped being useful: its failure time (ended less detection)."""
    if entry.ended is None:
        return None
    return entry.ended - (entry.detect_seconds or 0.0)


def contribution(entry: status.HistoryEntry, *, now: float, mean_step: float | None = None) -> Part:
    """`mean_step`: the job's seconds per step, for an attempt that died before rank 0's
    figures were scraped (its lost steps still cost their time)."""
    part = Part()
    train = max(0.0, entry.train_seconds or 0.0)
    run = entry.steps_run or 0
    per_step = train / run if run > 0 else mean_step or 0.0
    redone = (entry.steps_lost or 0) * per_step
    if run > 0:
        redone = min(train, redone)
    if redone > 0:
        part.charge(entry.cause.value if entry.cause else UNKNOWN, redone)
    for restart in entry.restarts_in_place:  # from its failure to the next first step
        cause = restart.failure.cause.value
        again = min(max(0.0, train - redone), (restart.steps_lost or 0) * per_step)
        redone += again
        part.charge(cause, again)
        if restart.failure.time is not None:
            back = restart.resumed if restart.resumed is not None else now
            part.charge(cause, max(0.0, back - restart.failure.time))
    part.productive, part.redone = max(0.0, train - redone), redone
    part.charge(CHECKPOINT_SAVE, max(0.0, entry.blocked_seconds or 0.0))
    tl = entry.timeline
    if tl is not None:
        start = tl.failed if tl.failed is not None else tl.launched
        end = tl.first_step
        stopped = _stopped_at(entry)
        if end is None:  # not training yet: the recovery lasts until now, or until it too ended
            end = stopped if stopped is not None else now
        if stopped is not None:  # never more than the attempt's time not spent training
            end = min(end, stopped - train - max(0.0, entry.blocked_seconds or 0.0))
        queued = _queued(tl, end)
        part.charge(QUEUED, queued)
        if start is not None:
            part.charge(tl.cause.value if tl.cause else STARTUP, max(0.0, end - start - queued))
    return part


def _queued(tl: status.Timeline, end: float) -> float:
    """Seconds the attempt's pods waited for Kueue (launched -> admitted). Zero for a job under
    no queue: it has no admitted time (account() gives a waiting attempt's as `now`)."""
    if tl.launched is None or tl.admitted is None:
        return 0.0
    return max(0.0, min(tl.admitted, end) - tl.launched)


def mean_step(history: Iterable[status.HistoryEntry]) -> float | None:
    entries = [e for e in history if (e.steps_run or 0) > 0 and e.train_seconds is not None]
    steps = sum(e.steps_run or 0 for e in entries)
    return sum(e.train_seconds or 0.0 for e in entries) / steps if steps else None


def since(history: Iterable[status.HistoryEntry]) -> float | None:
    for entry in history:
        tl = entry.timeline
        return tl.launched if tl is not None and tl.launched is not None else entry.started
    return None


def fold(
    old: status.Goodput | None, dropped: Iterable[status.HistoryEntry], *, now: float
) -> status.Goodput | None:
    """Totals of attempts about to leave the history, added to what was folded before."""
    dropped = list(dropped)
    if not dropped:
        return old
    start = old.since if old is not None else since(dropped)
    if start is None:
        return old
    total = _folded(old)
    mean = mean_step(dropped)
    for entry in dropped:
        total.add(contribution(entry, now=now, mean_step=mean))
    base = old or status.Goodput(since=start)
    return base.model_copy(
        update={
            "folded_productive_seconds": total.productive,
            "folded_redone_seconds": total.redone,
            "folded_lost_seconds": dict(sorted(total.lost.items())),
        }
    )


def _folded(g: status.Goodput | None) -> Part:
    if g is None:
        return Part()
    return Part(g.folded_productive_seconds, g.folded_redone_seconds, dict(g.folded_lost_seconds))


def _with_queue_wait(
    job_status: status.FSDPJobStatus, *, now: float
) -> Iterable[status.HistoryEntry]:
    """The history, the current attempt's Kueue wait counted up to `now` while it lasts (its
    pods still gated: the queue has not admitted them yet)."""
    q = job_status.queue
    waiting = q is not None and q.admitted is None
    for entry in job_status.history:
        tl = entry.timeline
        if waiting and entry.attempt == job_status.attempt and entry.ended is None and tl:
            entry = entry.model_copy(update={"timeline": tl.model_copy(update={"admitted": now})})
        yield entry


def account(job_status: status.FSDPJobStatus, *, now: float) -> status.Goodput | None:
    """Goodput as of `now` (or the job's finish): None before the first launch."""
    start = (
        job_status.goodput.since if job_status.goodput is not None else since(job_status.history)
    )
    if start is None:
        return None
    end = job_status.finished if job_status.finished is not None else now
    total = _folded(job_status.goodput)
    mean = mean_step(job_status.history)
    for entry in _with_queue_wait(job_status, now=end):
        total.add(contribution(entry, now=end, mean_step=mean))
    wall = max(0.0, end - start)
    explained = total.productive + sum(total.lost.values())
    total.charge(OTHER, wall - explained)
    counted = wall - total.lost.get(QUEUED, 0.0)  # a queue's wait is not the job's to answer for
    folded = job_status.goodput or status.Goodput(since=start)
    return folded.model_copy(
        update={
            "since": start,
            "wall_seconds": round(wall, 3),
            "productive_seconds": round(total.productive, 3),
            "fraction": round(total.productive / counted, 4) if counted > 0 else 0.0,
            "lost_seconds": {k: round(v, 3) for k, v in sorted(total.lost.items())},
            "redone_seconds": round(total.redone, 3),
        }
    )
