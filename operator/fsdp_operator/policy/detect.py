"""Failure detection: did the running attempt fail, and why? A pure function of one observation.

Order matters and is the policy: someone else's eviction or deletion first, then a lost node
(its pods' own exits are symptoms), then the first failed pod by cause (a pod that failed only
because a peer did is a symptom, never the cause while another has one), then pods that
vanished, then pods stuck Pending (their scheduler's reason with them: scheduling.py), then a
hang. No I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import explain, scheduling
from fsdp_operator.types import api, observed, status
from fsdp_worker import contract

_PERMANENT_CLASSES = {contract.FailureClass.CONFIG.value}
IN_PLACE_HANG_GRACE_SECONDS = 15.0
"""With failurePolicy.inPlaceRestarts, the operator's hang comes this much later still: a
rank past its own deadline ends itself and its keeper restarts the gang in place (gang.py);
only a gang that cannot (every process frozen, a keeper gone) is recreated. Past the deadline
the operator asks the gang's coordinator (asks_the_gang): where a keeper has fallen silent, or
the coordinator itself, the hang is declared without this grace."""
LIVE_WINDOW_SECONDS = 3.0
"""A node that stopped renewing its Lease is lost unless the job stepped within this long (or
three of its steps): its gang trains on, so its kubelet is only paused or restarting."""
SYMPTOM_GRACE_SECONDS = 10.0
"""When every Failed pod failed only because a peer did and others still run, the verdict waits
this long from the first exit for a pod with a cause of its own (the killed rank's pod ends a
moment after its peers saw it go)."""
EXIT_GRACE_SECONDS = 90.0
"""How long a gang's other pods may run on once one exited 0. The keepers hold an exit barrier
of up to 60 s (the worker's gangstate.DOWN_TIMEOUT_SECONDS) so the pods end together; past
this, those still running did not get there (seen under load: node rank 1's pod ran on for
minutes after rank 0 sealed the last step and exited, and the job never finished)."""
HANG_EVIDENCE_GRACE_SECONDS = 2.0
"""Past the progress deadline, a hang is declared this much later: ranks print their evidence
at the deadline by their own clock (FSDP_HANG_SECONDS), and it is read before the teardown."""


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
            # Corroborated: its last renewal is when it was lost.
            msg = (
                f"node {pod.node} of pod {pod.name} stopped renewing its Lease ({silent:.0f}s) "
                "and the job made no step since"
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


def _trained_since(obs: observed.Observed, since: float) -> bool:
    """Whether the operator saw rank 0's step advance after `since` (a node's last Lease
    renewal). A kubelet that restarts, or is paused, stops renewing while its pods train on:
    Lease silence alone makes a node suspect, and the job's own progress (scraped every second
    while a node is suspect) says whether it is lost. A real loss stops the gang's steps (its
    collectives wait for the lost ranks), so the verdict comes as soon as the Lease is lost;
    a node NotReady past nodeLossGraceSeconds is lost whatever the job does."""
    seen = obs.status.last_progress_time
    return seen is not None and seen > since and obs.now - seen <= _live_window(obs.status)


def _live_window(s: status.FSDPJobStatus) -> float:
    """How long after its last step seen a gang still counts as training: three of its steps
    (rank 0's own figures), at least LIVE_WINDOW_SECONDS (rank 0 is scraped every second
    while a node is suspect)."""
    entry = s.history[-1] if s.history else None
    steps = entry.steps_run if entry is not None else None
    seconds = entry.train_seconds if entry is not None else None
    per_step = seconds / steps if steps and seconds else 0.0
    return max(LIVE_WINDOW_SECONDS, 3.0 * per_step)


def _crashed(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    """The first failing pod by cause, not by clock: a pod whose ranks failed only because a
    peer did is never blamed while one with a cause of its own exists. Only symptoms so far,
    and pods still running: their cause may be a moment behind (the killed rank's pod exits
    after its peers noticed), so the verdict waits up to SYMPTOM_GRACE_SECONDS."""
    failed = sorted(
        (p for p in pods if p.phase is observed.PodPhase.FAILED), key=lambda p: _blame_order(obs, p)
    )
    if not failed:
        return None
    first = failed[0]
    at = min(p.finished if p.finished is not None else obs.now for p in failed)
    if (
        symptom(first) is not None
        and _others_running(pods)
        and obs.now - at < SYMPTOM_GRACE_SECONDS
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


def _others_running(pods: list[observed.PodView]) -> bool:
    return any(p.phase in (observed.PodPhase.RUNNING, observed.PodPhase.PENDING) for p in pods)


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


def pending_since(s: status.FSDPJobStatus) -> float | None:
    """Since when the attempt's pods may be held Pending against them: their creation, or
    under a Kueue queue their admission (time waiting in a queue is not a failure)."""
    if s.queue is not None:
        return s.queue.admitted
    return s.attempt_started


def _stuck_pending(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    started = pending_since(obs.status)
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


def _progress_baseline(s: status.FSDPJobStatus) -> float | None:
    """Since when a step is due: the last progress, else the moment every pod ran (time spent
    Pending, pulling a large image, is not a hang), else the attempt's launch."""
    if s.last_progress_time is not None:
        return s.last_progress_time
    entry = s.history[-1] if s.history and s.history[-1].attempt == s.attempt else None
    running = entry.timeline.running if entry is not None and entry.timeline else None
    return running if running is not None else s.attempt_started


def hang_grace(spec: api.FSDPJobSpec, gang: observed.GangHealth | None = None) -> float:
    """Seconds past the progress deadline before the operator declares a hang: with restarts
    in place, time for the keepers to restart the ranks, unless their coordinator said they
    cannot (`gang`: a keeper silent, its pod frozen; the coordinator itself silent)."""
    waits = spec.failure_policy.in_place_restarts and (gang is None or gang.restarting)
    return HANG_EVIDENCE_GRACE_SECONDS + (IN_PLACE_HANG_GRACE_SECONDS if waits else 0.0)


MAX_STARTUP_DOUBLINGS = 3
"""A gang that did not meet in its deadline gets twice the time in the next attempt, up to 8x."""


def hang_window(
    spec: api.FSDPJobSpec, s: status.FSDPJobStatus, gang: observed.GangHealth | None = None
) -> float:
    """Seconds from the baseline to a hang verdict: the progress deadline and its grace; before
    an attempt's first step the startup deadline (startupDeadlineSeconds, default the progress
    deadline) and its grace, doubled for each attempt before it in a row whose gang never met
    (RendezvousTimeout), so that a start slower than the deadline (a cold torch import on a busy
    node, NCCL's init at scale) does not end every attempt the same way (seen in the goodput
    soak: 11 attempts in a row, 12 s each)."""
    if s.last_progress_time is not None:
        window = spec.failure_policy.progress_deadline_seconds + hang_grace(spec, gang)
        if s.step is not None and s.step >= spec.training.steps:
            # Past the last step only the final save and the exit remain, and no step comes to
            # show progress: they get the exit's grace (seen on a loaded node: the final save
            # and the keepers' exit barrier took 29 s, judged a hang at a 20 s deadline and
            # the finished gang recreated).
            window = max(window, EXIT_GRACE_SECONDS)
        return window
    deadline = float(spec.failure_policy.startup_deadline)
    window = deadline + hang_grace(spec, gang)
    missed = 0
    for entry in reversed([h for h in s.history if h.attempt < s.attempt]):
        if entry.failure is None or entry.failure.cause is not status.Cause.RENDEZVOUS:
            break
        missed += 1
    doublings: int = min(missed, MAX_STARTUP_DOUBLINGS)
    return window + deadline * ((1 << doublings) - 1)


def _hung(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    if not pods or any(p.phase is not observed.PodPhase.RUNNING for p in pods):
        return None
    baseline = _progress_baseline(obs.status)
    deadline = obs.spec.failure_policy.progress_deadline_seconds
    if baseline is None:
        return None
    rank0 = next((p for p in pods if p.rank == 0), pods[0])
    scrape = obs.scrape
    window = hang_window(obs.spec, obs.status, obs.gang)
    if (
        scrape is not None
        and scrape.blind
        and rank0.ready is False
        and rank0.ready_changed is not None
        and rank0.ready_changed > baseline + 1.0
    ):
        # Blind, the operator never sees the first step and would wait the startup deadline;
        # rank 0 was Ready since its pods ran (a step, or its start, within its allowance) and
        # is no more: its probe has judged by the deadline that applies. (Its Ready condition
        # turns False at the pod's start, before it runs; a later change came after a True. The
        # second is for the node's clock against this one's.)
        window = min(window, deadline + hang_grace(obs.spec, obs.gang))
    if obs.now - baseline < window:
        return None
    if scrape is None and rank0.ready is not False:
        # This process has not scraped rank 0 yet: it has just started, or just taken the lead
        # (after a failover, or an API-server stall that outlasted its renew deadline), and the
        # status's last step is old news, not evidence. Its first scrape is due at once; rank
        # 0's readiness probe failing would be evidence.
        return None
    if (
        scrape is not None
        and not scrape.blind
        and not scrape.answered
        and obs.status.last_progress_time is None
    ):
        # Reached, and refused every time: nothing serves on rank 0's metrics port. Its
        # training processes serve it once the gang has met (torchrun spawns them after every
        # node's agent joined the rendezvous; the kit serves after init_process_group), so the
        # gang never met: a name not yet resolvable, a node's network, not the user's code.
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
        if rank0.ready:
            return None
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


def _ended_well_since(pods: list[observed.PodView]) -> float | None:
    """When the first pod of the attempt exited 0, while others still run; else None."""
    ended = [p.finished for p in pods if p.phase is observed.PodPhase.SUCCEEDED and p.finished]
    if not ended or not _others_running(pods):
        return None
    return min(ended)


def lingering(obs: observed.Observed) -> list[observed.PodView]:
    """Rank 0's pod exited 0 (its trainer returned: the last checkpoint written and sealed,
    which needs every rank) EXIT_GRACE_SECONDS ago or more, and these pods still run: training
    is over and they did not end. The job has succeeded; they are deleted (decide)."""
    pods = obs.attempt_pods(obs.status.attempt)
    ended = _past_exit_grace(obs, pods)
    if ended is None or ended[0].phase is not observed.PodPhase.SUCCEEDED:
        return []
    return [p for p in pods if p.phase is not observed.PodPhase.SUCCEEDED]


def _past_exit_grace(
    obs: observed.Observed, pods: list[observed.PodView]
) -> tuple[observed.PodView, float] | None:
    """Rank 0's pod and when the first pod exited 0, once EXIT_GRACE_SECONDS have passed since
    with others still running; else None."""
    since = _ended_well_since(pods)
    rank0 = next((p for p in pods if p.rank == 0), None)
    if since is None or rank0 is None or obs.now - since < EXIT_GRACE_SECONDS:
        return None
    return rank0, since


def _stalled_exit(obs: observed.Observed, pods: list[observed.PodView]) -> status.Failure | None:
    """A pod exited 0 while rank 0's runs on, past EXIT_GRACE_SECONDS: the gang did not end
    together and rank 0 has not finished (hang judges only a gang whose pods all run)."""
    ended = _past_exit_grace(obs, pods)
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


def next_deadline(obs: observed.Observed) -> float | None:
    """The earliest future moment a check above could fire, so the loop wakes right then."""
    fp, s = obs.spec.failure_policy, obs.status
    pods = obs.attempt_pods(s.attempt)
    times: list[float] = []
    for pod in pods:
        node = obs.node(pod.node) if pod.node else None
        if node is not None and not node.ready and node.not_ready_since is not None:
            times.append(node.not_ready_since + fp.node_loss_grace_seconds)
    seen = s.last_progress_time
    if seen is not None and any(
        (n := obs.node(p.node)) is not None and n.lease_silent_seconds is not None
        for p in pods
        if p.node
    ):  # a silent Lease under a gang that trains: judged again when its steps would be late
        times.append(seen + _live_window(s))
    exits = [p.finished for p in pods if p.phase is observed.PodPhase.FAILED and p.finished]
    if exits and _others_running(pods):  # a symptom-only verdict waits this long at most
        times.append(min(exits) + SYMPTOM_GRACE_SECONDS)
    ended = _ended_well_since(pods)
    if ended is not None:  # pods that did not exit, or a stalled exit, are judged then
        times.append(ended + EXIT_GRACE_SECONDS)
    since = pending_since(s)
    if since is not None and any(p.phase is observed.PodPhase.PENDING for p in pods):
        times.append(since + fp.pending_timeout_seconds)
    baseline = _progress_baseline(s)
    if baseline is not None and pods and all(p.phase is observed.PodPhase.RUNNING for p in pods):
        times.append(baseline + hang_window(obs.spec, s))
        if fp.in_place_restarts:  # when to ask the keepers whether they restart in place
            times.append(baseline + hang_window(obs.spec, s, observed.GangHealth(False)))
    future = [t for t in times if t > obs.now]
    return min(future) if future else None


def asks_the_gang(obs: observed.Observed) -> str | None:
    """The coordinator's address (node rank 0's pod) when this pass should ask whether the
    keepers can restart the gang in place: a hang's deadline and evidence grace have passed
    and its in-place grace has not. None otherwise."""
    if not obs.spec.failure_policy.in_place_restarts:
        return None
    pods = obs.attempt_pods(obs.status.attempt)
    if not pods or any(p.phase is not observed.PodPhase.RUNNING for p in pods):
        return None
    baseline = _progress_baseline(obs.status)
    silent = observed.GangHealth(answered=False)
    if baseline is None or obs.now - baseline < hang_window(obs.spec, obs.status, silent):
        return None
    if obs.now - baseline >= hang_window(obs.spec, obs.status):
        return None  # past the grace: the hang is declared whatever they say
    node0 = next((p for p in pods if p.rank == 0), None)
    return None if node0 is None or not node0.ip else node0.ip
