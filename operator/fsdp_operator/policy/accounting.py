"""The job's books: what each attempt ran (steps, train and blocked seconds, milestones), what
its time to resume was, and goodput. Bookkeeping only: nothing here decides what happens to
the job; the policies read what it kept.

Two moments in a pass. What a policy reads in the same pass is kept before the policies run
(decide.py calls these): rank 0's figures (scraped, or its termination message's sums; detect
sizes a gang's live window from them) and the milestones the operator sees on pods (detect's
hang baseline is the moment every pod ran). Everything else is `account`, called once after
the policies as a function of the status before the pass, the status the policies made and
what was observed: the timelines an attempt's end and the next launch start, the attempt whose
time to resume became known, goodput, and progress (percent and time to finish).
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import decision, goodput, progress
from fsdp_operator.types import observed, status

GOODPUT_REFRESH_SECONDS = 30.0  # goodput alone changes every pass: write it at most this often
MILESTONES = ("rendezvous", "loaded", "first_step")


def in_place_sums(entry: status.HistoryEntry) -> tuple[int, float, float]:
    """Steps, train and blocked seconds of the generations before the current one."""
    done = entry.restarts_in_place
    return (
        sum(r.steps_run for r in done),
        sum(r.train_seconds for r in done),
        sum(r.blocked_seconds for r in done),
    )


def _in_place_report(entry: status.HistoryEntry, prog: observed.Progress) -> None:
    """A later generation's first step, the step it loaded, and the steps it trains again."""
    last = entry.restarts_in_place[-1] if entry.restarts_in_place else None
    if last is None or last.generation != prog.generation - 1:
        return
    if last.resumed_from_step is None and prog.resumed_from is not None:
        last.resumed_from_step = prog.resumed_from
        last.from_memory = prog.resumed_from_memory
        failed_at = last.failure.step
        if failed_at is None and last.steps_run:  # a lost node says nothing: rank 0's count
            failed_at = _generation_start(entry) + last.steps_run
        if failed_at is not None:
            last.steps_lost = max(0, failed_at - max(0, prog.resumed_from))
    since = last.failure.time or 0.0
    for phase in ("rendezvous", "loaded"):  # the next generation's, for the phases
        at = prog.milestones.get(phase)
        if getattr(last, phase) is None and at is not None and at >= since:
            setattr(last, phase, at)
    first = prog.milestones.get("first_step")
    if last.resumed is None and first is not None and first >= since:
        last.resumed = first


def _generation_start(entry: status.HistoryEntry) -> int:
    """The step the newest restart in place's failed generation began at: where the one
    before it resumed, else where the attempt did (0: fresh)."""
    done = entry.restarts_in_place
    before = done[-2].resumed_from_step if len(done) > 1 else entry.resumed_from_step
    return max(0, before or 0)


def worker_report(d: decision.Draft, prog: observed.Progress, now: float) -> None:
    """Rank 0's own figures: its milestones, step and save seconds, and checkpoint interval.
    After restarts in place its counters start again at 0: the earlier generations' sums are
    added."""
    s = d.status
    entry = decision.current_entry(s)
    if entry is not None and entry.ended is None:
        steps, train, blocked = in_place_sums(entry) if prog.generation else (0, 0.0, 0.0)
        if prog.steps_run is not None:
            entry.steps_run = steps + prog.steps_run
        if prog.train_seconds is not None:
            entry.train_seconds = round(train + prog.train_seconds, 3)
        if prog.blocked_seconds is not None:
            entry.blocked_seconds = round(blocked + prog.blocked_seconds, 3)
        if prog.generation:
            _in_place_report(entry, prog)
        tl = entry.timeline
        if tl is not None:  # fills only what generation 0 was not seen to report
            for name in MILESTONES:
                at = prog.milestones.get(name)
                if at is not None and getattr(tl, name) is None:
                    setattr(tl, name, at)
            if tl.first_step is None and (prog.steps_run or 0) > 0:
                tl.first_step = now  # a worker that reports no milestones: seen by this pass
    new = prog.interval
    if new is None or new == s.checkpoint_interval:
        return
    old = s.checkpoint_interval
    s.checkpoint_interval = new
    if new.auto and (old is None or old.steps != new.steps):
        d.emit("CheckpointInterval", _interval_message(new))


def _interval_message(c: status.CheckpointInterval) -> str:
    def secs(v: float | None) -> str:
        return "unmeasured" if v is None else f"{v:.3g}s"

    mtbf = "-" if c.mtbf_seconds is None else f"{c.mtbf_seconds / 3600:.2f}h"
    return (
        f"checkpoint every {c.steps} steps (auto, Young/Daly): blocking save {secs(c.save_seconds)}"
        f", step {secs(c.step_seconds)}, MTBF {mtbf} from {c.failures or 0} failure(s) and the "
        "prior"
    )


def final_sums(d: decision.Draft, obs: observed.Observed) -> None:
    """Rank 0's totals from its termination message or live record (contract.SUMS) once its
    pod has ended: the steps it ran after the operator's last scrape count (without them an
    attempt's last seconds of training, up to a scrape interval, were goodput's `Other`).

    Also for an attempt already closed: when this operator tears a gang down (another rank
    failed, a node was lost, a resize, a preemption), rank 0's SIGTERM message arrives after
    its attempt's entry ended. Such an entry takes the steps and their seconds but keeps its
    scraped save time: a save after the stop is the recovery's time, which is counted there."""
    entries = {entry.attempt: entry for entry in d.status.history}
    for pod in obs.pods:
        entry = entries.get(pod.attempt)
        if pod.rank != 0 or pod.phase not in decision.EXITED or entry is None:
            continue
        _final_milestones(entry, pod.termination)
        found = pod.termination.sums
        if found is None or (entry.steps_run is not None and found[0] < entry.steps_run):
            continue
        closed = entry.ended is not None
        entry.steps_run = found[0]
        entry.train_seconds = round(found[1], 3)
        if not closed:
            entry.blocked_seconds = round(found[2], 3)


def _final_milestones(entry: status.HistoryEntry, said: observed.Termination) -> None:
    """The attempt's resume milestones that no scrape saw, from rank 0's final message (an
    attempt of seconds on a busy machine: its time to resume had no first step). Its process
    is the attempt's last generation, so only an attempt without restarts in place takes them;
    with them, the step it loaded (the current attempt's is track.completion_report's)."""
    if entry.restarts_in_place:
        return
    if entry.resumed_from_step is None and said.resumed_from is not None:
        entry.resumed_from_step = said.resumed_from if said.resumed_from >= 0 else None
    tl = entry.timeline
    if tl is None:
        return
    for name in MILESTONES:
        at = said.milestones.get(name)
        if at is not None and getattr(tl, name) is None:
            setattr(tl, name, at)


def pod_milestones(d: decision.Draft, obs: observed.Observed) -> None:
    """Teardown and start milestones the operator sees on pods: gang gone, bound, running."""
    s = d.status
    older = [p for p in obs.pods if p.attempt < s.attempt]
    pending = s.next_timeline
    if pending is not None and pending.gang_gone is None and not obs.pods:
        pending.gang_gone = obs.now  # before the next launch: every pod is an old one
    entry = decision.current_entry(s)
    tl = entry.timeline if entry is not None else None
    if tl is None or entry is None or entry.ended is not None:
        return
    if tl.failed is not None and tl.gang_gone is None and not older:
        tl.gang_gone = obs.now
    pods = obs.attempt_pods(s.attempt)
    complete = s.pods_created and len(pods) >= (s.replicas or 0) > 0
    if complete and tl.scheduled is None and all(p.node for p in pods):
        tl.scheduled = obs.now
    if complete and tl.running is None and all(p.phase is observed.PodPhase.RUNNING for p in pods):
        tl.running = obs.now


@dataclasses.dataclass(frozen=True)
class Account:
    """What a pass adds to the books once everything else is decided."""

    resumed: status.HistoryEntry | None = None  # an attempt whose time to resume is known now
    said: str = ""  # its TrainingResumed Event (after a failure; "" for the first start)


def account(
    before: status.FSDPJobStatus, after: status.FSDPJobStatus, obs: observed.Observed
) -> Account:
    """Close the pass's books once the policies have decided: `before` is the status the pass
    read, `after` the status they made, which gets the books written into it (the timelines an
    attempt's end and the next one's launch start, and goodput). Returns the attempt whose time
    to resume became known in this pass. No policy reads what is written here."""
    _timelines(before, after, obs)
    books = _resumed(before, after)
    after.goodput = _goodput(before, after, obs)
    after.progress = _progress(before, after, obs)
    return books


def _timelines(
    before: status.FSDPJobStatus, after: status.FSDPJobStatus, obs: observed.Observed
) -> None:
    """An attempt that ended in this pass starts the timeline of the one that follows it (when
    it failed, when that was seen); a launch in this pass carries that timeline into the new
    attempt's entry, with its launch and, when no pod of the old gang is left, its teardown."""
    ended = _ended_now(before, after)
    if ended is not None:
        failed = obs.now - (ended.detect_seconds or 0.0)
        after.next_timeline = status.Timeline(cause=ended.cause, failed=failed, detected=obs.now)
    entry = decision.current_entry(after)
    if entry is None or after.attempt == before.attempt:
        return
    pending = after.next_timeline or status.Timeline()
    entry.timeline = pending.model_copy(update={"launched": obs.now})
    if entry.timeline.failed is not None and entry.timeline.gang_gone is None and not obs.pods:
        entry.timeline.gang_gone = obs.now
    after.next_timeline = None


def _ended_now(
    before: status.FSDPJobStatus, after: status.FSDPJobStatus
) -> status.HistoryEntry | None:
    """The attempt whose entry the policies closed in this pass (finish.close_history)."""
    old = decision.current_entry(before)
    if old is None or old.ended is not None:
        return None
    entry = next((e for e in after.history if e.attempt == old.attempt), None)
    return entry if entry is not None and entry.ended is not None else None


def _resumed(before: status.FSDPJobStatus, after: status.FSDPJobStatus) -> Account:
    """The attempt whose timeline completed in this pass, and its Event after a failure."""
    entry, old = decision.current_entry(after), decision.current_entry(before)
    resumed, said = None, ""
    if (
        entry is not None
        and entry.timeline is not None
        and status.complete(entry.timeline)
        and (old is None or old.timeline is None or not status.complete(old.timeline))
    ):
        resumed = entry
        said = _resumed_message(entry) if entry.timeline.failed is not None else ""
    return Account(resumed=resumed, said=said)


def _goodput(
    before: status.FSDPJobStatus, after: status.FSDPJobStatus, obs: observed.Observed
) -> status.Goodput | None:
    """Goodput alone changes every pass: it is refreshed with any other change, at most every
    GOODPUT_REFRESH_SECONDS otherwise, and always at the end."""
    fresh = goodput.account(after, now=obs.now)
    kept = after.goodput
    unchanged = after.model_dump(exclude={"goodput"}) == before.model_dump(exclude={"goodput"})
    stale = (
        kept is None
        or fresh is None
        or (fresh.wall_seconds - kept.wall_seconds >= GOODPUT_REFRESH_SECONDS)
    )
    if not unchanged or stale or after.phase in status.TERMINAL_PHASES:
        kept = fresh
    return kept


def _progress(
    before: status.FSDPJobStatus, after: status.FSDPJobStatus, obs: observed.Observed
) -> status.Progress | None:
    """Progress moves with the clock (its estimate reads goodput): refreshed with any other
    change, goodput's refresh included, and kept as it was in a pass that changed nothing."""
    quiet = after.model_dump(exclude={"progress"}) == before.model_dump(exclude={"progress"})
    if quiet and before.progress is not None:
        return before.progress
    return progress.progress(after, steps=obs.spec.training.steps, now=obs.now)


def _resumed_message(entry: status.HistoryEntry) -> str:
    assert entry.timeline is not None
    tl = entry.timeline
    parts = ", ".join(
        f"{phase} {secs:.1f}s" for phase, secs in status.breakdown(tl) if secs is not None
    )
    total = status.time_to_resume(tl) or 0.0
    cause = tl.cause.value if tl.cause else "-"
    return f"attempt {entry.attempt} training {total:.1f}s after {cause} ({parts})"
