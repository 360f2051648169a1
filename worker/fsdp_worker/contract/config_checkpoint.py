"""`spec.checkpoint` of an FSDPJob as the worker reads it: how often a checkpoint is saved (a
number of steps, or `auto`: the Young/Daly optimum, within autoInterval's bounds), how many are
kept, how they are written, the memory tier for restarts in place, and the export on success.

Apart from config.py (the training run, and the document joining both) because a checkpoint's
settings are their own world: none of them changes what a checkpoint means (TrainingConfig's
resume_hash leaves them out). The operator's spec.checkpoint (spec_checkpoint.py) extends
CheckpointConfig with where checkpoints live. Torch-free and numpy-free: the operator image
imports it. It must not read the clock, the environment or the disk.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import pydantic
from pydantic import Field

from fsdp_worker.contract.config_base import (
    QUANTITY_PATTERN,
    ConfigModel,
    SafePath,
    k8s_rules,
    quantity,
)

AUTO = "auto"
MAX_INTERVAL_STEPS = 100_000_000
# `intervalSteps`: a number of steps, or "auto". The CRD types it as Kubernetes' int-or-string.


def _interval_steps(value: Any) -> int | str:
    if value == AUTO:
        return AUTO
    number = value
    if isinstance(value, str) and value.strip().isdigit():
        number = int(value)
    whole = isinstance(number, int) and not isinstance(number, bool)
    if whole and 1 <= number <= MAX_INTERVAL_STEPS:
        return int(number)
    raise ValueError(
        f"must be a whole number of steps 1..{MAX_INTERVAL_STEPS} or {AUTO!r}, got {value!r}"
    )


IntervalSteps = Annotated[
    int | Literal["auto"],
    pydantic.PlainValidator(_interval_steps),
    pydantic.PlainSerializer(lambda v: v),
    pydantic.WithJsonSchema(
        {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
            "minimum": 1,
            "maximum": MAX_INTERVAL_STEPS,
            "pattern": f"^{AUTO}$",
            "description": "Save every N steps, or `auto`: the Young/Daly optimum from the "
            "measured save cost and the job's own failure rate (see autoInterval).",
        }
    ),
]


class AutoIntervalConfig(ConfigModel):
    """`checkpoint.autoInterval`: bounds and prior of `intervalSteps: auto`."""

    min_steps: int = Field(
        10,
        ge=1,
        le=MAX_INTERVAL_STEPS,
        description="Floor, and the first interval of a job with no measured save cost yet.",
    )
    max_steps: int = Field(100_000, ge=1, le=MAX_INTERVAL_STEPS, description="Ceiling.")
    prior_mtbf_seconds: float = Field(
        21600.0,
        gt=0,
        le=1e9,
        description="Mean time between failures assumed before the job has seen any: one "
        "failure-free prior period of this length joins the job's own uptime and failures.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=k8s_rules(
            ("self.minSteps <= self.maxSteps", "autoInterval.maxSteps must be >= minSteps")
        )
    )

    @pydantic.model_validator(mode="after")
    def _bounds(self) -> AutoIntervalConfig:
        if self.max_steps < self.min_steps:
            raise ValueError(
                f"autoInterval.maxSteps ({self.max_steps}) must be >= minSteps ({self.min_steps})"
            )
        return self


MEMORY_TIER_MIN = "16Mi"
"""The smallest `checkpoint.memory.sizeLimit`: DCP's metadata and two saves of a small model."""


class MemoryTierConfig(ConfigModel):
    """`checkpoint.memory`: a second checkpoint tier in the pods' memory (memtier.py)."""

    interval_steps: IntervalSteps = Field(
        "auto",
        description="Save to memory every N steps, or `auto`: the Young/Daly optimum from the "
        "measured memory save cost and every failure (a restart in place loads from memory); "
        "the claim's own intervalSteps: auto then counts only the failures that recreate the "
        "gang, the ones memory does not survive. The floor of auto here is 1 step.",
    )
    size_limit: str = Field(
        "1Gi",
        pattern=QUANTITY_PATTERN,
        max_length=64,
        description="Size of each worker pod's memory volume (an emptyDir, medium Memory, "
        "mounted at /fsdp-memory). It holds the newest step of the pod's ranks and the one "
        "being written: about twice their share of model and optimizer state, five times "
        "with peerCopy (when that does not fit, the copies are skipped and the ranks' log "
        "says so). It counts against the pod's memory. At least "
        f"{MEMORY_TIER_MIN}: below that no save fits, and a failed memory save ends the rank.",
        json_schema_extra=k8s_rules(
            (
                f"isQuantity(self) && quantity(self).compareTo(quantity('{MEMORY_TIER_MIN}')) >= 0",
                f"checkpoint.memory.sizeLimit must be a quantity of at least {MEMORY_TIER_MIN}"
                " (the memory tier holds two steps of each pod's share of the state)",
            )
        ),
    )

    peer_copy: bool = Field(
        True,
        description="Also keep each node's memory step on the next node (a ring over the "
        "gang's nodes, sent in the background after every memory save), so a pod that lost "
        "its memory (a node lost and a spare in its place, a pod recreated) gets its ranks' "
        "state back from that peer instead of the whole gang loading the claim. Costs memory "
        "(see sizeLimit: each node then keeps its two newest steps and the copies) and one "
        "transfer of each rank's state per memory save, off the training path unless the next "
        "save comes before it landed; needs two nodes or more. false: each node holds its own "
        "newest step only.",
    )

    @pydantic.field_validator("size_limit")
    @classmethod
    def _holds_a_save(cls, value: str) -> str:
        size = quantity(value)
        if size < quantity(MEMORY_TIER_MIN):
            raise ValueError(
                f"checkpoint.memory.sizeLimit={value!r} must be at least {MEMORY_TIER_MIN} "
                "(the memory tier holds two steps of each pod's share of the state; a "
                "failed memory save ends the rank)"
            )
        return value


class ExportFormat(enum.StrEnum):
    SAFETENSORS = "safetensors"


class ExportConfig(ConfigModel):
    """`checkpoint.export`: the trained model, written once more on success in a form usable
    without this project (checkpointing/export.py)."""

    format: ExportFormat = Field(
        ExportFormat.SAFETENSORS,
        description="safetensors: the model's full (unsharded) parameters and buffers, by their "
        "names in the model, in one Hugging Face safetensors file at "
        "<checkpoint root>/export/model.safetensors; export/COMPLETE.json is created last, "
        "only if absent.",
    )


class CheckpointConfig(ConfigModel):
    """`spec.checkpoint` of an FSDPJob."""

    root: SafePath = Field("/ckpt", description="Checkpoint directory on a shared volume.")
    interval_steps: IntervalSteps = Field(500)
    auto_interval: AutoIntervalConfig = Field(default_factory=AutoIntervalConfig)
    keep: int = Field(3, ge=1, le=1000, description="Complete checkpoints to retain.")
    async_: bool = Field(
        False,
        alias="async",
        description="Write checkpoints in the background while training goes on, one save at "
        "a time. Off: training waits for each save to finish.",
    )
    bands_per_rank: int = Field(
        4,
        ge=1,
        le=64,
        description="Files per rank: each rank writes its shard of every large tensor as this "
        "many runs of rows, one file each, so a load at another world size reads mostly its own "
        "files. 1 is DCP's one file per rank.",
    )
    min_band_bytes: int = Field(
        65536,
        ge=0,
        le=2**40,
        description="Smallest run of rows worth a band; smaller tensor shards stay whole.",
    )
    direct_writes: bool = Field(
        True,
        description="Write checkpoint files with O_DIRECT, around the page cache, where the "
        "file system allows it (else buffered). Durability is the same either way.",
    )
    memory: MemoryTierConfig | None = Field(
        None,
        description="A checkpoint tier in the pods' memory, for restarts in place "
        "(failurePolicy.inPlaceRestarts > 0): a restart at the same world size loads from "
        "memory when every rank holds the same sealed step, no older than the claim's newest. "
        "Unset: no memory tier.",
    )
    resume_from_previous_jobs: bool = Field(
        False,
        description="Also resume from complete checkpoints that an earlier FSDPJob of the same "
        "name (deleted, then created again) left in this job's checkpoint directory. Off: such "
        "checkpoints keep the job from starting (condition Conflict) rather than being resumed "
        "or overwritten by accident.",
    )
    export: ExportConfig | None = Field(
        None,
        description="When training completes, also write the model in a form usable without "
        "this project, beside the checkpoints (the claim's or the object store's). Rank 0 "
        "gathers the full model into its memory to write it. Unset: no export.",
    )
