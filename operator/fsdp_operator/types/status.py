"""FSDPJob status: the model the operator writes (`FSDPJobStatus`), its phases, and every
part of it by name.

Everything the operator needs to resume its work after a restart lives here (plus pod labels),
so the models are the operator's memory. This module is the entry: its parts live beside it
(status_base.py: times, causes, the model base; status_history.py: failures, timelines and
the attempts' history; status_goodput.py: goodput and the failure record) and every name of
them is read as `status.<Name>`. Pure data: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import enum

from pydantic import Field

from fsdp_operator.types.status_base import (
    Budget,
    Cause,
    Time,
    _Model,
    budget_of,
    parse_rfc3339,
    rfc3339,
    unix_seconds,
)
from fsdp_operator.types.status_goodput import Goodput, Progress, Reliability
from fsdp_operator.types.status_history import (
    HISTORY_LIMIT,
    IN_PLACE_LIMIT,
    PHASES,
    SYMPTOMS_LIMIT,
    Failure,
    HistoryEntry,
    InPlaceRestart,
    Swap,
    Timeline,
    breakdown,
    complete,
    time_to_resume,
)
from fsdp_worker.contract import interval

# The status's every name, its parts' too: the rest of the operator reads them as `status.<Name>`.
__all__ = [
    "HISTORY_LIMIT",
    "IN_PLACE_LIMIT",
    "PHASES",
    "SYMPTOMS_LIMIT",
    "TERMINAL_PHASES",
    "Budget",
    "Cause",
    "CheckpointInterval",
    "CheckpointRef",
    "Condition",
    "ExcludedNode",
    "FSDPJobStatus",
    "Failure",
    "Goodput",
    "HistoryEntry",
    "InPlaceRestart",
    "MemoryTier",
    "Phase",
    "Progress",
    "QueueStatus",
    "Reliability",
    "Restarts",
    "SlowRank",
    "Spares",
    "Swap",
    "Time",
    "Timeline",
    "breakdown",
    "budget_of",
    "complete",
    "parse_rfc3339",
    "rfc3339",
    "time_to_resume",
    "unix_seconds",
]


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


CheckpointInterval = interval.Choice  # the interval the workers use now, and (auto) its inputs


class SlowRank(_Model):
    """The rank that holds the gang back, as rank 0 names it (telemetry/pace.py in the worker):
    its compute per step, over a window of steps, is at least 1.3 times the other ranks'
    median. With failurePolicy.swapSlowNodes and a running spare, a node slow for two of its
    verdicts in a row is swapped out (policy/straggler.py); otherwise reported only."""

    rank: int = Field(description="The slow rank's global rank.")
    pod: str = Field("", description="Its pod (empty: not seen this pass).")
    node: str = Field("", description="The node its pod runs on (empty: not known).")
    slowdown: float = Field(
        description="Its compute per step over the other ranks' median (2.0: half speed)."
    )
    since: Time = Field(description="When the operator first saw it named.")
    attempt: int = Field(description="The attempt it was named in (a new attempt clears it).")
    since_step: int | None = Field(
        None, description="The step the job had reached when it was first named (null: unknown)."
    )
    kept: str = Field(
        "",
        description="Why its node was not swapped out, once it had been slow long enough to be "
        "(no running spare on another node, failurePolicy.swapSlowNodes off, ...); empty: not "
        "yet.",
    )


class Condition(_Model):
    """A standard Kubernetes condition, as `kubectl wait --for=condition=...` reads it."""

    type: str = Field(
        description="Progressing (Pending, Running or Restarting), Suspended, Complete, Failed, "
        "Conflict (objects or checkpoints the job will not adopt block it), PodsScheduled "
        "(False: the scheduler's own reason why pods wait for a node), VolumeClaimShared (False: "
        "checkpoint.claimName is not ReadWriteMany under a gang on several nodes) or "
        "ReconcileError "
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
    progress: Progress | None = Field(
        None,
        description="How far the job is and when it should finish (null: no step known yet).",
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
    slow_rank: SlowRank | None = Field(
        None,
        description="The rank rank 0 names slow now, with its pod, node and slowdown (null: "
        "none; the SlowRank and SlowRankCleared Events say when it changed).",
    )
    suspect_nodes: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Nodes under the current attempt whose kubelet stopped renewing its Lease "
        "while the job trains on (a kubelet paused or restarting): not lost, watched. The "
        "NodeSuspect and NodeSuspectCleared Events say when each came and went.",
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
