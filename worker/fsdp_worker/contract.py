"""The operator <-> worker contract: environment names, exit codes, the termination message.

Torch-free: the operator imports it to build pods and to read failures. It must not import
torch or anything from the worker's training modules.
"""

from __future__ import annotations

import enum

# --- environment the operator sets on every worker pod ----------------------------------------
ENV_JOB_NAME = "FSDP_JOB_NAME"
ENV_JOB_NAMESPACE = "FSDP_JOB_NAMESPACE"
ENV_JOB_UID = "FSDP_JOB_UID"  # the FSDPJob object's uid: recorded in every checkpoint marker
ENV_ATTEMPT = "FSDP_ATTEMPT"
ENV_CONFIG = "FSDP_WORKER_CONFIG"  # the WorkerConfig JSON document itself
ENV_CONFIG_FILE = "FSDP_WORKER_CONFIG_FILE"  # or a path to it (takes precedence)
ENV_RESUME = "FSDP_RESUME_FROM"  # "" (fresh), "auto", or a step directory path
ENV_CHECKPOINT_ROOT = "FSDP_CHECKPOINT_ROOT"  # overrides checkpoint.root
ENV_METRICS_PORT = "FSDP_METRICS_PORT"  # rank 0 serves Prometheus metrics here
ENV_TERMINATION_LOG = "FSDP_TERMINATION_LOG"  # defaults to /dev/termination-log
# JSON (interval.Reliability): the job's failures and uptime so far and its last measured save
# and step costs; set only for `intervalSteps: auto`, identical on every pod of an attempt.
ENV_RELIABILITY = "FSDP_RELIABILITY"

DEFAULT_METRICS_PORT = 9400
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
RESUME_AUTO = "auto"


class ExitCode(enum.IntEnum):
    """Documented worker exit codes (docs/worker.md has the table)."""

    SUCCESS = 0
    RETRYABLE = 1  # any runtime failure: restart from the newest complete checkpoint
    PREEMPTED = 143  # SIGTERM: a complete checkpoint was saved first, then exit (128 + 15)
    CONFIG_ERROR = 78  # permanent: the training config is invalid; restarting cannot help


class FailureClass(enum.StrEnum):
    """`class` field of the JSON termination message a failing rank writes."""

    CONFIG = "ConfigError"
    CHECKPOINT = "CheckpointError"
    RUNTIME = "RuntimeError"
    OOM = "OutOfMemory"
    PREEMPTED = "Preempted"


NON_RETRYABLE_EXIT_CODES = frozenset({int(ExitCode.CONFIG_ERROR)})
TERMINATION_MESSAGE_MAX_BYTES = 4096  # Kubernetes truncates at 4096 per container

# --- Prometheus metrics served by rank 0 (the operator scrapes step and last-step time) --------
METRIC_STEP = "fsdp_train_step"  # gauge: last completed optimizer step
METRIC_LAST_STEP_TIME = "fsdp_train_last_step_timestamp_seconds"  # gauge: unix time of it
METRIC_LOSS = "fsdp_train_loss"
METRIC_TOKENS_PER_SECOND = "fsdp_train_tokens_per_second"
METRIC_STEP_SECONDS = "fsdp_train_step_seconds"
METRIC_PEAK_MEMORY = "fsdp_train_peak_memory_bytes"
METRIC_CKPT_STEP = "fsdp_checkpoint_last_complete_step"
METRIC_CKPT_SAVE_SECONDS = "fsdp_checkpoint_save_seconds"  # label kind="blocking"|"total"
METRIC_CKPT_BYTES = "fsdp_checkpoint_bytes"
# Time to resume and goodput, the worker's side (this process only; rank 0's view):
METRIC_MILESTONE = "fsdp_worker_milestone_timestamp_seconds"  # label milestone=Milestone
METRIC_STEPS_RUN = "fsdp_train_steps_run"  # gauge: optimizer steps this process completed
METRIC_STEP_SECONDS_SUM = "fsdp_train_step_seconds_sum"  # gauge: seconds those steps took
METRIC_CKPT_BLOCKED = "fsdp_checkpoint_blocked_seconds_sum"  # gauge: training blocked on saves
METRIC_INTERVAL = "fsdp_checkpoint_interval_steps"  # gauge: steps between checkpoints now
METRIC_INTERVAL_INPUT = "fsdp_checkpoint_interval_input"  # label input=IntervalInput (auto)


class Milestone(enum.StrEnum):
    """Unix times rank 0 reports once per process: what the operator cannot see from pods."""

    RENDEZVOUS = "rendezvous"  # process group up (imports and torchrun rendezvous done)
    LOADED = "loaded"  # model built and the checkpoint loaded (or initialised fresh)
    FIRST_STEP = "first_step"  # the first optimizer step of this process completed


class IntervalInput(enum.StrEnum):
    SAVE_SECONDS = "save_seconds"  # blocking cost of one checkpoint (max over ranks)
    STEP_SECONDS = "step_seconds"  # one optimizer step
    MTBF_SECONDS = "mtbf_seconds"  # the job's mean time between failures, prior included
    FAILURES = "failures"  # failures the estimate has seen


# The termination message is one JSON object with these keys (all present, values may be null):
TERMINATION_KEYS = ("class", "rank", "step", "exitCode", "message")
