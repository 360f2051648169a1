"""A failed attempt (detect.py found it): charge it to its budget, then either fail the job
(a budget spent, a cause not worth retrying, the same OOM twice) or tear the gang down and
launch the next attempt after its backoff. Before the pods go, their evidence is read
(`Collect`); what reconcile.py reads there comes back through `explained`.

Pure: the draft in, the draft changed.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import conditions, decision, explain, finish, launch, restarts
from fsdp_operator.types import observed, status


def on_failure(
    d: decision.Draft, obs: observed.Observed, failure: status.Failure, tun: restarts.Tunables
) -> decision.Draft:
    s = d.status
    d.failure, s.last_failure = failure, failure
    if failure.step is not None and (s.step is None or failure.step > s.step):
        s.step = failure.step  # the rank's own report beats the last scrape
    detect_s = max(0.0, obs.now - failure.time)
    where = f" rank {failure.rank} pod {failure.pod} node {failure.node}" if failure.pod else ""
    d.emit("FailureDetected", f"{failure.cause.value}:{where} {failure.message}", warning=True)
    d.collect = collect(obs, failure)
    for entry in s.history:  # their ConfigMaps go in this pass (reconcile.py)
        if d.collect and entry.attempt in d.collect.drop and entry.failure is not None:
            entry.failure.evidence_ref = None
    if _same_oom_again(obs.status.last_failure, failure):
        why = f"OOMKilled twice in {explain.phase_kind(failure.phase)}"
        cause = status.Cause.OOM
        return finish.finish(d, obs, cause, f"{why}: {failure.diagnosis or failure.message}")
    counters = restarts.charge(s.restarts, failure.cause)
    app = status.budget_of(failure.cause) is status.Budget.APPLICATION
    # Blind to the storage, the operator knows new checkpoints from rank 0's reports.
    newest = obs.checkpoint if obs.checkpoints_visible else s.last_checkpoint
    stalled = app and not restarts.made_progress(s, newest)
    counters.without_progress = counters.without_progress + 1 if stalled else 0
    stop = restarts.stop_reason(spec=obs.spec, restarts=counters, cause=failure.cause)
    if stop is not None:
        cause, why = stop
        if cause is failure.cause and failure.message:  # not retryable: say what the rank said
            why = f"{why}: {failure.message}"
        return finish.finish(d, obs, cause, why)
    s.restarts = counters
    return _restart(d, obs, failure, tun, detect_s=detect_s)


def _restart(
    d: decision.Draft,
    obs: observed.Observed,
    failure: status.Failure,
    tun: restarts.Tunables,
    *,
    detect_s: float,
) -> decision.Draft:
    """Close the attempt, exclude a lost node, tear the gang down and launch after backoff."""
    s = d.status
    finish.close_history(d, obs, failure.cause, detect_s)
    blame = failure.node if failure.cause is status.Cause.NODE_LOST else None
    s.excluded_nodes = restarts.active_exclusions(s, now=obs.now, blame=blame, tun=tun)
    if blame:
        d.emit("NodeExcluded", f"node {blame} excluded for {tun.node_exclusion_seconds:.0f}s")
    delay = restarts.backoff_seconds(obs.spec, s.restarts)
    # Under Kueue the next attempt's pods may replace these in the same pod group: Kueue
    # would count pods still running as the group's and delete the newest as excess.
    s.next_attempt_at, s.failure_observed = obs.now + delay, obs.now
    s.drain = s.queue is not None
    conditions.set_phase(d, obs, status.Phase.RESTARTING, failure.cause.value, failure.message)
    d.emit("Restarting", f"tearing down attempt {s.attempt}; next attempt in {delay:.0f}s")
    # A gang with a failed rank cannot finish a collective save: a short grace frees its
    # accelerators for the next attempt instead of holding them for the full save window.
    finish.delete_all(d, obs, grace=tun.failure_grace_seconds)
    return launch.launch(d, obs, tun, cause=failure.cause)


def _same_oom_again(before: status.Failure | None, now: status.Failure) -> bool:
    """An OOM in the phase of the previous failure's OOM: a restart would only repeat it."""
    oom = status.Cause.OOM
    return (
        before is not None
        and before.cause is oom
        and now.cause is oom
        and now.phase is not None
        and explain.phase_kind(before.phase) == explain.phase_kind(now.phase)
    )


def collect(obs: observed.Observed, failure: status.Failure) -> decision.Collect | None:
    """What to read from the failed attempt's pods before they are deleted."""
    s = obs.status
    present = [p for p in obs.attempt_pods(s.attempt) if p.rank is not None]
    pods = tuple(sorted((p.rank, p.name, p.node) for p in present))
    if not pods:
        return None
    # A lost node's kubelet would keep the read waiting for its timeout, delaying the restart.
    unreadable = tuple(sorted(p.rank for p in present if not p.node or decision.node_gone(obs, p)))
    kept = [h.attempt for h in s.history if h.failure is not None and h.failure.evidence_ref]
    drop = tuple(sorted({*kept, s.attempt})[: -explain.EVIDENCE_ATTEMPTS])
    return decision.Collect(
        attempt=s.attempt,
        pods=pods,
        nproc_per_node=obs.spec.nproc_per_node,
        world_size=s.world_size or len(pods) * obs.spec.nproc_per_node,
        hang=failure.cause is status.Cause.HANG,
        drop=drop,
        unreadable=unreadable,
    )


def explained(d: decision.Decision, better: status.Failure) -> decision.Decision:
    """The decision once the failed attempt's evidence is read (reconcile.py reads the pods'
    logs before they go): lastFailure and the attempt's history entry say what it showed, and
    so does an Event. Goes out in the pass's one status patch."""
    assert d.collect is not None
    attempt = d.collect.attempt
    s = d.status.model_copy(deep=True)
    s.last_failure = better
    for entry in s.history:
        if entry.attempt == attempt and entry.failure is not None:
            entry.failure = finish.brief(better)
    events = d.events
    words = "; ".join(w for w in (better.diagnosis, better.evidence) if w)
    if words:
        said = f"attempt {attempt}: {words}"
        events += (decision.Event(decision.EventType.WARNING, "FailureExplained", said),)
    return dataclasses.replace(d, status=s, events=events)
