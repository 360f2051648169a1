"""The operator <-> worker contract: environment names, exit codes, the termination message.

Torch-free: the operator imports it to build pods and to read failures. It must not import
torch or anything from the worker's training modules.

This package is the only part of the worker the operator imports (pyproject.toml's import
contracts): beside this module, the training config (config; its checkpoint part in
config_checkpoint, what both build on in config_base), the checkpoint catalog and its markers
(catalog), the one writer of a checkpoint root (fence), the checkpoint interval
(interval), the exit-code exceptions (errors), the keeper's wire (keeper), and how every env
and JSON document is parsed and written from its pydantic model (wire).
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from typing import Annotated

import pydantic
import pydantic.dataclasses

from fsdp_worker.contract import wire

CONTRACT_VERSION = 1
"""docs/contract.md's version: raised when a rank must act differently on what it is given or
say something new for the operator to keep working; an added optional field keeps it."""

# --- environment the operator sets on every worker pod ----------------------------------------
ENV_CONTRACT_VERSION = "FSDP_CONTRACT_VERSION"  # CONTRACT_VERSION of the operator that made it
ENV_JOB_NAME = "FSDP_JOB_NAME"
ENV_JOB_NAMESPACE = "FSDP_JOB_NAMESPACE"
ENV_JOB_UID = "FSDP_JOB_UID"  # the FSDPJob object's uid: recorded in every checkpoint marker
ENV_ATTEMPT = "FSDP_ATTEMPT"
ENV_CONFIG = "FSDP_WORKER_CONFIG"  # the WorkerConfig JSON document itself
ENV_CONFIG_FILE = "FSDP_WORKER_CONFIG_FILE"  # or a path to it (takes precedence)
ENV_RESUME = "FSDP_RESUME_FROM"  # "" (fresh), "auto", or a step directory path
ENV_GANG = "FSDP_GANG"  # restarts in place (gang.py): JSON, set only with inPlaceRestarts > 0
ENV_GENERATION = "FSDP_GENERATION"  # set by gang.py: 0, then 1, 2, ... after restarts in place
ENV_WARM_LAUNCH = "FSDP_WARM_LAUNCH"  # gang.py: seconds to the warm launcher (warm.py); 0: off
WARM_NOT_LAUNCHED = 2  # warm.py's exit code when it cannot run an argv as torchrun would
TORCHRUN_MODULE = ("-m", "torch.distributed.run")  # how the operator's argv starts torchrun
ENV_RESUME_RULES = "FSDP_RESUME_RULES"  # with "auto" on a restart: ResumeRules as JSON
ENV_CHECKPOINT_ROOT = "FSDP_CHECKPOINT_ROOT"  # overrides checkpoint.root
ENV_MEMORY_ROOT = "FSDP_MEMORY_ROOT"  # the pod's memory volume (checkpoint.memory), memtier.py
# TrainingConfig.resume_hash() of the job's spec: what every marker must record (the operator
# refuses checkpoints of another hash), so a trainer of the team's own records the same one.
ENV_CONFIG_HASH = "FSDP_CONFIG_HASH"
ENV_METRICS_PORT = "FSDP_METRICS_PORT"  # rank 0 serves Prometheus metrics here
ENV_TERMINATION_LOG = "FSDP_TERMINATION_LOG"  # defaults to /dev/termination-log
# JSON (interval.Reliability): the job's failures and uptime so far and its last measured save
# and step costs; set only for `intervalSteps: auto`, identical on every pod of an attempt.
ENV_RELIABILITY = "FSDP_RELIABILITY"
# The job's progressDeadlineSeconds: a rank that completes no step for this long prints its
# stacks and flight record (FSDP_EVIDENCE); it keeps running, the operator decides.
ENV_HANG_SECONDS = "FSDP_HANG_SECONDS"
# The job's startupDeadlineSeconds (default: FSDP_HANG_SECONDS): the allowance, in place of
# FSDP_HANG_SECONDS, from a rank's start to its first step (imports, rendezvous, loading).
ENV_STARTUP_SECONDS = "FSDP_STARTUP_SECONDS"
# The job's failurePolicy.hangStepTimes, set with restarts in place only: a rank whose collectives
# and steps stop for this many times its median step (at least FSDP_HANG_FLOOR_SECONDS), in
# a training phase, ends itself as a Hang long before FSDP_HANG_SECONDS (flight.fast_deadline).
ENV_HANG_STEP_TIMES = "FSDP_HANG_STEP_TIMES"
# ... and failurePolicy.hangFloorSeconds: the fast deadline is never shorter than this.
ENV_HANG_FLOOR_SECONDS = "FSDP_HANG_FLOOR_SECONDS"

# What `spec.trainer.args` may reference as `$(NAME)` (Kubernetes expands them in the pod);
# every other `$` in an argument reaches the trainer literally.
ARG_VARIABLES = (
    ENV_JOB_NAME,
    ENV_JOB_NAMESPACE,
    ENV_JOB_UID,
    ENV_ATTEMPT,
    ENV_CHECKPOINT_ROOT,
    ENV_RESUME,
    ENV_CONFIG_HASH,
)

DEFAULT_METRICS_PORT = 9400
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MEMORY_MOUNT = "/fsdp-memory"  # where the operator mounts checkpoint.memory's volume
MEMORY_STEP_KEY = "memoryStep"  # in a failing rank's termination message: the step memory holds
RESUME_AUTO = "auto"


Step = Annotated[int, pydantic.Field(ge=0)]
"""A training step on the wire: a whole number >= 0."""


@pydantic.dataclasses.dataclass(frozen=True, config=wire.CAMEL)
class ResumeRules:
    """The operator's rules for a rank that chooses its own resume point (``auto``): set on a
    restart the operator could not choose for, because it cannot read the job's checkpoints.

    The rank applies the lineage the operator would (the catalog's ``Lineage``: checkpoints of
    ``attempt``, and of earlier attempts only up to ``resumed_from_step``), and when nothing
    qualifies although a rank 0 reported ``expect_step`` sealed, it stops with a ConfigError
    instead of training again from step 0.
    """

    attempt: Step
    """The attempt whose end this restart follows."""
    resumed_from_step: Step | None = None
    """The step that attempt resumed from; None: it started fresh."""
    expect_step: Step | None = None
    """The newest step a rank 0 of this job reported sealed; None: none reported."""

    def to_json(self) -> str:
        return json.dumps(wire.to_doc(self), separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str) -> ResumeRules:
        """From ``to_json``'s document; ValueError names the field, the value and what is
        allowed."""
        return wire.parse(cls, raw, what=ENV_RESUME_RULES)


class Proof(enum.StrEnum):
    """What proves a `step-<N>` checkpoint complete (`spec.checkpoint.completion`)."""

    MARKER = "Marker"
    """`COMPLETE.json`, written last by a trainer that keeps this contract: manifest, lineage,
    config hash, job uid and data cursor are all checked."""
    DCP_METADATA = "DCPMetadata"
    """DCP's own `.metadata`, which its coordinator writes after every rank's files (the layout
    torchtitan writes): existence only. No manifest, lineage, config or data-cursor check."""


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
    HANG = "Hang"  # past its own FSDP_HANG_SECONDS with restarts in place: it ended itself
    NODE_LOST = "NodeLost"  # a spare took a lost node's place (gang.py's `replace`, the operator)
    KILLED = "Killed"  # a rank ended without a word; written by a sibling that saw it gone


class Symptom(enum.StrEnum):
    """How a rank that failed only because another one did ended: never the cause while a rank
    with a cause of its own exists (detect.py's verdict, the operator's Events)."""

    PEER_GONE = "PeerGone"  # a peer's socket closed or reset: it died, or its node went away
    COLLECTIVE_TIMEOUT = "CollectiveTimeout"  # a collective waited past its timeout for a peer


_PEER_GONE = re.compile(
    r"connection reset by peer|connection closed by peer|broken pipe|remote process exited"
    r"|peer closed|socket closed|communicator was aborted|connection was likely closed"
    r"|\bend of file\b|DistNetworkError|recvValue failed|the server socket has failed"
    r"|gloo/transport/tcp/pair\.cc.*(read|write) error|ECONNRESET|EPIPE",
    re.IGNORECASE,
)
_COLLECTIVE_TIMEOUT = re.compile(
    r"watchdog caught collective operation timeout|gloo.*timed out|timed out waiting \d+ ?ms"
    r"|ProcessGroupNCCL.*time(d )?out|DistStoreError.*time(d )?out|wait timeout after",
    re.IGNORECASE,
)


def symptom_of(message: str) -> Symptom | None:
    """The symptom a failing rank's own words show (a peer gone, a collective timed out), or
    None: its failure is its own (an exception of its code, an OOM, a config error)."""
    if _COLLECTIVE_TIMEOUT.search(message):
        return Symptom.COLLECTIVE_TIMEOUT
    if _PEER_GONE.search(message):
        return Symptom.PEER_GONE
    return None


class RecordClass(enum.StrEnum):
    """`class` of a termination record that reports no failure (FailureClass names those)."""

    LIVE = "Live"
    """The record the pod's first rank keeps in the termination-message file while it trains
    (`phase`, `step`, `memory`): what the kubelet reports when the rank is killed without a
    word (a kernel OOM kill). A failure's own message replaces it."""
    COMPLETED = "Completed"
    """The message global rank 0 leaves when the run succeeds: `step` is the last step it
    trained, `message` the JSON object {"sealedStep": N or null}, the newest checkpoint it
    sealed. Without it, an operator that reads no claim only knows its last scrape."""


EVIDENCE_PREFIX = "FSDP_EVIDENCE"
"""A rank's log line `FSDP_EVIDENCE {json}`: its flight record when it stopped stepping
(docs/contract.md, "Evidence"); the operator reads it before it deletes a hung gang."""


class _Record(pydantic.BaseModel):
    """A record a rank leaves for the operator: camelCase keys, read strictly and, being
    advice, never raising (`wire.validate_or_none`)."""

    model_config = pydantic.ConfigDict(**wire.CAMEL, frozen=True)


class Completion(_Record):
    """The `message` of a RecordClass.COMPLETED report: the newest checkpoint rank 0 sealed."""

    sealed_step: int | None = None


def completion_message(*, sealed_step: int | None) -> str:
    """The `message` of a COMPLETED report."""
    return json.dumps(wire.to_doc(Completion(sealed_step=sealed_step)))


def completion_sealed_step(message: object) -> int | None:
    """The sealed step a COMPLETED report's `message` carries; None when it says none or does
    not parse (a report is advice: it never raises)."""
    found = wire.parse_or_none(Completion, str(message or "{}"))
    return found.sealed_step if found is not None else None


NON_RETRYABLE_EXIT_CODES = frozenset({int(ExitCode.CONFIG_ERROR)})
TERMINATION_MESSAGE_MAX_BYTES = 4096  # Kubernetes truncates at 4096 per container

# --- Prometheus metrics served by rank 0 (the operator scrapes step and last-step time) --------
# Beside them, on the same port, rank 0 answers GET PROGRESS_PATH?within=S&startup=T: 200 while
# its last step is at most S seconds old (before the first step: its start at most T, default
# S), 503 after. The operator points
# rank 0's readinessProbe there: the kubelet asks from the pod's own node, so the evidence of a
# hang reaches the operator through the pod's Ready condition where a NetworkPolicy blocks its
# scrape (docs/contract.md, "Progress").
PROGRESS_PATH = "/progress"
METRIC_STEP = "fsdp_train_step"  # gauge: last completed optimizer step
METRIC_LAST_STEP_TIME = "fsdp_train_last_step_timestamp_seconds"  # gauge: unix time of it
METRIC_LOSS = "fsdp_train_loss"
METRIC_TOKENS_PER_SECOND = "fsdp_train_tokens_per_second"
METRIC_STEP_SECONDS = "fsdp_train_step_seconds"
METRIC_PEAK_MEMORY = "fsdp_train_peak_memory_bytes"
METRIC_CKPT_STEP = "fsdp_checkpoint_last_complete_step"
# gauge: the step this process resumed from, -1 when it started fresh (set before training)
METRIC_RESUMED_FROM = "fsdp_worker_resumed_from_step"
# gauge, label step: 1 for each step this process set aside under `auto` (failed verification),
# the newest QUARANTINED_SERIES of them: a label value per step, so bounded (the operator keeps
# the full list in status.quarantined, and the markers stay on storage)
METRIC_QUARANTINED = "fsdp_checkpoint_quarantined"
QUARANTINED_SERIES = 8
METRIC_CKPT_SAVE_SECONDS = "fsdp_checkpoint_save_seconds"  # label kind="blocking"|"total"
METRIC_CKPT_BYTES = "fsdp_checkpoint_bytes"
# Time to resume and goodput, the worker's side (this process only; rank 0's view):
METRIC_MILESTONE = "fsdp_worker_milestone_timestamp_seconds"  # label milestone=Milestone
# Counters: they only rise within a process, and a new process starts again at 0.
METRIC_STEPS_RUN = "fsdp_train_steps_run_total"  # optimizer steps this process completed
METRIC_STEP_SECONDS_SUM = "fsdp_train_seconds_total"  # seconds those steps took
METRIC_CKPT_BLOCKED = "fsdp_checkpoint_blocked_seconds_total"  # training blocked on saves
# Their names before 0.2 (gauges named like a summary's `_sum`, which Prometheus' own checks
# reject): still read from trainers built on an older kit.
LEGACY_METRIC_NAMES = {
    METRIC_STEPS_RUN: "fsdp_train_steps_run",
    METRIC_STEP_SECONDS_SUM: "fsdp_train_step_seconds_sum",
    METRIC_CKPT_BLOCKED: "fsdp_checkpoint_blocked_seconds_sum",
}
# Restarts in place (gang.py): this process's generation in its attempt (0 before any), and
# per earlier generation its failure, label record=<JSON object: the failing node's rank
# termination message plus node, torchrunExitCode, time, started, generation, reason>.
METRIC_GENERATION = "fsdp_worker_generation"
# The memory tier (memtier.py): 1 when this process resumed from memory, 0 from the claim or
# fresh; the newest step sealed in memory; steps between memory saves; the last one's seconds;
# the bytes of the previous node's rank this rank keeps (checkpoint.memory.peerCopy).
METRIC_RESUMED_FROM_MEMORY = "fsdp_worker_resumed_from_memory"
METRIC_MEMORY_STEP = "fsdp_checkpoint_memory_step"
METRIC_MEMORY_INTERVAL = "fsdp_checkpoint_memory_interval_steps"
METRIC_MEMORY_SAVE_SECONDS = "fsdp_checkpoint_memory_save_seconds"
METRIC_MEMORY_PEER_BYTES = "fsdp_checkpoint_memory_peer_copy_bytes"
METRIC_INTERVAL = "fsdp_checkpoint_interval_steps"  # gauge: steps between checkpoints now
METRIC_INTERVAL_INPUT = "fsdp_checkpoint_interval_input"  # label input=IntervalInput (auto)
# Stragglers (telemetry/pace.py), set every PACE_WINDOW_STEPS steps: per-rank compute and wait
# seconds per step, label rank=<the slowest few ranks' numbers, and "median">; the rank named
# slow (-1: none) and the slowest rank's compute over the median of the others'.
METRIC_RANK_COMPUTE = "fsdp_rank_step_compute_seconds"
METRIC_RANK_WAIT = "fsdp_rank_step_wait_seconds"
METRIC_SLOW_RANK = "fsdp_slow_rank"
METRIC_SLOW_RANK_SLOWDOWN = "fsdp_slow_rank_slowdown"
PACE_WINDOW_STEPS = 20  # steps per verdict: the operator counts a rank slow for two in a row
RANK_MEDIAN = "median"  # the label value of the gang's median in METRIC_RANK_COMPUTE/_WAIT


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
# ...and these optional ones: where the rank was (flight.Recorder.where), its memory figures,
# and the ledger's planned bytes per rank (persistentBytesPerRank, largestGatheredBytes).
# Global rank 0 adds `sums` (SUMS_KEYS): its run's totals, as its metrics count them, when it
# exits (well or not) and in its live record, so the steps after the operator's last scrape
# still count (goodput's `Other` had been up to a scrape interval an attempt). When it exits,
# `sums` also holds `milestones` ({Milestone: unix time} this process reached), so an attempt
# too short or too busy for the operator's scrapes still has its time to resume, and, once it
# loaded, `resumedFrom` (the step it loaded; -1: it started fresh) and `fromMemory`, so such an
# attempt still says which checkpoint it resumed from.
TERMINATION_OPTIONAL_KEYS = ("phase", "memory", "ledger", "sums")
SUMS = "sums"
SUMS_KEYS = ("stepsRun", "trainSeconds", "blockedSeconds")
SUMS_MILESTONES = "milestones"
SUMS_FINAL_KEYS = (SUMS_MILESTONES, "resumedFrom", "fromMemory")  # the final message's only


class TerminationMessage(_Record):
    """The JSON termination message (TERMINATION_KEYS), and the live record (RecordClass.LIVE)
    that holds its place while the rank trains. Any other key (TERMINATION_OPTIONAL_KEYS, the
    keeper's, a later release's) is kept as it came."""

    model_config = pydantic.ConfigDict(**wire.CAMEL, frozen=True, extra="allow")

    failure_class: str = pydantic.Field(alias="class")
    """A FailureClass or a RecordClass."""
    rank: int | None
    step: int | None
    exit_code: int | None
    message: str


def _reached(value: object) -> dict[str, float] | None:
    """The milestones this release knows, each at a unix time > 0; another (a later
    release's name) or a malformed one is left out, and none is None: a report is advice."""
    if not isinstance(value, dict):
        return None
    known = {m.value for m in Milestone}
    reached = {
        k: float(v)
        for k, v in value.items()
        if k in known and isinstance(v, int | float) and not isinstance(v, bool) and v > 0
    }
    return reached or None


Seconds = Annotated[float, pydantic.Field(ge=0)]


class RunSums(_Record):
    """The `sums` of a termination message or live record (SUMS_KEYS, and `milestones`)."""

    steps_run: Step
    train_seconds: Seconds
    blocked_seconds: Seconds
    milestones: Annotated[dict[str, float] | None, pydantic.BeforeValidator(_reached)] = None
    """Only the final message's: the live record's fixed size has no room to spare."""
    resumed_from: Annotated[int, pydantic.Field(ge=-1)] | None = None
    """The final message's, once the process loaded: the step it loaded, -1: none."""
    from_memory: bool | None = None
    """The final message's with resumed_from: whether that step came from the memory tier."""


def sums(
    *,
    steps_run: int,
    train_seconds: float,
    blocked_seconds: float,
    milestones: Mapping[str, float] | None = None,
    resumed_from: int | None = None,
    from_memory: bool = False,
) -> dict[str, object]:
    """The `sums` object of a termination message or live record (SUMS_FINAL_KEYS: only the
    final message's; the live record's fixed size has no room to spare). `resumed_from`: the
    step the process loaded (-1: it started fresh), None until it loaded."""
    record = RunSums(
        steps_run=steps_run,
        train_seconds=round(train_seconds, 3),
        blocked_seconds=round(blocked_seconds, 3),
        milestones={k: round(v, 3) for k, v in (milestones or {}).items()},
        resumed_from=resumed_from,
        from_memory=from_memory if resumed_from is not None else None,
    )
    return wire.to_doc(record, drop_none=set(SUMS_FINAL_KEYS))


def totals(doc: dict[str, object]) -> dict[str, object]:
    """A `sums` object without its milestones (the live record's)."""
    return {k: v for k, v in doc.items() if k in SUMS_KEYS}


def parse_milestones(doc: object) -> dict[str, float]:
    """The milestones a termination message's `sums` carries ({} when none or malformed: a
    report is advice, it never raises)."""
    found = doc.get(SUMS) if isinstance(doc, dict) else None
    return _reached(found.get(SUMS_MILESTONES) if isinstance(found, dict) else None) or {}


def parse_resumed(doc: object) -> tuple[int, bool] | None:
    """(the step loaded, -1: none; from memory) from a termination message's `sums`; None when
    it did not say (it never loaded, an older release) or said it malformed."""
    found = wire.validate_or_none(RunSums, doc.get(SUMS) if isinstance(doc, dict) else None)
    if found is None or found.resumed_from is None:
        return None
    return found.resumed_from, bool(found.from_memory)


def parse_sums(doc: object) -> tuple[int, float, float] | None:
    """(steps run, train seconds, blocked seconds) from a termination message's `sums`; None
    when absent or malformed (a report is advice: it never raises)."""
    found = wire.validate_or_none(RunSums, doc.get(SUMS) if isinstance(doc, dict) else None)
    if found is None:
        return None
    return found.steps_run, found.train_seconds, found.blocked_seconds
