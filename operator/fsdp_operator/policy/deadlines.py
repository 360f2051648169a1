"""When a verdict on the running attempt falls due: the hang window (the progress and startup
deadlines and their graces), the exit grace of a gang whose pods end together, the Pending
clock, the live window of a node whose Lease went silent, and the earliest of them, so the
loop wakes right then.

Apart from detect.py (which failure, and why) because these rules say only how long: its
checks ask them whether their time has come, decide() asks next_deadline when to wake and
lingering which pods outlived the exit grace, and the pass asks asks_the_gang whether to talk to
the keepers. Pure arithmetic over the spec, the
status and one observation: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

from fsdp_operator.policy import frozen
from fsdp_operator.types import api, observed, status

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


def live_window(s: status.FSDPJobStatus) -> float:
    """How long after its last step seen a gang still counts as training: three of its steps
    (rank 0's own figures), at least LIVE_WINDOW_SECONDS (rank 0 is scraped every second
    while a node is suspect)."""
    entry = s.history[-1] if s.history else None
    steps = entry.steps_run if entry is not None else None
    seconds = entry.train_seconds if entry is not None else None
    per_step = seconds / steps if steps and seconds else 0.0
    return max(LIVE_WINDOW_SECONDS, 3.0 * per_step)


def others_running(pods: list[observed.PodView]) -> bool:
    return any(p.phase in (observed.PodPhase.RUNNING, observed.PodPhase.PENDING) for p in pods)


def pending_since(s: status.FSDPJobStatus) -> float | None:
    """Since when the attempt's pods may be held Pending against them: their creation, or
    under a Kueue queue their admission (time waiting in a queue is not a failure)."""
    if s.queue is not None:
        return s.queue.admitted
    return s.attempt_started


def progress_baseline(s: status.FSDPJobStatus) -> float | None:
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


def ended_well_since(pods: list[observed.PodView]) -> float | None:
    """When the first pod of the attempt exited 0, while others still run; else None."""
    ended = [p.finished for p in pods if p.phase is observed.PodPhase.SUCCEEDED and p.finished]
    if not ended or not others_running(pods):
        return None
    return min(ended)


def lingering(obs: observed.Observed) -> list[observed.PodView]:
    """Rank 0's pod exited 0 (its trainer returned: the last checkpoint written and sealed,
    which needs every rank) EXIT_GRACE_SECONDS ago or more, and these pods still run: training
    is over and they did not end. The job has succeeded; they are deleted (decide)."""
    pods = obs.attempt_pods(obs.status.attempt)
    ended = past_exit_grace(obs, pods)
    if ended is None or ended[0].phase is not observed.PodPhase.SUCCEEDED:
        return []
    return [p for p in pods if p.phase is not observed.PodPhase.SUCCEEDED]


def past_exit_grace(
    obs: observed.Observed, pods: list[observed.PodView]
) -> tuple[observed.PodView, float] | None:
    """Rank 0's pod and when the first pod exited 0, once EXIT_GRACE_SECONDS have passed since
    with others still running; else None."""
    since = ended_well_since(pods)
    rank0 = next((p for p in pods if p.rank == 0), None)
    if since is None or rank0 is None or obs.now - since < EXIT_GRACE_SECONDS:
        return None
    return rank0, since


KEEPER_RECHECK_SECONDS = 1.0
"""While a node's silent Lease waits on its keeper's word (keepers_vouch), the pass asks the
gang's coordinator again this often: a keeper silent for observed.GANG_SILENT_SECONDS
corroborates the loss."""


def has_stepped(s: status.FSDPJobStatus) -> bool:
    """Whether the running generation has made a step: the attempt's first step is in its
    timeline, or the operator saw rank 0's step pass the one it started from (a rank 0 that
    has not met or loaded yet may serve step 0, or the step it resumes from: no step made).
    After a restart in place the gang imports, meets and loads again: only a step past the
    one that generation resumed from, seen after the restart, counts."""
    entry = s.history[-1] if s.history and s.history[-1].attempt == s.attempt else None
    seen = s.last_progress_time if s.step is not None else None
    if entry is not None and entry.restarts_in_place:
        last = entry.restarts_in_place[-1]
        if last.resumed is not None:  # the next generation's first step, as its ranks said
            return True
        resumed, detected = last.resumed_from_step, last.detected
        after = seen is not None and (detected is None or seen > detected)
        return after and resumed is not None and (s.step or 0) > resumed
    if entry is not None and entry.timeline is not None and entry.timeline.first_step is not None:
        return True
    return seen is not None and (s.step or 0) > (s.resumed_from_step or 0)


def keepers_vouch(obs: observed.Observed) -> bool:
    """Whether a silent Lease is judged by the node's keeper: the job has keepers
    (failurePolicy.inPlaceRestarts) and the attempt has made no step, so its ranks cannot say
    whether the gang goes on (a kubelet restarted while the gang imports, meets or loads)."""
    return bool(obs.spec.failure_policy.in_place_restarts) and not has_stepped(obs.status)


def _leases_silent(obs: observed.Observed, pods: list[observed.PodView]) -> list[float]:
    """How long each live pod's node has been silent on its Lease (the silent ones)."""
    live = (observed.PodPhase.RUNNING, observed.PodPhase.PENDING)
    silent = (
        n.lease_silent_seconds
        for p in pods
        if p.node and p.phase in live and (n := obs.node(p.node)) is not None
    )
    return [t for t in silent if t is not None]


def next_deadline(obs: observed.Observed) -> float | None:
    """The earliest future moment a check of detect.py could fire, so the loop wakes right
    then."""
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
        times.append(seen + live_window(s))
    if keepers_vouch(obs) and _leases_silent(obs, pods):  # waits on its keeper: asked again
        times.append(obs.now + KEEPER_RECHECK_SECONDS)
    if fp.in_place_restarts and obs.spec.spares and seen is not None:  # frozen.py's early ask
        times.append(seen + frozen.SUSPECT_SECONDS)
        if frozen.watching(obs):
            times.append(obs.now + KEEPER_RECHECK_SECONDS)
    exits = [p.finished for p in pods if p.phase is observed.PodPhase.FAILED and p.finished]
    if exits and others_running(pods):  # a symptom-only verdict waits this long at most
        times.append(min(exits) + SYMPTOM_GRACE_SECONDS)
    ended = ended_well_since(pods)
    if ended is not None:  # pods that did not exit, or a stalled exit, are judged then
        times.append(ended + EXIT_GRACE_SECONDS)
    since = pending_since(s)
    if since is not None and any(p.phase is observed.PodPhase.PENDING for p in pods):
        times.append(since + fp.pending_timeout_seconds)
    baseline = progress_baseline(s)
    if baseline is not None and pods and all(p.phase is observed.PodPhase.RUNNING for p in pods):
        times.append(baseline + hang_window(obs.spec, s))
        if fp.in_place_restarts:  # when to ask the keepers whether they restart in place
            times.append(baseline + hang_window(obs.spec, s, observed.GangHealth(False)))
    future = [t for t in times if t > obs.now]
    return min(future) if future else None


def asks_the_gang(obs: observed.Observed) -> str | None:
    """The coordinator's address (node rank 0's pod) when this pass should ask the keepers:
    whether they can restart the gang in place (a hang's deadline and evidence grace have
    passed and its in-place grace has not), whether a node whose Lease went silent before
    the attempt's first step still has its keeper (keepers_vouch), or, with a spare standing
    by, which keeper fell silent when no step came for frozen.SUSPECT_SECONDS. None otherwise."""
    if not obs.spec.failure_policy.in_place_restarts:
        return None
    pods = obs.attempt_pods(obs.status.attempt)
    node0 = next((p for p in pods if p.rank == 0), None)
    coordinator = None if node0 is None or not node0.ip else node0.ip
    if keepers_vouch(obs) and _leases_silent(obs, pods):
        return coordinator  # a silent Lease before any step: does the node's keeper still ask?
    if not pods or any(p.phase is not observed.PodPhase.RUNNING for p in pods):
        return None
    if frozen.watching(obs):  # a spare stands by: who is silent, before the deadline?
        return coordinator
    baseline = progress_baseline(obs.status)
    silent = observed.GangHealth(answered=False)
    if baseline is None or obs.now - baseline < hang_window(obs.spec, obs.status, silent):
        return None
    if obs.now - baseline >= hang_window(obs.spec, obs.status):
        return None  # past the grace: the hang is declared whatever they say
    return coordinator
