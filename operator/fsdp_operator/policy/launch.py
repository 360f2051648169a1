"""Launch: start the next attempt when backoff and draining allow, at the size that fits, from
the newest checkpoint (or under the rules by which its pods choose one); make the pods of the
running attempt that are missing; and, under Kueue, its pod group and its admission.

Pure: the draft in, the draft changed (the pods are made by run/objects.py from `Launch`).
"""

from __future__ import annotations

from fsdp_operator.policy import conditions, decision, goodput, restarts, suspicion
from fsdp_operator.types import observed, queueing, status
from fsdp_worker import contract
from fsdp_worker.contract import config_checkpoint, interval

# Pods this operator created are expected in its watch this soon; only then are missing ones
# created again (each early retry is GETs, 409s and a GET on a busy API server). 10 s was too
# short for a saturated API server: at 1,000 jobs on 2 cores the watch lagged 20-80 s and about
# 1,080 of a bring-up's 15,500 requests were such repeats, 220 at 60 s (docs/operator.md,
# "Fleet"). client-go waits 5 minutes; the pods' own watch events wake the job when seen.
EXPECT_SECONDS = 60.0


def launch(
    d: decision.Draft,
    obs: observed.Observed,
    tun: restarts.Tunables,
    *,
    cause: status.Cause | None,
) -> decision.Draft:
    """Start the next attempt when backoff and draining allow; otherwise say when to look."""
    s = d.status
    if conditions.blocked(d, obs):
        return d
    if s.next_attempt_at is not None and obs.now < s.next_attempt_at:
        d.again(s.next_attempt_at - obs.now)
        return d
    if _draining(s, obs, tun):
        d.again(1.0)  # old pods are saving their checkpoint; resume from it, not before it
        return d
    excluded = [e.node for e in s.excluded_nodes if e.until > obs.now]
    replicas = restarts.world_size(obs=obs, excluded=excluded, cause=cause, current=s.replicas)
    ck = obs.checkpoint
    if s.history and s.history[-1].attempt == s.attempt and s.step is not None:
        # known only now: the step reached versus the step the next attempt resumes from
        # (pods that choose their own are sent to find the newest step sealed)
        s.history[-1].steps_lost = max(0, s.step - (ck.step if ck else (s.sealed_step or 0)))
    rules = resume_rules(obs, s) if ck is None else None  # the ending attempt's lineage
    before = s.replicas
    ending = decision.current_entry(s)  # a planned stop (a preemption) has a cause, no failure
    ended_by = ending.cause if ending is not None and ending.cause is not None else cause
    s.attempt += 1
    s.replicas, s.world_size = replicas, replicas * obs.spec.nproc_per_node
    s.pods_created, s.drain, s.next_attempt_at = False, False, None
    if s.spares is not None or obs.spec.spares:
        done = s.spares.takeovers if s.spares is not None else 0
        s.spares = status.Spares(wanted=obs.spec.spares, takeovers=done)
    s.attempt_started, s.last_progress_time = obs.now, None
    suspicion.forget(d)  # a new attempt's nodes are judged afresh
    _pod_group(d, obs, cause=ended_by, replicas=replicas, before=before)
    s.resumed_from_step = ck.step if ck else None
    s.resume_path = ck.path if ck else (contract.RESUME_AUTO if rules else None)
    s.resume_rules = rules.to_json() if rules else None
    s.step = ck.step if ck else None
    _open_history(s, obs)
    d.launch = current_launch(obs, s)
    origin = f"checkpoint step {ck.step}" if ck else "scratch"
    if rules is not None:
        expect = f", expecting step {rules.expect_step}" if rules.expect_step is not None else ""
        origin = f"the checkpoint its pods choose (the operator cannot read them{expect})"
    d.emit("AttemptStarted", f"attempt {s.attempt}: {replicas} pods from {origin}")
    d.again(1.0)
    return d


def _draining(s: status.FSDPJobStatus, obs: observed.Observed, tun: restarts.Tunables) -> bool:
    """The old pods still run (saving a checkpoint), and the drain has time left."""
    draining = [
        p
        for p in obs.pods
        if p.attempt <= s.attempt
        and not decision.node_gone(obs, p)
        and p.phase not in decision.EXITED
    ]
    waited = obs.now - (s.failure_observed or obs.now)
    return s.drain and bool(draining) and waited < tun.drain_timeout_seconds


def _open_history(s: status.FSDPJobStatus, obs: observed.Observed) -> None:
    """The new attempt's history entry (its timeline is the books', accounting.account);
    entries past the limit are folded into goodput's totals."""
    entry = status.HistoryEntry(
        attempt=s.attempt,
        started=obs.now,
        resumed_from_step=s.resumed_from_step,
        world_size=s.world_size,
    )
    history = [*s.history, entry]
    dropped = history[: -status.HISTORY_LIMIT]
    s.goodput = goodput.fold(s.goodput, dropped, now=obs.now)
    s.history = history[-status.HISTORY_LIMIT :]


def resume_rules(obs: observed.Observed, s: status.FSDPJobStatus) -> contract.ResumeRules | None:
    """With no checkpoint to name, whether the next attempt's pods choose one themselves
    (``auto``), under which lineage, and which step they must find; None: start fresh.

    They choose when this operator cannot read the job's checkpoints (their claim is mounted in
    the pods, not here), and when a step was sealed that it cannot find: then the pods either
    find it or stop saying why, and the job never trains again from step 0 unasked. A first
    attempt the operator cannot read for chooses too (rules of attempt 0): another job's
    checkpoints in its directory then stop it naming the cause, or are resumed from with
    ``resumeFromPreviousJobs``, as when the operator reads them. ``s`` is the status of the
    attempt that ended (attempt 0: none yet); `obs.resume_rules` its pods' rules.
    """
    if s.attempt == 0:
        visible = obs.checkpoints_visible
        return None if visible else contract.ResumeRules(attempt=0, resumed_from_step=None)
    if obs.checkpoints_visible and s.sealed_step is None:
        return None
    resumed = s.resumed_from_step
    if resumed is None and obs.resume_rules is not None:
        # That attempt chose for itself and did not say from where before it ended: at most
        # the step it was sent to find.
        resumed = obs.resume_rules.expect_step
    return contract.ResumeRules(
        attempt=s.attempt, resumed_from_step=resumed, expect_step=s.sealed_step
    )


def _reliability(obs: observed.Observed, s: status.FSDPJobStatus) -> str:
    """FSDP_RELIABILITY for `intervalSteps: auto` ("" otherwise): the failure record and the
    last measured costs, so the new attempt's first interval is already the informed one."""
    if obs.spec.checkpoint.interval_steps != config_checkpoint.AUTO:
        return ""
    ci = s.checkpoint_interval
    return interval.Reliability(
        failures=s.reliability.failures,
        gang_failures=s.reliability.gang_failures,
        uptime_seconds=s.reliability.uptime_seconds,
        save_seconds=ci.save_seconds if ci else None,
        step_seconds=ci.step_seconds if ci else None,
    ).to_json()


def complete_creation(
    d: decision.Draft, obs: observed.Observed, pods: list[observed.PodView]
) -> None:
    """Every pod of the attempt seen once; or create the missing ones (the operator may have
    stopped between the status write and the creates), unless someone else holds a name, or
    this operator just created them and its watch has not shown them yet."""
    s = d.status
    if len(pods) >= (s.replicas or 0):
        s.pods_created = True
    elif obs.created_at is not None and obs.now - obs.created_at < EXPECT_SECONDS:
        d.again(EXPECT_SECONDS - (obs.now - obs.created_at))  # their watch events wake it sooner
    elif not conditions.blocked(d, obs):
        d.launch = current_launch(obs, s)


def current_launch(obs: observed.Observed, s: status.FSDPJobStatus) -> decision.Launch:
    """The running attempt's launch: for its pods, the first time and when made again (the
    missing ones, and spares)."""
    live = tuple(e.node for e in s.excluded_nodes if e.until > obs.now)
    return decision.Launch(
        s.attempt,
        s.replicas or 0,
        s.resume_path or "",
        live,
        reliability=_reliability(obs, s),
        resume_rules=s.resume_rules or "",
        queue=obs.queue if s.queue is not None else None,
        pod_group=s.queue.pod_group if s.queue is not None else "",
    )


def _pod_group(
    d: decision.Draft,
    obs: observed.Observed,
    *,
    cause: status.Cause | None,
    replicas: int,
    before: int | None,
) -> None:
    """The new attempt's Kueue pod group: the previous one's when its pods can simply be
    replaced (queueing.KEEPS_GROUP, same size, same queue), else a new one, and the previous
    group's Workload is released."""
    s, q, old = d.status, obs.queue, d.status.queue
    keep = (
        q is not None
        and old is not None
        and old.name == q.name
        and before == replicas
        and cause is not None
        and cause.value in queueing.KEEPS_GROUP
    )
    if old is not None and not keep:
        d.release.append(old.pod_group)
    if q is None:
        s.queue = None
    elif keep and old is not None:
        s.queue = status.QueueStatus(name=q.name, pod_group=old.pod_group)
    else:
        s.queue = status.QueueStatus(name=q.name, pod_group=q.group(s.attempt))


def queued(d: decision.Draft, obs: observed.Observed, pods: list[observed.PodView]) -> None:
    """Under Kueue: while any pod of the attempt is gated the job is Queued, with Kueue's
    reason; the moment every pod is seen ungated it was admitted (the pending timeout counts
    from then)."""
    s = d.status
    q = s.queue
    if q is None or not pods or q.admitted is not None:
        return
    said = obs.admission
    if any(p.gated for p in pods):
        why = said.message if said is not None and said.message else "waiting for Kueue"
        msg = f"LocalQueue {q.name}, pod group {q.pod_group}: {why}"
        reason = said.reason if said is not None and said.reason else "WaitingForAdmission"
        if s.phase is not status.Phase.QUEUED:
            d.emit("Queued", msg)
        conditions.set_phase(d, obs, status.Phase.QUEUED, reason, msg)
        conditions.set_condition(d, obs, kind=conditions.QUEUED, true=True, reason=reason, msg=msg)
        return
    if len(pods) < (s.replicas or 0):
        return
    waited = round(obs.now - (s.attempt_started or obs.now), 3)
    q.admitted, q.queued_seconds = obs.now, waited
    entry = decision.current_entry(s)
    if entry is not None and entry.timeline is not None:  # goodput leaves the wait out
        entry.timeline.admitted = obs.now
    by = f" by ClusterQueue {said.cluster_queue}" if said is not None and said.cluster_queue else ""
    msg = f"admitted{by} after {waited:.1f}s in LocalQueue {q.name}"
    conditions.set_phase(d, obs, status.Phase.PENDING, "Admitted", msg)
    conditions.set_condition(d, obs, kind=conditions.QUEUED, true=False, reason="Admitted", msg=msg)
    d.emit("Admitted", msg)
