"""How an attempt ends: the job finishes (succeeded or failed), is suspended, or stops for a
planned restart (resize, preemption); its history entry is closed and the gang deleted.

A finished job is deleted once its TTL passes. A failed job's exited pods stay (their logs);
spares of a finished job go. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

from fsdp_operator.policy import conditions, decision, suspicion
from fsdp_operator.types import observed, status

PLANNED = frozenset(
    {status.Cause.RESIZE, status.Cause.SUSPENDED, status.Cause.PREEMPTED, status.Cause.STRAGGLER}
)
"""Ends that are not failures."""


def brief(failure: status.Failure) -> status.Failure:
    """The failure as a history entry keeps it: its words shortened, so 20 entries stay small."""
    return failure.model_copy(
        update={"message": failure.message[:300], "evidence": failure.evidence[:600]}
    )


def delete_all(
    d: decision.Draft,
    obs: observed.Observed,
    *,
    keep_finished: bool = False,
    grace: int | None = None,
) -> None:
    """Delete the gang; force pods whose node is gone. Exited pods of a failed job stay (logs)."""
    for pod in [*obs.pods, *obs.spares]:
        gone = decision.node_gone(obs, pod)
        if pod.deleting and not gone:
            continue
        if keep_finished and pod.phase in decision.EXITED:
            continue
        d.delete.append(decision.PodDelete(pod.name, force=gone, grace=grace))


def delete_stale(d: decision.Draft, obs: observed.Observed) -> None:
    """Pods of earlier attempts still there: delete them (force where their node is gone)."""
    for pod in obs.pods:
        gone = decision.node_gone(obs, pod)
        if pod.attempt != d.status.attempt and (not pod.deleting or gone):
            d.delete.append(decision.PodDelete(pod.name, force=gone))


def delete_spares(d: decision.Draft, obs: observed.Observed) -> None:
    """A finished job's spares: they would wait for a node's place forever."""
    d.delete += [
        decision.PodDelete(p.name, force=decision.node_gone(obs, p))
        for p in obs.spares
        if not p.deleting
    ]


def close_history(
    d: decision.Draft, obs: observed.Observed, cause: status.Cause, detect_s: float | None
) -> None:
    """End the current attempt's entry; count its uptime (and a failure unless planned). The
    timeline of the attempt that follows it is the books' (accounting.account)."""
    s = d.status
    last = decision.current_entry(s)
    if last is None or last.ended is not None:
        return
    last.ended, last.cause, last.detect_seconds = obs.now, cause, detect_s
    if d.failure is not None:  # detected in this pass: the failure that ended it
        last.failure = brief(d.failure)
    failed = obs.now - (detect_s or 0.0)
    rel = s.reliability
    s.reliability = status.Reliability(
        failures=rel.failures + (cause not in PLANNED),
        gang_failures=rel.gang_failures + (cause not in PLANNED),
        uptime_seconds=round(rel.uptime_seconds + max(0.0, failed - (last.started or failed)), 3),
    )


def finish(
    d: decision.Draft, obs: observed.Observed, cause: status.Cause | None, msg: str
) -> decision.Draft:
    """Succeeded (`cause` None) or Failed for `cause`: for good."""
    s = d.status
    s.finished = obs.now
    if cause is None:
        conditions.set_phase(d, obs, status.Phase.SUCCEEDED, "Succeeded", msg)
        d.emit("Succeeded", msg)
        delete_spares(d, obs)
    else:
        close_history(d, obs, cause, None)
        conditions.set_phase(d, obs, status.Phase.FAILED, cause.value, msg)
        d.emit(cause.value, msg, warning=True)
        delete_all(d, obs, keep_finished=True)
        if s.queue is not None:  # its exited pods stay (logs); its quota goes
            d.release.append(s.queue.pod_group)
    ttl = obs.spec.ttl_seconds_after_finished
    if ttl is not None:
        d.again(ttl)
    return d


def finished(d: decision.Draft, obs: observed.Observed) -> decision.Draft:
    """A job already finished: its stragglers go, and it goes once its TTL has passed."""
    delete_spares(d, obs)  # stragglers of a pass that stopped half-way
    ttl = obs.spec.ttl_seconds_after_finished
    done = d.status.finished or obs.now
    if ttl is not None and obs.now >= done + ttl:
        d.delete_job = True
        d.emit("Deleted", f"ttlSecondsAfterFinished={ttl} passed")
    elif ttl is not None:
        d.again(done + ttl - obs.now)
    return d


def planned_stop(
    d: decision.Draft, obs: observed.Observed, cause: status.Cause, msg: str
) -> decision.Draft:
    """Tear down gracefully: workers save a checkpoint on SIGTERM before they exit."""
    s = d.status
    close_history(d, obs, cause, None)
    suspicion.forget(d)  # its pods go: no node is this attempt's to watch
    s.failure_observed, s.drain, s.next_attempt_at = obs.now, True, obs.now
    phase = status.Phase.SUSPENDED if cause is status.Cause.SUSPENDED else status.Phase.RESTARTING
    conditions.set_phase(d, obs, phase, cause.value, msg)
    d.emit(cause.value, msg)
    delete_all(d, obs)
    d.again(1.0)
    return d


def suspend(d: decision.Draft, obs: observed.Observed) -> decision.Draft:
    """spec.suspend: stop after a save, then keep the job's pods away."""
    if d.status.phase is status.Phase.SUSPENDED:
        delete_all(d, obs)  # stragglers from a pass that stopped half-way
        if d.delete:
            d.again(1.0)
        return d
    msg = "spec.suspend set; pods stop after a save"
    return planned_stop(d, obs, status.Cause.SUSPENDED, msg)
