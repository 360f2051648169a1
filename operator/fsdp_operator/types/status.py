"""FSDPJob status: phases, failure causes and the status model the operator writes.

Everything the operator needs to resume its work after a restart lives here (plus pod labels),
so the models are the operator's memory. Pure data: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import datetime
import enum
from typing import Annotated

import pydantic
from pydantic import Field

from fsdp_worker.contract import config, interval


def parse_rfc3339(value: str) -> float:
    """An RFC 3339 time (a status time, an object's timestamp) -> unix seconds."""
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 time") from None
    if at.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone (RFC 3339 needs Z or an offset)")
    return at.timestamp()


def unix_seconds(value: object) -> object:
    """A status time as the operator computes with it: unix seconds. The status says RFC 3339;
    a number (what operators before 0.2 wrote) is taken as it is, so an upgrade reads old
    status."""
    return parse_rfc3339(value) if isinstance(value, str) else value


def rfc3339(unix: float) -> str:
    """Unix seconds as Kubernetes writes a MicroTime: UTC, microseconds, `Z`."""
    at = datetime.datetime.fromtimestamp(unix, datetime.UTC)
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


# A point in time: a float in the operator's arithmetic, RFC 3339 in the status (as Kubernetes
# APIs write times; microseconds, as in a Lease's or an Event's MicroTime).
Time = Annotated[
    float,
    pydantic.BeforeValidator(unix_seconds),
    pydantic.PlainSerializer(rfc3339, return_type=str, when_used="json"),
    pydantic.WithJsonSchema({"type": "string", "format": "date-time"}),
]


class _Model(config._Model):
    """Status models are rebuilt each pass by decide(), so they are mutable copies."""

    model_config = pydantic.ConfigDict(frozen=False)


HISTORY_LIMIT = 20
IN_PLACE_LIMIT = 100  # failurePolicy.inPlaceRestarts' maximum


class Phase(enum.StrEnum):
    """Where an FSDPJob is in its life (status.phase)."""

    PENDING = "Pending"
    QUEUED = "Queued"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Cause(enum.StrEnum):
    """Why an attempt ended. Each cause is charged to one restart budget (budget_of)."""

    CRASH = "Crash"  # a rank exited non-zero
    OOM = "OOMKilled"
    CONFIG_ERROR = "ConfigError"  # the worker said its config is invalid: permanent
    NON_RETRYABLE = "NonRetryableExitCode"
    NODE_LOST = "NodeLost"
    EVICTED = "Evicted"  # DisruptionTarget, or the pod vanished under us
    HANG = "Hang"  # progress deadline passed
    # the deadline passed before rank 0 served at all: the gang never met (infrastructure)
    RENDEZVOUS = "RendezvousTimeout"
    UNSCHEDULABLE = "Unschedulable"  # pending timeout: shrink
    IMAGE_PULL = "ImagePullError"  # pending with image errors: permanent
    RESIZE = "Resize"  # planned restart to grow back or apply a replicas edit
    DEADLINE = "DeadlineExceeded"
    SUSPENDED = "Suspended"  # spec.suspend: a planned stop
    PREEMPTED = "Preempted"  # Kueue evicted the pod group (preemption): wait for re-admission
    CIRCUIT_BREAKER = "CircuitBreaker"  # too many restarts without a new checkpoint
    BUDGET = "RestartBudgetExhausted"
    INVALID_SPEC = "InvalidSpec"


class Budget(enum.StrEnum):
    APPLICATION = "application"
    INFRASTRUCTURE = "infrastructure"
    NONE = "none"  # planned restarts cost nothing


def budget_of(cause: Cause) -> Budget:
    if cause in (Cause.NODE_LOST, Cause.EVICTED, Cause.UNSCHEDULABLE, Cause.RENDEZVOUS):
        return Budget.INFRASTRUCTURE
    if cause in (Cause.RESIZE, Cause.SUSPENDED, Cause.PREEMPTED):
        return Budget.NONE
    return Budget.APPLICATION


class CheckpointRef(_Model):
    """A complete checkpoint: its step, where it is, and who wrote it when."""

    step: int = Field(description="The training step the checkpoint holds.")
    path: str = Field(
        description="Its step-<N> directory, as the worker pods see it (under checkpoint.root)."
    )
    attempt: int | None = Field(
        None,
        description="The attempt that wrote it; null when its marker does not say "
        "(checkpoint.completion: DCPMetadata).",
    )
    world_size: int = Field(description="The world size that wrote it; 0: not known.")
    time: Time | None = Field(
        None,
        description="When it was sealed: the time in its marker, the "
        "modification time of DCP's .metadata (checkpoint.completion: DCPMetadata), or, when "
        "the operator cannot read the checkpoints, when rank 0 reported it.",
    )


class Restarts(_Model):
    """Restarts so far, per budget. Planned restarts (a resize, spec.suspend) are not counted."""

    total: int = Field(0, description="Restarts charged to either budget.")
    application: int = Field(
        0,
        description="Restarts after the training failed (crash, OOM, hang, non-zero exit): "
        "failurePolicy.maxRestarts bounds them.",
    )
    infrastructure: int = Field(
        0,
        description="Restarts after the cluster failed the job (node lost, eviction or "
        "preemption, pods unschedulable, a gang that never met): failurePolicy.maxInfraRestarts "
        "bounds them.",
    )
    without_progress: int = Field(
        0,
        description="Application failures in a row whose attempt wrote no new checkpoint (any "
        "other failure sets it back to 0): failurePolicy.maxRestartsWithoutProgress bounds "
        "them, and backoff grows with them.",
    )


SYMPTOMS_LIMIT = 16


class Failure(_Model):
    """A failure the operator detected: what failed, where, and why."""

    cause: Cause = Field(
        description="Why the attempt failed, e.g. Crash, OOMKilled, NodeLost, Hang."
    )
    rank: int | None = Field(
        None, description="Node rank (pod index) of the failing pod; null: no single pod."
    )
    pod: str | None = Field(None, description="Name of the failing pod; null: no single pod.")
    node: str | None = Field(None, description="Node the failing pod ran on, if it was bound.")
    exit_code: int | None = Field(None, description="The failing container's exit code.")
    step: int | None = Field(None, description="The step the failing rank was at (its report).")
    message: str = Field(
        "",
        max_length=4096,
        description="What went wrong, in words: the failing rank's own message, else the pod's "
        "or the operator's (at most 1024 characters).",
    )
    phase: str | None = Field(
        None,
        description="Where the failing rank was, by its own record: e.g. 'backward of block 7', "
        "'checkpoint save', 'data loading'; null: it kept no record.",
    )
    diagnosis: str = Field(
        "",
        max_length=1024,
        description="The likely cause and the setting to try (an OOM's phase, a hang's odd rank "
        "out); empty when there is nothing to add to the message.",
    )
    evidence: str = Field(
        "",
        max_length=2048,
        description="Every rank's evidence compared before the pods were deleted: who is not "
        "where the others are (a hang), or what each pod's last record says.",
    )
    symptoms: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Other pods that failed only because the failing one did (a peer gone, a "
        "collective timed out), each with its own words: never the cause while a pod with a "
        "cause of its own exists.",
    )
    evidence_ref: str | None = Field(
        None,
        description="The ConfigMap (in the job's namespace) keeping this attempt's evidence "
        "and each pod's last log lines: `fsdpctl why` and `fsdpctl logs` read it.",
    )
    time: Time = Field(
        description="When the attempt stopped being useful: the pod's exit, "
        "the node going NotReady, the last step before a hang, or the end of the pending "
        "timeout (eviction, vanished pods: when the operator saw it).",
    )


class Timeline(_Model):
    """How an attempt came to train: times in order, from its predecessor's stop (absent
    for the job's first attempt) to its own first step. Worker times are rank 0's report."""

    cause: Cause | None = Field(None, description="Why the previous attempt ended.")
    failed: Time | None = Field(None, description="The previous attempt stopped being useful.")
    detected: Time | None = Field(None, description="The operator detected that end.")
    gang_gone: Time | None = Field(None, description="No pod of an earlier attempt was left.")
    launched: Time | None = Field(None, description="This attempt's pods were created.")
    admitted: Time | None = Field(
        None,
        description="Kueue admitted its pods (a job under a queue): the wait before it is the "
        "queue's, and goodput does not count it (lostSeconds.Queued, outside fraction).",
    )
    scheduled: Time | None = Field(None, description="Every pod was bound to a node.")
    running: Time | None = Field(None, description="Every pod's container was running.")
    rendezvous: Time | None = Field(None, description="Rank 0's process group was up.")
    loaded: Time | None = Field(None, description="Model built, checkpoint loaded.")
    first_step: Time | None = Field(None, description="The first optimizer step completed.")


# (phase, milestone it ends at): each phase runs from the previous milestone to its own, so the
# phases add up to the time to resume (failed -> first step) or, for a first attempt, to the
# time to start (launched -> first step).
PHASES: tuple[tuple[str, str], ...] = (
    ("detect", "detected"),
    ("teardown", "gang_gone"),
    ("schedule", "scheduled"),
    ("start", "running"),
    ("rendezvous", "rendezvous"),
    ("load", "loaded"),
    ("firstStep", "first_step"),
)


def breakdown(tl: Timeline) -> list[tuple[str, float | None]]:
    """Seconds per phase; None where its milestone is not known (a missing one's time joins the
    next phase). The phases add up to the time to resume.

    The operator sees pods bound and running on its passes, so those times are upper bounds,
    while rank 0 stamps its own milestones. A milestone stamped later than the one after it
    therefore happened no later than that one: it is moved back to it. Phases never overlap
    and never go negative (new pods bound while old ones still terminate: schedule is 0)."""
    phases = PHASES if tl.failed is not None else PHASES[2:]
    start = tl.failed if tl.failed is not None else tl.launched
    times: list[float | None] = [getattr(tl, milestone) for _, milestone in phases]
    bound: float | None = None
    for i in reversed(range(len(times))):
        at = times[i]
        if at is not None:
            times[i] = at if bound is None else min(at, bound)
            bound = times[i]
    out: list[tuple[str, float | None]] = []
    last = start
    for (phase, _), at in zip(phases, times, strict=True):
        if at is None or last is None:
            out.append((phase, None))
            continue
        at = max(at, last)
        out.append((phase, at - last))
        last = at
    return out


def complete(tl: Timeline) -> bool:
    """Training again, and (after a failure) the old gang gone: nothing more will be learned."""
    return tl.first_step is not None and (tl.failed is None or tl.gang_gone is not None)


def time_to_resume(tl: Timeline) -> float | None:
    start = tl.failed if tl.failed is not None else tl.launched
    if start is None or tl.first_step is None:
        return None
    return max(0.0, tl.first_step - start)


class InPlaceRestart(_Model):
    """A rank failure the attempt's pods restarted from without being recreated
    (failurePolicy.inPlaceRestarts): every rank of the gang started again in its pod."""

    generation: int = Field(description="The generation that failed (0: the attempt's first).")
    failure: Failure = Field(description="Its first failure, as its rank reported it.")
    detected: Time | None = Field(
        None, description="When the operator judged the node lost (a spare's takeover only)."
    )
    rendezvous: Time | None = Field(
        None,
        description="The next generation's process group up (from the failure: the ranks "
        "killed, torchrun and the ranks started, imports, rendezvous).",
    )
    loaded: Time | None = Field(
        None, description="The next generation's checkpoint loaded (from memory or the claim)."
    )
    resumed: Time | None = Field(
        None, description="The next generation's first step (null: not trained yet)."
    )
    resumed_from_step: int | None = Field(
        None, description="The checkpoint step the next generation loaded (-1: none)."
    )
    from_memory: bool | None = Field(
        None,
        description="true: it loaded that step from the pods' memory (checkpoint.memory), "
        "false: from the claim; null: not reported yet.",
    )
    steps_lost: int | None = Field(None, description="Steps trained again after it.")
    steps_run: int = Field(0, description="Steps the failed generation completed (rank 0).")
    train_seconds: float = Field(0.0, description="Seconds those steps took.")
    blocked_seconds: float = Field(0.0, description="Seconds it was blocked on saves.")


class Spares(_Model):
    """spec.spares of the current attempt: what stands by, and what was used."""

    wanted: int = Field(0, description="spec.spares.")
    running: int = Field(0, description="Spare pods running now (warm, or warming).")
    pending: int = Field(0, description="Spare pods not running yet (scheduling, starting).")
    takeovers: int = Field(
        0, description="Lost nodes and frozen pods a spare took the place of, in all."
    )
    next_index: int = Field(0, description="The number the next spare pod of this attempt gets.")
    last_created: Time | None = Field(None, description="When spare pods were last made.")
    replaced: list[str] = Field(
        default_factory=list,
        max_length=8,
        description="Lost or frozen pods a spare took the place of.",
    )
    refused: str = Field(
        "", description="The pod whose takeover failed: the gang is recreated for it."
    )


class MemoryTier(_Model):
    """checkpoint.memory as rank 0 reports it: the steps between saves to the pods' memory, what
    the last one blocked training, and the newest step sealed there."""

    interval_steps: int = Field(description="Steps between memory saves now (auto: chosen).")
    save_seconds: float | None = Field(
        None, description="Seconds the last memory save blocked training (null: none yet)."
    )
    sealed_step: int | None = Field(
        None, description="Newest step sealed in memory by this attempt (null: none yet)."
    )


class HistoryEntry(_Model):
    """One attempt: a launch of the whole gang of worker pods, and how it ended."""

    attempt: int = Field(description="The attempt's number (1 for the first).")
    started: Time | None = Field(None, description="When its pods were created.")
    ended: Time | None = Field(
        None,
        description="When the operator ended it; null while it runs, and for an "
        "attempt that completed the training.",
    )
    cause: Cause | None = Field(
        None,
        description="Why it ended (Resize and Suspended are planned stops); null like ended.",
    )
    resumed_from_step: int | None = Field(
        None,
        description="The checkpoint step it loaded; null: it started from scratch, or its pods "
        "chose the checkpoint and have not reported it yet.",
    )
    steps_lost: int | None = Field(
        None,
        description="Steps it trained past the checkpoint the next attempt resumed from: work "
        "done again. Known when the next attempt launches.",
    )
    world_size: int = Field(description="Ranks: pods x nprocPerNode.")
    detect_seconds: float | None = Field(
        None,
        description="Seconds from its failure to the operator detecting it; null for planned "
        "stops and for attempts that ended with the job.",
    )
    recover_seconds: float | None = Field(
        None,
        description="Seconds from the teardown of the attempt before it to all its own pods "
        "running; null for the first attempt.",
    )
    timeline: Timeline | None = Field(
        None,
        description="How it came to train: times from the previous attempt's stop (absent "
        "for the first attempt) to its own first step. Worker times are rank 0's report.",
    )
    failure: Failure | None = Field(
        None,
        description="The failure that ended it, as lastFailure said then (null: it did not fail).",
    )
    steps_run: int | None = Field(None, description="Steps this attempt completed (rank 0).")
    train_seconds: float | None = Field(None, description="Seconds those steps took.")
    blocked_seconds: float | None = Field(None, description="Seconds blocked on saves.")
    restarts_in_place: list[InPlaceRestart] = Field(
        default_factory=list,
        max_length=IN_PLACE_LIMIT,
        description="Rank failures it restarted from inside its pods, oldest first.",
    )


class Goodput(_Model):
    """Where the job's wall time went, since its first attempt was launched."""

    since: Time = Field(description="When the first attempt was launched.")
    wall_seconds: float = Field(
        0.0, description="Seconds from since to now, or to the job's finish."
    )
    productive_seconds: float = Field(0.0, description="Steps that count: not redone.")
    fraction: float = Field(0.0, description="productiveSeconds / wallSeconds.")
    lost_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="By cause: Startup (first attempt to its first step), CheckpointSave "
        "(training blocked on saves), each failure cause (recovery to the next first step, plus "
        "steps redone), Other (what no measurement explains: scrape gaps, logging).",
    )
    redone_seconds: float = Field(0.0, description="Part of lostSeconds: steps computed again.")
    folded_productive_seconds: float = Field(
        0.0, description="Of attempts no longer in history (its limit): kept as totals."
    )
    folded_lost_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="lostSeconds by cause of attempts no longer in history, kept as totals.",
    )
    folded_redone_seconds: float = Field(
        0.0, description="redoneSeconds of attempts no longer in history, kept as a total."
    )


class Reliability(_Model):
    """The job's failure record, for `intervalSteps: auto` (beyond the history's limit)."""

    failures: int = Field(0, description="Unplanned attempt ends and restarts in place.")
    gang_failures: int = Field(
        0, description="Of those, the ones that recreated the gang (no memory tier survives)."
    )
    uptime_seconds: float = Field(0.0, description="Seconds attempts ran before they ended.")


CheckpointInterval = interval.Choice  # the interval the workers use now, and (auto) its inputs


class Condition(_Model):
    """A standard Kubernetes condition, as `kubectl wait --for=condition=...` reads it."""

    type: str = Field(
        description="Progressing (Pending, Running or Restarting), Suspended, Complete, Failed, "
        "Conflict (objects or checkpoints the job will not adopt block it) or ReconcileError "
        "(the operator's last pass over the job failed)."
    )
    status: str = Field(description='"True" or "False".')
    reason: str = Field(description="Why, in one CamelCase word.")
    message: str = Field("", description="Details, in words.")
    last_transition_time: str = Field(
        description="When status last changed (RFC 3339, UTC, whole seconds)."
    )
    observed_generation: int | None = Field(
        None,
        description="The metadata.generation of the spec this condition was set for: older "
        "than the job's generation means the operator has not acted on the newest spec yet.",
    )


class ExcludedNode(_Model):
    """A node kept out of new attempts after it was lost under one."""

    node: str = Field(description="The node's name.")
    until: Time = Field(description="New attempts avoid it until this time.")


class QueueStatus(_Model):
    """Kueue's admission of the current attempt's pods (a job labelled
    kueue.x-k8s.io/queue-name)."""

    name: str = Field(description="The LocalQueue the job waits in.")
    pod_group: str = Field(description="The pods' Kueue pod group: its Workload's name.")
    admitted: Time | None = Field(
        None,
        description="When the operator saw the attempt's pods ungated (admitted); "
        "failurePolicy.pendingTimeoutSeconds counts from it.",
    )
    queued_seconds: float | None = Field(
        None, description="How long the attempt waited for admission."
    )


class FSDPJobStatus(_Model):
    """`status` of an FSDPJob. Times are RFC 3339, UTC, to the microsecond; durations seconds."""

    phase: Phase = Field(
        Phase.PENDING,
        description="Pending (the first attempt, or the first after a suspension, is starting), "
        "Queued (its pods wait for Kueue to admit them), Running (every pod of the attempt is "
        "running), Restarting (an attempt ended and the next one is on its way), Suspended "
        "(spec.suspend), Succeeded or Failed (final).",
    )
    reason: str = Field(
        "",
        description="Why the job is in its phase, in one CamelCase word: for Restarting and "
        "Failed the cause (e.g. Crash, NodeLost, RestartBudgetExhausted), else e.g. Created or "
        "AllPodsRunning.",
    )
    message: str = Field("", description="Details of the phase, in words.")
    observed_generation: int | None = Field(
        None, description="The metadata.generation of the spec the operator last acted on."
    )
    validated_generation: int | None = Field(
        None, description="Generation whose worker pod the API server accepted in a dry run."
    )
    attempt: int = Field(
        0, description="Number of the current (or last) attempt; 0 before the first launch."
    )
    replicas: int | None = Field(None, description="Pods in the current attempt.")
    world_size: int | None = Field(None, description="Ranks in the current attempt.")
    step: int | None = Field(
        None,
        description="Last completed training step, as rank 0 reported it or a checkpoint proves.",
    )
    last_progress_time: Time | None = Field(
        None,
        description="When the operator last saw step advance in this attempt; "
        "failurePolicy.progressDeadlineSeconds counts from it.",
    )
    attempt_started: Time | None = Field(
        None, description="When the current attempt's pods were created."
    )
    resumed_from_step: int | None = Field(
        None,
        description="The checkpoint step the current attempt loaded; null: from scratch, or "
        "its pods chose the checkpoint and have not reported it yet.",
    )
    resume_path: str | None = Field(
        None, description='The checkpoint the attempt loads; "auto": its pods choose (rules).'
    )
    resume_rules: str | None = Field(
        None, description="FSDP_RESUME_RULES of the attempt's pods when they choose (auto)."
    )
    sealed_step: int | None = Field(
        None,
        description="The newest checkpoint step this job sealed, as a rank 0 reported it or "
        "the operator read it: a restart must find it or an older one, never start at step 0.",
    )
    pods_created: bool = Field(False, description="Every pod of the attempt was seen once.")
    queue: QueueStatus | None = Field(
        None, description="Kueue's admission of the current attempt; null without a queue."
    )
    next_attempt_at: Time | None = Field(None, description="Backoff: next attempt not before.")
    failure_observed: Time | None = Field(None, description="When the last teardown began.")
    drain: bool = Field(False, description="Wait for old pods to exit (they save on SIGTERM).")
    started: Time | None = Field(
        None,
        description="When the job started, or last resumed from suspension: "
        "activeDeadlineSeconds counts from it.",
    )
    finished: Time | None = Field(
        None,
        description="When the job Succeeded or Failed; ttlSecondsAfterFinished " "counts from it.",
    )
    last_checkpoint: CheckpointRef | None = Field(
        None,
        description="The newest complete checkpoint: the one the next attempt resumes from.",
    )
    restarts: Restarts = Field(default_factory=Restarts, description="Restarts so far, per budget.")
    last_failure: Failure | None = Field(
        None, description="The most recent failure the operator detected."
    )
    history: list[HistoryEntry] = Field(
        default_factory=list,
        max_length=HISTORY_LIMIT,
        description=f"The job's attempts, oldest first; the newest {HISTORY_LIMIT} are kept "
        "(goodput keeps the totals of older ones).",
    )
    next_timeline: Timeline | None = Field(
        None, description="Between an attempt's end and the next launch: its timeline so far."
    )
    goodput: Goodput | None = Field(
        None,
        description="Where the job's wall time went since its first launch: productive steps, "
        "and time lost by cause.",
    )
    reliability: Reliability = Field(
        default_factory=Reliability,
        description="The job's failure record, for checkpoint.intervalSteps: auto.",
    )
    spares: Spares | None = Field(
        None, description="spec.spares: the current attempt's warm spares (null: none wanted)."
    )
    checkpoint_interval: CheckpointInterval | None = Field(
        None,
        description="The checkpoint interval rank 0 uses now and, with intervalSteps: auto, "
        "the figures it was chosen from.",
    )
    memory_tier: MemoryTier | None = Field(
        None,
        description="checkpoint.memory's interval and last save, as rank 0 reports them (null: "
        "no memory tier, or not reported yet).",
    )
    excluded_nodes: list[ExcludedNode] = Field(
        default_factory=list,
        max_length=64,
        description="Nodes lost under an attempt: new attempts are not scheduled on them for a "
        "while (an operator setting, 5 minutes by default).",
    )
    quarantined: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Checkpoint directories that failed verification, newest 64: never resumed "
        "from.",
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        max_length=16,
        description="Standard Kubernetes conditions, one per type.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
