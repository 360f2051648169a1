"""The training-config document: the one contract between an FSDPJob spec and its workers.

The operator embeds `TrainingConfig` in the FSDPJob spec (the CRD's `spec.training` schema is
generated from it) and hands `WorkerConfig` to every rank as one JSON document. Torch-free and
numpy-free by design: the operator image imports this module. It must not read the clock, the
environment or the disk.
"""

from __future__ import annotations

import decimal
import enum
import hashlib
import json
import re
from typing import Annotated, Any, Literal

import pydantic
import pydantic.alias_generators
from pydantic import Field

# Names a user may put in a config that later become paths or module references are restricted
# to these shapes so that nothing can smuggle `$(VAR)` expansion, shell syntax or `..`.
FACTORY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
SAFE_PATH_PATTERN = r"^/([A-Za-z0-9._-]+/?)*$"
MAX_PATH_LENGTH = 255


class _Model(pydantic.BaseModel):
    """Base for config models: camelCase on the wire, unknown fields are errors."""

    model_config = pydantic.ConfigDict(
        alias_generator=pydantic.alias_generators.to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )


class ModelPreset(enum.StrEnum):
    """Built-in decoder-only transformer sizes."""

    TINY = "tiny"  # CPU tests: a few thousand parameters per block
    SMALL = "small"  # CPU demo and benchmarks
    B1 = "1b"
    B7 = "7b"
    CUSTOM = "custom"  # dim/layers/heads taken from the fields below


class DataKind(enum.StrEnum):
    SYNTHETIC = "synthetic"
    TOKEN_FILE = "tokenFile"  # noqa: S105 (not a secret)


class Precision(enum.StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"


class SchedulerKind(enum.StrEnum):
    CONSTANT = "constant"
    COSINE = "cosine"


def k8s_rules(*rules: tuple[str, ...]) -> dict[str, Any]:
    """CEL rules (rule, message[, fieldPath]) for the generated CRD.

    The Python validators below enforce the same rules for the operator and the worker.
    """
    out = []
    for rule in rules:
        doc = {"rule": rule[0], "message": rule[1]}
        if len(rule) > 2:
            doc["fieldPath"] = rule[2]
        out.append(doc)
    return {"x-kubernetes-validations": out}


def _no_dotdot(value: str | None) -> str | None:
    if value is not None and any(part == ".." for part in value.split("/")):
        raise ValueError(f"path {value!r} must not contain '..'")
    if value == "/":
        raise ValueError("path must not be '/'")
    return value


SafePath = Annotated[
    str,
    Field(
        pattern=SAFE_PATH_PATTERN,
        max_length=MAX_PATH_LENGTH,
        json_schema_extra=k8s_rules(
            (
                "!self.contains('/../') && !self.endsWith('/..') && self != '/'",
                "must be an absolute path without '..' segments, and not '/'",
            )
        ),
    ),
    pydantic.AfterValidator(_no_dotdot),
]


class ModelConfig(_Model):
    """Which transformer to train. `factory` replaces the built-in model entirely."""

    preset: ModelPreset = Field(ModelPreset.TINY, description="Built-in transformer size.")
    vocab_size: int = Field(256, ge=2, le=1_048_576, description="Vocabulary size.")
    seq_len: int = Field(32, ge=1, le=1_048_576, description="Tokens per sample.")
    dim: int | None = Field(None, ge=8, le=65_536, description="Model width (custom preset).")
    n_layers: int | None = Field(None, ge=1, le=1024, description="Transformer blocks (custom).")
    n_heads: int | None = Field(None, ge=1, le=1024, description="Attention heads (custom).")
    factory: str | None = Field(
        None,
        pattern=FACTORY_PATTERN,
        max_length=200,
        description="User model factory 'pkg.module:function' returning an nn.Module.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=k8s_rules(
            (
                "self.preset != 'custom' || (has(self.dim) && has(self.nLayers)"
                " && has(self.nHeads))",
                "preset 'custom' requires dim, nLayers and nHeads",
            ),
            (
                "!has(self.dim) || !has(self.nHeads) || self.dim % self.nHeads == 0",
                "dim must be divisible by nHeads",
            ),
        )
    )

    @pydantic.model_validator(mode="after")
    def _check(self) -> ModelConfig:
        if self.preset is ModelPreset.CUSTOM and None in (self.dim, self.n_layers, self.n_heads):
            raise ValueError("model.preset 'custom' requires model.dim, nLayers and nHeads")
        if self.dim is not None and self.n_heads is not None and self.dim % self.n_heads:
            raise ValueError(f"model.dim={self.dim} must be divisible by nHeads={self.n_heads}")
        return self


class DataConfig(_Model):
    """Where tokens come from. The position is a global sample cursor, world-size free."""

    kind: DataKind = Field(DataKind.SYNTHETIC, description="synthetic or tokenFile.")
    path: SafePath | None = Field(None, description="Token file (uint16/uint32 memmap) path.")
    dtype: str = Field("uint16", pattern=r"^uint(16|32)$", description="Token file dtype.")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of the synthetic stream.")

    model_config = pydantic.ConfigDict(
        json_schema_extra=k8s_rules(
            (
                "self.kind != 'tokenFile' || has(self.path)",
                "path is required for tokenFile",
                ".path",
            ),
        )
    )


class OptimizerConfig(_Model):
    """AdamW settings."""

    lr: float = Field(3e-4, gt=0, le=10, description="Peak learning rate.")
    beta1: float = Field(0.9, ge=0, lt=1, description="Decay rate of the gradient average.")
    beta2: float = Field(
        0.95, ge=0, lt=1, description="Decay rate of the squared-gradient average."
    )
    eps: float = Field(1e-8, gt=0, le=1, description="Added to the update's denominator.")
    weight_decay: float = Field(0.1, ge=0, le=10, description="Decoupled weight decay.")
    grad_clip: float | None = Field(1.0, gt=0, le=1e6, description="Max global grad norm.")


class SchedulerConfig(_Model):
    """Learning-rate schedule: linear warmup then constant or cosine decay."""

    kind: SchedulerKind = Field(
        SchedulerKind.COSINE,
        description="After warmup: constant (lr), or cosine (from lr down to minLrRatio x lr "
        "at the last step).",
    )
    warmup_steps: int = Field(
        0, ge=0, le=10_000_000, description="Steps of linear warmup up to lr; 0: none."
    )
    min_lr_ratio: float = Field(
        0.1, ge=0, le=1, description="Where cosine decay ends, as a fraction of lr."
    )


class PrecisionConfig(_Model):
    """FSDP2 mixed precision: parameter dtype for compute, dtype of gradient reduction."""

    param: Precision = Field(
        Precision.FP32,
        description="Dtype the parameters are cast to for forward and backward; the sharded "
        "parameters the optimizer updates are not cast.",
    )
    reduce: Precision = Field(
        Precision.FP32, description="Dtype in which gradients are reduced across ranks."
    )


class TrainingConfig(_Model):
    """`spec.training` of an FSDPJob: everything that defines the training run."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    steps: int = Field(100, ge=1, le=1_000_000_000, description="Total optimizer steps.")
    global_batch_size: int = Field(
        8, ge=1, le=16_777_216, description="Samples per optimizer step, at every world size."
    )
    micro_batch_size: int = Field(1, ge=1, le=65_536, description="Samples per rank per pass.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    precision: PrecisionConfig = Field(default_factory=PrecisionConfig)
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each transformer block's activations in backward instead of "
        "keeping them: less memory, more compute.",
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seed of model init and dropout.")

    model_config = pydantic.ConfigDict(
        json_schema_extra=k8s_rules(
            (
                "self.globalBatchSize % self.microBatchSize == 0",
                "globalBatchSize must be a multiple of microBatchSize",
            ),
        )
    )

    @pydantic.model_validator(mode="after")
    def _check(self) -> TrainingConfig:
        if self.micro_batch_size > self.global_batch_size:
            raise ValueError(
                f"microBatchSize={self.micro_batch_size} exceeds "
                f"globalBatchSize={self.global_batch_size}; it must be at most globalBatchSize"
            )
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"globalBatchSize={self.global_batch_size} must be a multiple of "
                f"microBatchSize={self.micro_batch_size}"
            )
        if self.data.kind is DataKind.TOKEN_FILE and self.data.path is None:
            raise ValueError("data.path is required when data.kind is 'tokenFile'")
        return self

    def accumulation_steps(self, world_size: int) -> int:
        """Gradient-accumulation passes per step, or ValueError naming the fields."""
        per_pass = self.micro_batch_size * world_size
        if world_size < 1 or self.global_batch_size % per_pass:
            raise ValueError(
                f"globalBatchSize={self.global_batch_size} is not divisible by "
                f"microBatchSize={self.micro_batch_size} x worldSize={world_size}; "
                "allowed world sizes are those dividing globalBatchSize/microBatchSize"
            )
        return self.global_batch_size // per_pass

    def allowed_world_sizes(self, upper: int) -> list[int]:
        """World sizes in [1, upper] at which the global batch stays exact."""
        passes = self.global_batch_size // self.micro_batch_size
        return [w for w in range(1, upper + 1) if passes % w == 0]

    def resume_hash(self) -> str:
        """Hash of the fields a checkpoint's meaning depends on: model, data, global batch, seed.

        Everything else may change between attempts and still resume: `steps` (extend a run),
        optimizer and schedule settings (a learning-rate fix mid-run), microBatchSize (the
        accumulation adapts), precision and activation checkpointing. The CRD makes the hashed
        fields immutable, so an edit can never strand a running job on exit 78.
        """
        doc = self.model_dump(
            mode="json", by_alias=True, include={"model", "data", "global_batch_size", "seed"}
        )
        blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


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


class AutoIntervalConfig(_Model):
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


QUANTITY_PATTERN = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""A Kubernetes resource quantity: `8`, `500m`, `4Gi`."""


MEMORY_TIER_MIN = "16Mi"
"""The smallest `checkpoint.memory.sizeLimit`: DCP's metadata and two saves of a small model."""
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))([eE][+-]?[0-9]+|[A-Za-z]*)$")
_SUFFIX: dict[str, decimal.Decimal] = {
    key: decimal.Decimal(value)
    for key, value in {
        "": "1",
        "n": "1e-9",
        "u": "1e-6",
        "m": "1e-3",
        "k": "1e3",
        "M": "1e6",
        "G": "1e9",
        "T": "1e12",
        "P": "1e15",
        "E": "1e18",
        "Ki": str(2**10),
        "Mi": str(2**20),
        "Gi": str(2**30),
        "Ti": str(2**40),
        "Pi": str(2**50),
        "Ei": str(2**60),
    }.items()
}


def quantity(value: str | int | float) -> float:
    """A Kubernetes resource quantity (`8`, `500m`, `4Gi`, `1e3`) as a number."""
    match = _QUANTITY.match(str(value))
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix = match.group(1), match.group(2)
    if suffix in _SUFFIX:
        return float(decimal.Decimal(number) * _SUFFIX[suffix])
    if re.fullmatch(r"[eE][+-]?[0-9]+", suffix):  # a decimal exponent
        return float(decimal.Decimal(number + suffix))
    raise ValueError(f"not a quantity: {value!r} (unknown suffix {suffix!r})")


class MemoryTierConfig(_Model):
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
        "being written: about twice their share of model and optimizer state. It counts "
        "against the pod's memory. At least "
        f"{MEMORY_TIER_MIN}: below that no save fits, and a failed memory save ends the rank.",
        json_schema_extra=k8s_rules(
            (
                f"isQuantity(self) && quantity(self).compareTo(quantity('{MEMORY_TIER_MIN}')) >= 0",
                f"checkpoint.memory.sizeLimit must be a quantity of at least {MEMORY_TIER_MIN}"
                " (the memory tier holds two steps of each pod's share of the state)",
            )
        ),
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


class ExportConfig(_Model):
    """`checkpoint.export`: the trained model, written once more on success in a form usable
    without this project (checkpointing/export.py)."""

    format: ExportFormat = Field(
        ExportFormat.SAFETENSORS,
        description="safetensors: the model's full (unsharded) parameters and buffers, by their "
        "names in the model, in one Hugging Face safetensors file at "
        "<checkpoint root>/export/model.safetensors; export/COMPLETE.json is created last, "
        "only if absent.",
    )


class CheckpointConfig(_Model):
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


class WorkerConfig(_Model):
    """The document every rank reads (FSDP_WORKER_CONFIG): training plus checkpointing."""

    training: TrainingConfig = Field(default_factory=TrainingConfig)
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @classmethod
    def parse(cls, raw: str | bytes | dict[str, Any]) -> WorkerConfig:
        """Parse JSON text or a dict; raises pydantic.ValidationError naming the field."""
        if isinstance(raw, dict):
            return cls.model_validate(raw)
        return cls.model_validate_json(raw)

    def to_json(self) -> str:
        # Without a memory tier or an export the document stays what a worker before them
        # parses.
        optional = {"memory": self.checkpoint.memory, "export": self.checkpoint.export}
        unset = {"checkpoint": {name for name, value in optional.items() if value is None}}
        return self.model_dump_json(by_alias=True, exclude=unset)
