"""FSDPJob status: phases, failure causes and the status model the operator writes.

Everything the operator needs to resume its work after a restart lives here (plus pod labels),
so the models are the operator's memory. Pure data: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from fsdp_worker import config, interval


class _Model(config._Model):
    """Status models are rebuilt each pass by decide(), so they are mutable copies."""

    model_config = pydantic.ConfigDict(frozen=False)


HISTORY_LIMIT = 20


class Phase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    SUSPENDED = "Suspended"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


class Cause(enum.StrEnum):
    """Why an attempt ended. Each cause is charged to one budget (see budget_of)."""

    CRASH = "Crash"  # a rank exited non-zero
    OOM = "OOMKilled"
    CONFIG_ERROR = "ConfigError"  # the worker said its config is invalid: permanent
    NON_RETRYABLE = "NonRetryableExitCode"
    NODE_LOST = "NodeLost"
    EVICTED = "Evicted"  # DisruptionTarget, or the pod vanished under us
    HANG = "Hang"  # progress deadline passed
    UNSCHEDULABLE = "Unschedulable"  # pending timeout: shrink
    IMAGE_PULL = "ImagePullError"  # pending with image errors: permanent
    RESIZE = "Resize"  # planned restart to grow back or apply a replicas edit
    DEADLINE = "DeadlineExceeded"
    SUSPENDED = "Suspended"  # spec.suspend: a planned stop
    CIRCUIT_BREAKER = "CircuitBreaker"  # too many restarts without a new checkpoint
    BUDGET = "RestartBudgetExhausted"
    INVALID_SPEC = "InvalidSpec"


class Budget(enum.StrEnum):
    APPLICATION = "application"
    INFRASTRUCTURE = "infrastructure"
    NONE = "none"  # planned restarts cost nothing


def budget_of(cause: Cause) -> Budget:
    if cause in (Cause.NODE_LOST, Cause.EVICTED, Cause.UNSCHEDULABLE):
        return Budget.INFRASTRUCTURE
    if cause in (Cause.RESIZE, Cause.SUSPENDED):
        return Budget.NONE
    return Budget.APPLICATION


class CheckpointRef(_Model):
    step: int
    path: str
    attempt: int | None = Field(
        None,
        description="The attempt that wrote it; null when its marker does not say "
        "(checkpoint.completion: DCPMetadata).",
    )
    world_size: int = Field(description="The world size that wrote it; 0: not known.")
    time: float | None = None


class Restarts(_Model):
    total: int = 0
    application: int = 0
    infrastructure: int = 0
    without_progress: int = Field(0, description="Restarts since the last new checkpoint.")


class Failure(_Model):
    cause: Cause
    rank: int | None = None
    pod: str | None = None
    node: str | None = None
    exit_code: int | None = None
    step: int | None = Field(None, description="The step the failing rank was at (its report).")
    message: str = Field("", max_length=4096)
    time: float


class Timeline(_Model):
    """How an attempt came to train: unix times in order, from its predecessor's stop (absent
    for the job's first attempt) to its own first step. Worker times are rank 0's report."""

    cause: Cause | None = Field(None, description="Why the previous attempt ended.")
    failed: float | None = Field(None, description="The previous attempt stopped being useful.")
    detected: float | None = None
    gang_gone: float | None = Field(None, description="No pod of an earlier attempt was left.")
    launched: float | None = Field(None, description="This attempt's pods were created.")
    scheduled: float | None = Field(None, description="Every pod was bound to a node.")
    running: float | None = Field(None, description="Every pod's container was running.")
    rendezvous: float | None = Field(None, description="Rank 0's process group was up.")
    loaded: float | None = Field(None, description="Model built, checkpoint loaded.")
    first_step: float | None = Field(None, description="The first optimizer step completed.")


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


class HistoryEntry(_Model):
    attempt: int
    started: float | None = None
    ended: float | None = None
    cause: Cause | None = None
    resumed_from_step: int | None = None
    steps_lost: int | None = None
    world_size: int
    detect_seconds: float | None = None
    recover_seconds: float | None = None
    timeline: Timeline | None = None
    steps_run: int | None = Field(None, description="Steps this attempt completed (rank 0).")
    train_seconds: float | None = Field(None, description="Seconds those steps took.")
    blocked_seconds: float | None = Field(None, description="Seconds blocked on saves.")


class Goodput(_Model):
    """Where the job's wall time went, since its first attempt was launched."""

    since: float
    wall_seconds: float = 0.0
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
    folded_lost_seconds: dict[str, float] = Field(default_factory=dict)
    folded_redone_seconds: float = 0.0


class Reliability(_Model):
    """The job's failure record, for `intervalSteps: auto` (beyond the history's limit)."""

    failures: int = Field(0, description="Unplanned attempt ends.")
    uptime_seconds: float = Field(0.0, description="Seconds attempts ran before they ended.")


CheckpointInterval = interval.Choice  # the interval the workers use now, and (auto) its inputs


class Condition(_Model):
    type: str
    status: str
    reason: str
    message: str = ""
    last_transition_time: str


class ExcludedNode(_Model):
    node: str
    until: float


class FSDPJobStatus(_Model):
    """`status` of an FSDPJob. Times are unix seconds (floats) unless they are conditions'."""

    phase: Phase = Phase.PENDING
    reason: str = ""
    message: str = ""
    observed_generation: int | None = None
    validated_generation: int | None = Field(
        None, description="Generation whose worker pod the API server accepted in a dry run."
    )
    attempt: int = 0
    replicas: int | None = Field(None, description="Pods in the current attempt.")
    world_size: int | None = Field(None, description="Ranks in the current attempt.")
    step: int | None = None
    last_progress_time: float | None = None
    attempt_started: float | None = None
    resumed_from_step: int | None = None
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
    next_attempt_at: float | None = Field(None, description="Backoff: next attempt not before.")
    failure_observed: float | None = Field(None, description="When the last teardown began.")
    drain: bool = Field(False, description="Wait for old pods to exit (they save on SIGTERM).")
    started: float | None = None
    finished: float | None = None
    last_checkpoint: CheckpointRef | None = None
    restarts: Restarts = Field(default_factory=Restarts)
    last_failure: Failure | None = None
    history: list[HistoryEntry] = Field(default_factory=list, max_length=HISTORY_LIMIT)
    next_timeline: Timeline | None = Field(
        None, description="Between an attempt's end and the next launch: its timeline so far."
    )
    goodput: Goodput | None = None
    reliability: Reliability = Field(default_factory=Reliability)
    checkpoint_interval: CheckpointInterval | None = None
    excluded_nodes: list[ExcludedNode] = Field(default_factory=list, max_length=64)
    quarantined: list[str] = Field(default_factory=list, max_length=64)
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
