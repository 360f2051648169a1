"""The reconcile decision: `decide(observed) -> Decision`. The operator's brain, and pure.

One pass: keep what happened (track.py: checkpoints, progress), then either finish, fail,
suspend, tear down and restart, launch, or wait; then close the books (accounting.py). Each is
a policy in a module of its own (conditions, failure, launch, spares, straggler, inplace,
finish); this module only wires them, in the order that is itself the policy. The Decision
(decision.py) carries the whole new status (written in one patch), the pods to delete and
create, the Events, and when to look again. No I/O, no clock reads, no kopf: tests drive
each policy as a truth table (tests/unit/test_policy_*.py).
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import (
    accounting,
    conditions,
    deadlines,
    decision,
    detect,
    failure,
    finish,
    inplace,
    launch,
    lingering,
    restarts,
    scheduling,
    sidecars,
    spares,
    straggler,
    suspicion,
    track,
)
from fsdp_operator.types import observed, status

# A running job is woken by its pods' and nodes' watch events, by rank 0's progress (scraped
# beside the passes, probe.py) and at its own deadlines below; this is only the safety net.
RESYNC_SECONDS = 300.0

# What other layers name here (each lives with its policy).
Decision = decision.Decision
Launch = decision.Launch
Collect = decision.Collect
Takeover = decision.Takeover
PodDelete = decision.PodDelete
Event = decision.Event
EventType = decision.EventType
EXPECT_SECONDS = launch.EXPECT_SECONDS
CONFLICT = conditions.CONFLICT
CONFLICT_POLL_SECONDS = conditions.CONFLICT_POLL_SECONDS
RECONCILE_ERROR = conditions.RECONCILE_ERROR
stamp = conditions.stamp


def decide(obs: observed.Observed, tun: restarts.Tunables | None = None) -> decision.Decision:
    """What to do about one FSDPJob, given everything observed in this pass."""
    d = _decide(obs, tun or restarts.Tunables())
    books = accounting.account(obs.status, d.status, obs)
    d.resumed = books.resumed
    if books.said:
        d.emit("TrainingResumed", books.said)
    if d.spares:  # made from the attempt's launch as the pass leaves it
        d.spare_launch = launch.current_launch(obs, d.status)
    return d.freeze()


def _decide(obs: observed.Observed, tun: restarts.Tunables) -> decision.Draft:
    d = decision.Draft(status=obs.status.model_copy(deep=True))
    s = d.status
    s.observed_generation = obs.generation
    # this pass works
    s.conditions = [c for c in s.conditions if c.type != conditions.RECONCILE_ERROR]
    track.track(d, obs)
    if s.phase in status.TERMINAL_PHASES:
        suspicion.forget(d)
        return finish.finished(d, obs)
    accounting.pod_milestones(d, obs)  # the hang baseline (deadlines.py) reads them in this pass
    if obs.validated_generation is not None:
        s.validated_generation = obs.validated_generation
    conditions.conflicts(d, obs)
    if obs.spec_error:
        return finish.finish(d, obs, status.Cause.INVALID_SPEC, obs.spec_error)
    if s.started is None or (s.phase is status.Phase.SUSPENDED and not obs.spec.suspend):
        s.started = obs.now  # the active deadline counts from (re)start, like a Job's
    if obs.spec.suspend:
        return finish.suspend(d, obs)
    deadline = obs.spec.active_deadline_seconds
    if deadline is not None and obs.now - s.started >= deadline:
        why = f"activeDeadlineSeconds={deadline} passed"
        return finish.finish(d, obs, status.Cause.DEADLINE, why)
    if deadline is not None:
        d.again(s.started + deadline - obs.now)
    if s.phase is status.Phase.SUSPENDED:
        conditions.set_phase(d, obs, status.Phase.PENDING, "Resumed", "spec.suspend cleared")
        d.emit("Resumed", "spec.suspend cleared; starting from the newest checkpoint")
        return launch.launch(d, obs, tun, cause=None)
    accounting.final_sums(d, obs)  # the live window (deadlines.py) reads them in this pass
    if s.attempt == 0 or (s.phase is status.Phase.RESTARTING and s.next_attempt_at is not None):
        if s.attempt == 0:
            conditions.set_phase(d, obs, status.Phase.PENDING, "Created", "")
        cause = s.last_failure.cause if s.last_failure else None
        return launch.launch(d, obs, tun, cause=cause)
    return inplace.stopped(d, obs) or _running(d, obs, tun)


def _running(d: decision.Draft, obs: observed.Observed, tun: restarts.Tunables) -> decision.Draft:
    """An attempt under way: its pods made, then a failure, success, a preemption or a resize
    ends it; otherwise it is looked at again at its next deadline."""
    s = d.status
    pods = obs.attempt_pods(s.attempt)
    if not s.pods_created:
        launch.complete_creation(d, obs, pods)
        if obs.conflicts and not s.pods_created:
            # A name someone else holds: the gang waits whole (the pods a create made before it
            # met the name are being deleted again by this operator: not a failure).
            return d
    launch.queued(d, obs, pods)
    scheduling.report(d, obs, pods)  # the scheduler's reason, before any timeout acts on it
    scheduling.claim_shared(d, obs)
    sidecars.told(d, obs)  # never a rank's failure: detect reads only the worker container
    evicted = next((p for p in pods if p.queue_evicted), None)
    if evicted is not None:  # Kueue preempted the group: not a failure; requeue, resume
        msg = f"Kueue evicted pod group {s.queue.pod_group if s.queue else '?'} "
        msg += f"({evicted.queue_evicted}); waiting for re-admission"
        return finish.planned_stop(d, obs, status.Cause.PREEMPTED, msg)
    now_seen = dataclasses.replace(obs, status=s)  # progress tracked in this pass counts
    found = detect.detect(now_seen)
    if found is not None:
        suspicion.forget(d)  # the failure's own Events say what became of the node
    if found is not None and spares.take_over(d, obs, found, tun):
        return d
    if found is not None:
        return failure.on_failure(d, obs, found, tun)
    suspicion.judge(d, obs)  # a silent Lease under a gang that trains: said, not acted on
    if detect.succeeded(now_seen):
        track.completion_report(d, obs, pods)
        return finish.finish(d, obs, None, f"all {s.replicas} pods of attempt {s.attempt} exited 0")
    late = deadlines.lingering(now_seen)
    if late:  # rank 0 ended well long ago: training is over, these did not end with it
        track.completion_report(d, obs, pods)
        return lingering.succeeded_without(d, obs, late)
    finish.delete_stale(d, obs)
    spares.keep(d, obs)
    if pods and all(p.phase is observed.PodPhase.RUNNING for p in pods) and s.pods_created:
        resized = _all_running(d, obs, tun)
        if resized is not None:
            return resized
    d.again(RESYNC_SECONDS)
    wake = deadlines.next_deadline(now_seen)
    if wake is not None:
        d.again(wake - obs.now + 0.05)  # a node's grace or a deadline ends before the next poll
    return d


def _all_running(
    d: decision.Draft, obs: observed.Observed, tun: restarts.Tunables
) -> decision.Draft | None:
    """Every pod runs: the attempt is Running (a recovery, if it followed a failure); it stops
    to swap a slow node out for a spare's (straggler.py), or is resized when capacity changed
    (None: it runs on as it is)."""
    s = d.status
    if s.phase is not status.Phase.RUNNING:
        conditions.set_phase(d, obs, status.Phase.RUNNING, "AllPodsRunning", f"attempt {s.attempt}")
        if s.failure_observed is not None and s.history:
            s.history[-1].recover_seconds = obs.now - s.failure_observed
            d.recovered = s.history[-1]
        s.failure_observed = None
    swapped = straggler.swap(d, obs, tun)
    if swapped is not None:
        return swapped
    excluded = [e.node for e in s.excluded_nodes if e.until > obs.now]
    # Past the last step the pods are only sealing the final checkpoint: a resize now
    # would start an attempt that trains nothing.
    trained = s.step is not None and s.step >= obs.spec.training.steps
    stay = trained or restarts.grow_came_to_nothing(s, obs.now)
    target = None if stay else restarts.grow_target(obs, excluded)
    if target is None:
        return None
    why = f"resizing from {s.replicas} to {target} pods"
    return finish.planned_stop(d, obs, status.Cause.RESIZE, why)
