"""Failure detection: did the running attempt fail, and why? A pure function of one observation.

Order matters and is the policy: someone else's eviction or deletion first, then a lost node
(its pods' own exits are symptoms), then the first failed pod by cause (a pod that failed only
because a peer did is a symptom, never the cause while another has one), then pods that
vanished, then pods stuck Pending (their scheduler's reason with them: scheduling.py), then a
hang. How long each check waits (the hang window, the exit grace, the Pending clock) is
deadlines.py's. No I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import deadlines, explain, frozen, scheduling
from fsdp_operator.types import observed, status
from fsdp_worker import contract

_PERMANENT_CLASSES = {contract.FailureClass.CONFIG.value}


def classify(pod: observed.PodView, *, non_retryable: frozenset[int]) -> status.Cause:
    """Cause of one Failed pod, from its reason, exit code and the worker's JSON message."""
    said = pod.termination
    cls = said.kind
    codes = {c for c in (pod.exit_code, said.exit_code) if c is not None}
    if pod.reason == "OOMKilled" or cls == contract.FailureClass.OOM.value:
        return status.Cause.OOM
    if cls in _PERMANENT_CLASSES or int(contract.ExitCode.CONFIG_ERROR) in codes:
        return status.Cause.CONFIG_ERROR
    if codes & non_retryable:
        return status.Cause.NON_RETRYABLE
    if pod.disrupted or cls == contract.FailureClass.PREEMPTED.value:
        return status.Cause.EVICTED
    if cls == contract.FailureClass.HANG.value:
        return status.Cause.HANG
    if cls == contract.FailureClass.NODE_LOST.value:  # a spare took its place (gang.py)
        return status.Cause.NODE_LOST
    return status.Cause.CRASH


def _failure(
    cause: status.Cause, pod: observed.PodView | None, *, at: float, message: str = ""
) -> status.Failure:
    said = pod.termination if pod else observed.Termination()
    step, phase = said.step, said.phase
    memory = explain.memory_words(said.memory)
    if said.kind == contract.RecordClass.LIVE and pod is not None:  # killed without a word
        how = pod.reason or f"exit {pod.exit_code}"
        when = f"after step {step}" if step is not None else "before its first step"
        text = message or f"{how} in {phase or 'an unrecorded phase'} {when}"
        text += f" (last recorded: {memory})" if memory else ""
    else:
        text = message or said.words or (pod.message if pod else "")
    diagnosis = ""
    if cause is status.Cause.OOM:
        diagnosis = explain.oom_diagnosis(phase, step=step)
        if said.kind == contract.RecordClass.LIVE:  # sampled at the last phase change, not the kill
            diagnosis += f" (last recorded: {memory})" if diagnosis and memory else ""
        elif view := explain.allocator_words(said.memory, said.ledger):
            diagnosis += f" ({view})" if diagnosis else ""
    return status.Failure(
        cause=cause,
        rank=pod.rank if pod else None,
        pod=pod.name if pod else None,
        node=pod.node if pod else None,
        exit_code=pod.exit_code if pod else None,
        step=step,
        message=text[:1024],
        phase=phase[:256] if phase else None,
        diagnosis=diagnosis[:1024],
        time=at,
    )


def in_place_failure(obs: observed.Observed, record: observed.InPlaceRecord) -> status.Failure:
    """The failure behind a restart in place, from the record its node's keeper made
    (fsdp_worker.keeper.gang: the rank's termination message, torchrun's exit code, an OOM kill
    seen in the container's cgroup), judged as the same message on a Failed pod would be."""
    rank = record.node
    pod = next((p for p in obs.attempt_pods(obs.status.attempt) if p.rank == rank), None)
    if record.taken_over and pod is not None:
        # a takeover: the pod it replaced (lost or frozen), not the spare that holds the rank now
        pod = dataclasses.replace(pod, name=record.pod, node=record.node_name)
    view = observed.PodView(
        name=pod.name if pod else f"node rank {rank}",
        attempt=obs.status.attempt,
        rank=rank,
        phase=observed.PodPhase.FAILED,
        node=pod.node if pod else None,
        exit_code=record.exit_code,
        reason=record.reason,
        message=record.message,
        termination=record.termination,
    )
    codes = frozenset(obs.spec.failure_policy.non_retryable_exit_codes)
    when = record.time if record.time is not None else obs.now
    return _failure(classify(view, non_retryable=codes), view, at=min(when, obs.now))


def _evicted(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    for pod in pods:
        if pod.disrupted or (pod.deleting and pod.phase is not observed.PodPhase.SUCCEEDED):
            how = "evicted (DisruptionTarget)" if pod.disrupted else "deleted by someone else"
            return _failure(status.Cause.EVICTED, pod, at=obs.now, message=f"pod {pod.name} {how}")
    return None


def _node_lost(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    grace = obs.spec.failure_policy.node_loss_grace_seconds
    for pod in pods:
        if not pod.node or pod.phase in (observed.PodPhase.SUCCEEDED, observed.PodPhase.FAILED):
            continue
        node = obs.node(pod.node)
        if node is None:
            msg = f"node {pod.node} of pod {pod.name} no longer exists"
            return _failure(status.Cause.NODE_LOST, pod, at=obs.now, message=msg)
        silent = node.lease_silent_seconds
        if silent is not None and not _trained_since(obs, obs.now - silent):
            corroboration = _lease_corroborated(obs, pod)
            if corroboration:  # its last renewal is when it was lost
                msg = (
                    f"node {pod.node} of pod {pod.name} stopped renewing its Lease "
                    f"({silent:.0f}s) and {corroboration}"
                )
                return _failure(status.Cause.NODE_LOST, pod, at=obs.now - silent, message=msg)
        since = node.not_ready_since
        if not node.ready and since is not None and obs.now - since >= grace:
            msg = f"node {pod.node} of pod {pod.name} not Ready for {obs.now - since:.0f}s"
            return _failure(status.Cause.NODE_LOST, pod, at=since, message=msg)
    return None


def symptom(pod: observed.PodView) -> contract.Symptom | None:
    """How a Failed pod's ranks ended when it was only because another rank did (a peer gone,
    a collective timed out), by its own termination message; None: a cause of its own (its
    exception, an OOM kill, a rank killed without a word, a config error, its watchdog)."""
    if pod.reason == "OOMKilled":
        return None
    said = pod.termination
    if said.kind not in (contract.FailureClass.RUNTIME, contract.FailureClass.CHECKPOINT):
        return None
    return contract.symptom_of(said.words)


def _blame_order(obs: observed.Observed, pod: observed.PodView) -> tuple[bool, float, int]:
    """Causes before symptoms; then the earlier exit; then the lower node rank."""
    return (
        symptom(pod) is not None,
        pod.finished if pod.finished is not None else obs.now,
        pod.rank,
    )


def _lease_corroborated(obs: observed.Observed, pod: observed.PodView) -> str:
    """What corroborates a silent Lease under a job that made no step since it went silent
    ("" when nothing does yet): the ranks, where this attempt has stepped before (a gang whose
    node is gone stops stepping); before its first step, where keepers run
    (failurePolicy.inPlaceRestarts), the node's keeper (deadlines.keepers_vouch: a pod whose
    keeper still asks the coordinator lives, its kubelet only restarting, until the node is
    NotReady for nodeLossGraceSeconds, as for a job that trains on); without keepers, nothing
    else speaks for the node, and the Lease stands alone as it always did."""
    if deadlines.has_stepped(obs.status):
        return "the job made no step since"
    if not deadlines.keepers_vouch(obs):
        return "the job has made no step yet"
    gang = obs.gang
    if gang is None:
        return "the gang's coordinator has no address to ask"
    if not gang.answered:
        # The coordinator on a silent node is that node's keeper: its silence is the node's.
        # Elsewhere one unanswered ask (rank 0's node busy importing) says nothing of this
        # node: asked again in a second.
        if _coordinator_silent(obs):
            return f"the gang's coordinator did not answer ({gang.error})"
        return ""
    if pod.rank in gang.silent:
        return f"its keeper is silent too ({gang.silent[pod.rank]:.0f}s)"
    return ""


def _coordinator_silent(obs: observed.Observed) -> bool:
    """Whether node rank 0's pod, the gang's coordinator, is on a node silent on its Lease."""
    node0 = next((p for p in obs.attempt_pods(obs.status.attempt) if p.rank == 0), None)
    view = obs.node(node0.node) if node0 is not None and node0.node else None
    return view is not None and view.lease_silent_seconds is not None


def _trained_since(obs: observed.Observed, since: float) -> bool:
    """Whether the operator saw rank 0's step advance after `since` (a node's last Lease
    renewal). A kubelet that restarts, or is paused, stops renewing while its pods train on:
    Lease silence alone makes a node suspect, and the job's own progress (scraped every second
    while a node is suspect) says whether it is lost. A real loss stops the gang's steps (its
    collectives wait for the lost ranks), so the verdict comes as soon as the Lease is lost;
    a node NotReady past nodeLossGraceSeconds is lost whatever the job does."""
    seen = obs.status.last_progress_time
    if seen is None or not deadlines.has_stepped(obs.status):
        return False  # rank 0 serving the step it starts from is no step
    return seen > since and obs.now - seen <= deadlines.live_window(obs.status)


def _crashed(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    """The first failing pod by cause, not by clock: a pod whose ranks failed only because a
    peer did is never blamed while one with a cause of its own exists. Only symptoms so far,
    and pods still running: their cause may be a moment behind (the killed rank's pod exits
    after its peers noticed), so the verdict waits up to deadlines.SYMPTOM_GRACE_SECONDS."""
    failed = sorted(
        (p for p in pods if p.phase is observed.PodPhase.FAILED), key=lambda p: _blame_order(obs, p)
    )
    if not failed:
        return None
    first = failed[0]
    at = min(p.finished if p.finished is not None else obs.now for p in failed)
    if (
        symptom(first) is not None
        and deadlines.others_running(pods)
        and obs.now - at < deadlines.SYMPTOM_GRACE_SECONDS
    ):
        return None
    codes = frozenset(obs.spec.failure_policy.non_retryable_exit_codes)
    failure = _failure(classify(first, non_retryable=codes), first, at=at)
    said = [
        f"pod {p.name} (node rank {p.rank}): {symptom(p)}: {_words(p)}"
        for p in failed[1:]
        if symptom(p) is not None
    ]
    return (
        failure.model_copy(update={"symptoms": said[: status.SYMPTOMS_LIMIT]}) if said else failure
    )


def _words(pod: observed.PodView) -> str:
    return (pod.termination.words or pod.message)[:200]


def _vanished(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    if not obs.status.pods_created:
        return None
    present = {p.rank for p in pods}
    missing = [r for r in range(obs.status.replicas or 0) if r not in present]
    if not missing:
        return None
    failure = _failure(status.Cause.EVICTED, None, at=obs.now, message=f"ranks {missing} vanished")
    return failure.model_copy(update={"rank": missing[0]})


def _stuck_pending(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    started = deadlines.pending_since(obs.status)
    timeout = obs.spec.failure_policy.pending_timeout_seconds
    if started is None or obs.now - started < timeout:
        return None
    pending = [p for p in pods if p.phase is observed.PodPhase.PENDING and not p.gated]
    for pod in pending:
        if pod.image_error:
            msg = f"pod {pod.name}: {pod.image_error} for over {timeout}s"
            return _failure(status.Cause.IMAGE_PULL, pod, at=started + timeout, message=msg)
    stuck = scheduling.stuck(pending)
    if not stuck:
        return None
    said = scheduling.reason(stuck)
    msg = f"{len(stuck)} pod(s) unschedulable for over {timeout}s" + (f"; {said}" if said else "")
    blocker = scheduling.blocker(stuck)
    kind = scheduling.problem(blocker.scheduler_message) if blocker else None
    if blocker is not None and kind is scheduling.Problem.CLAIM_NOT_FOUND:
        # the spec's problem: a smaller gang names the same claim (no shrinking)
        msg += scheduling.advice(kind)
        return _failure(status.Cause.INVALID_SPEC, blocker, at=started + timeout, message=msg)
    return _failure(status.Cause.UNSCHEDULABLE, stuck[0], at=started + timeout, message=msg)


def _hung(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    if not pods or any(p.phase is not observed.PodPhase.RUNNING for p in pods):
        return None
    baseline = deadlines.progress_baseline(obs.status)
    deadline = obs.spec.failure_policy.progress_deadline_seconds
    if baseline is None:
        return None
    rank0 = next((p for p in pods if p.rank == 0), pods[0])
    early = frozen.suspect(obs)
    if early is not None:  # a spare can take its place now (frozen.py); the deadline is not due
        pod, words = early
        msg = f"no step progress for {obs.now - baseline:.0f}s (rank 0 at step {obs.status.step})"
        return _failure(status.Cause.HANG, pod, at=baseline, message=f"{msg}; {words}")
    scrape = obs.scrape
    window = deadlines.hang_window(obs.spec, obs.status, obs.gang)
    if (
        scrape is not None
        and scrape.blind
        and rank0.probe_failed
        and rank0.ready_changed is not None
        and rank0.ready_changed > baseline + 1.0
    ):
        # Blind, the operator never sees the first step and would wait the startup deadline;
        # rank 0 was Ready since its pods ran (a step, or its start, within its allowance) and
        # is no more: its probe has judged by the deadline that applies. (Its Ready condition
        # turns False at the pod's start, before it runs; a later change came after a True. The
        # second is for the node's clock against this one's.)
        window = min(window, deadline + deadlines.hang_grace(obs.spec, obs.gang))
    if obs.now - baseline < window:
        return None
    if scrape is None and not rank0.probe_failed:
        # This process has not scraped rank 0 yet: it has just started, or just taken the lead
        # (after a failover, or an API-server stall that outlasted its renew deadline), and the
        # status's last step is old news, not evidence. Its first scrape is due at once; rank
        # 0's readiness probe failing would be evidence (not Ready turned False by the node
        # lifecycle controller, which marks every pod of a node it has not heard from: after a
        # long stall it has not heard from any).
        return None
    if (
        scrape is not None
        and not scrape.blind
        and not scrape.answered
        and scrape.failures == 0
        and obs.status.last_progress_time is None
    ):
        # Reached, and refused every time: nothing serves on rank 0's metrics port. Its
        # training processes serve it once the gang has met (torchrun spawns them after every
        # node's agent joined the rendezvous; the kit serves after init_process_group), so the
        # gang never met: a name not yet resolvable, a node's network, not the user's code.
        # A last scrape that got no answer in time is not a refusal: a server that listens but
        # is slow on a loaded node, or a network that drops the scrapes (blind after a few):
        # no proof the gang never met, so the hang's rules judge it.
        msg = (
            f"the gang never met: rank 0 served nothing on {scrape.address} in "
            f"{obs.now - baseline:.0f}s of every pod running (last: {scrape.error}); the ranks'"
            " logs say where the rendezvous stopped"
        )
        return _failure(status.Cause.RENDEZVOUS, rank0, at=baseline, message=msg)
    if scrape is not None and scrape.blind:
        # The operator's scrapes get no answer (a NetworkPolicy, a slow network): its silence
        # is missing data, not evidence. The kubelet's readiness probe of rank 0, asked from
        # rank 0's own node, is: Ready means a step within the deadline.
        if rank0.ready or (rank0.ready is False and not rank0.probe_failed):
            return None  # Ready, or not Ready by the node controller's mark: no probe's verdict
        since = rank0.ready_changed
        at = baseline if since is None else max(baseline, since - deadline)
        startup = obs.spec.failure_policy.startup_deadline
        within = f"{deadline}s" if startup == deadline else f"{deadline}s ({startup}s to a first)"
        msg = (
            f"rank 0's readiness probe reports no step progress within {within} "
            f"(rank 0 at step {obs.status.step} when last scraped; the operator's scrape of "
            f"{scrape.address} gets no answer: {scrape.error})"
        )
        return _failure(status.Cause.HANG, rank0, at=at, message=msg)
    msg = f"no step progress for {obs.now - baseline:.0f}s (rank 0 at step {obs.status.step})"
    if obs.gang is not None and not obs.gang.restarting:
        msg += f"; not restarted in place: {obs.gang.why_not()}"
    # The job stopped being useful at its last progress; the deadline is the detection time.
    return _failure(status.Cause.HANG, rank0, at=baseline, message=msg)


def _stalled_exit(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    """A pod exited 0 while rank 0's runs on, past deadlines.EXIT_GRACE_SECONDS: the gang did not
    end together and rank 0 has not finished (hang judges only a gang whose pods all run)."""
    ended = deadlines.past_exit_grace(obs, pods)
    if ended is None or ended[0].phase is observed.PodPhase.SUCCEEDED:
        return None
    rank0, since = ended
    done = ", ".join(p.name for p in pods if p.phase is observed.PodPhase.SUCCEEDED)
    msg = (
        f"pod {done} exited 0 but rank 0's pod {rank0.name} still runs "
        f"{obs.now - since:.0f}s later (the gang ends together)"
    )
    return _failure(status.Cause.HANG, rank0, at=since, message=msg)


_CHECKS = (_evicted, _node_lost, _crashed, _vanished, _stuck_pending, _stalled_exit, _hung)


def detect(obs: observed.Observed) -> status.Failure | None:
    """The failure of the current attempt, or None while it is healthy (or finished well)."""
    pods = obs.attempt_pods(obs.status.attempt)
    for check in _CHECKS:
        failure = check(obs, pods)
        if failure is not None:
            return failure
    return None


def succeeded(obs: observed.Observed) -> bool:
    pods = obs.attempt_pods(obs.status.attempt)
    expected = obs.status.replicas or 0
    return len(pods) == expected > 0 and all(p.phase is observed.PodPhase.SUCCEEDED for p in pods)
