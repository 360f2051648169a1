"""FSDPJob status: phases, failure causes and the status model the operator writes.

Everything the operator needs to resume its work after a restart lives here (plus pod labels),
so the models are the operator's memory. Pure data: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import enum

import pydantic
from pydantic import Field

from fsdp_worker import config as wconfig


class _Model(wconfig._Model):
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
    attempt: int
    world_size: int
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
    resume_path: str | None = None
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
    excluded_nodes: list[ExcludedNode] = Field(default_factory=list, max_length=64)
    quarantined: list[str] = Field(default_factory=list, max_length=64)
    conditions: list[Condition] = Field(default_factory=list, max_length=16)
