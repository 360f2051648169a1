"""The training-config document: the one contract between an FSDPJob spec and its workers.

The operator embeds `TrainingConfig` in the FSDPJob spec (the CRD's `spec.training` schema is
generated from it) and hands `WorkerConfig` to every rank as one JSON document: this training
config and the checkpoint config (config_checkpoint.py), on the models config_base.py holds.
Torch-free and numpy-free by design: the operator image imports this module. It must not read
the clock, the environment or the disk.
"""

from __future__ import annotations

import enum
import hashlib
import json
from typing import Any

import pydantic
from pydantic import Field

from fsdp_worker.contract.config_base import ConfigModel, SafePath, k8s_rules
from fsdp_worker.contract.config_checkpoint import CheckpointConfig

# Names a user may put in a config that later become module references are restricted to this
# shape so that nothing can smuggle `$(VAR)` expansion, shell syntax or `..` (paths:
# config_base.SafePath).
FACTORY_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


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


class ModelConfig(ConfigModel):
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


class DataConfig(ConfigModel):
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


class OptimizerConfig(ConfigModel):
    """AdamW settings."""

    lr: float = Field(3e-4, gt=0, le=10, description="Peak learning rate.")
    beta1: float = Field(0.9, ge=0, lt=1, description="Decay rate of the gradient average.")
    beta2: float = Field(
        0.95, ge=0, lt=1, description="Decay rate of the squared-gradient average."
    )
    eps: float = Field(1e-8, gt=0, le=1, description="Added to the update's denominator.")
    weight_decay: float = Field(0.1, ge=0, le=10, description="Decoupled weight decay.")
    grad_clip: float | None = Field(1.0, gt=0, le=1e6, description="Max global grad norm.")


class SchedulerConfig(ConfigModel):
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


class PrecisionConfig(ConfigModel):
    """FSDP2 mixed precision: parameter dtype for compute, dtype of gradient reduction."""

    param: Precision = Field(
        Precision.FP32,
        description="Dtype the parameters are cast to for forward and backward; the sharded "
        "parameters the optimizer updates are not cast.",
    )
    reduce: Precision = Field(
        Precision.FP32, description="Dtype in which gradients are reduced across ranks."
    )


class TrainingConfig(ConfigModel):
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


class WorkerConfig(ConfigModel):
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
