"""The FSDPJob API types: spec and status as pydantic models, the one source of truth.

The CRD in crds/ is generated from these models (see crd.py); a test fails when the committed
file drifts. Cross-field rules live here twice on purpose, in one place: as Python validators
(the operator re-checks what it reads) and as CEL strings attached to the schema (the API server
rejects bad specs at admission). No I/O, no clock, no kopf.
"""

from __future__ import annotations

from typing import Any

import pydantic
from pydantic import Field

from fsdp_worker import config as wconfig

GROUP = "fsdpoperator.io"
VERSION = "v1alpha1"
KIND = "FSDPJob"
PLURAL = "fsdpjobs"
SINGULAR = "fsdpjob"
SHORT_NAMES = ["fsdpj"]
CATEGORIES = ["training"]

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
NO_VAR_EXPANSION = "!self.contains('$(')"


class _Model(wconfig._Model):
    """Spec models share the worker config's wire conventions (camelCase, extra=forbid)."""


def _cel(rule: str, message: str, **extra: str) -> dict[str, str]:
    return {"rule": rule, "message": message, **extra}


def _rules(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


def _immutable(field: str) -> dict[str, Any]:
    return _rules(_cel("self == oldSelf", f"{field} is immutable"))


class Backoff(_Model):
    """Exponential backoff between attempts."""

    initial_seconds: int = Field(5, ge=0, le=3600, description="Delay before the 1st restart.")
    max_seconds: int = Field(300, ge=0, le=86_400, description="Upper bound of the delay.")

    model_config = pydantic.ConfigDict(
        json_schema_extra=_rules(
            _cel("self.initialSeconds <= self.maxSeconds", "initialSeconds must be <= maxSeconds")
        )
    )


class FailurePolicy(_Model):
    """How failures are detected and how many restarts each budget allows."""

    max_restarts: int = Field(20, ge=0, le=10_000, description="Application-failure budget.")
    max_infra_restarts: int = Field(
        100, ge=0, le=100_000, description="Node loss, eviction, preemption budget."
    )
    max_restarts_without_progress: int = Field(
        3, ge=1, le=1000, description="Circuit breaker: restarts with no new checkpoint between."
    )
    non_retryable_exit_codes: list[int] = Field(
        default_factory=list,
        max_length=32,
        description="Container exit codes that fail the job at once (plus the worker's 78).",
    )
    backoff: Backoff = Field(default_factory=Backoff)
    node_loss_grace_seconds: int = Field(
        30, ge=0, le=3600, description="NotReady/Unknown node time before its pods count lost."
    )
    progress_deadline_seconds: int = Field(
        600, ge=5, le=604_800, description="Hang: no step advance on rank 0 for this long."
    )
    pending_timeout_seconds: int = Field(
        120, ge=1, le=86_400, description="Pods Pending this long: shrink, or fail on image errors."
    )

    @pydantic.field_validator("non_retryable_exit_codes")
    @classmethod
    def _codes(cls, codes: list[int]) -> list[int]:
        bad = [c for c in codes if not 1 <= c <= 255]
        if bad:
            raise ValueError(f"nonRetryableExitCodes {bad} must be within 1..255")
        return codes


class CheckpointSpec(wconfig.CheckpointConfig):
    """`spec.checkpoint`: the worker's checkpoint config plus where the volume comes from."""

    claim_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="PersistentVolumeClaim (RWX) mounted at root in every worker pod.",
    )

    def worker_config(self) -> wconfig.CheckpointConfig:
        return wconfig.CheckpointConfig.model_validate(
            self.model_dump(by_alias=True, exclude={"claim_name"})
        )


class EnvVar(_Model):
    """A plain environment variable for the worker container. No valueFrom, no $(VAR)."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    value: str = Field(
        "",
        max_length=4096,
        json_schema_extra=_rules(
            _cel(NO_VAR_EXPANSION, "value must not contain '$(' (variable expansion)")
        ),
    )

    @pydantic.field_validator("value")
    @classmethod
    def _no_expansion(cls, value: str) -> str:
        if "$(" in value:
            raise ValueError(f"env value {value!r} must not contain '$(' (variable expansion)")
        return value


class PodOverrides(_Model):
    """`spec.template.spec`: the pod fields a user may set. Anything else is the operator's."""

    node_selector: dict[str, str] = Field(default_factory=dict, max_length=64)
    tolerations: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    affinity: dict[str, Any] | None = None
    volumes: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list, max_length=64)
    env: list[EnvVar] = Field(default_factory=list, max_length=128)
    termination_grace_period_seconds: int = Field(
        120, ge=1, le=86_400,
        description="Time a worker gets on SIGTERM to finish its step and save a checkpoint.",
    )  # fmt: skip
    priority_class_name: str | None = Field(None, pattern=NAME_PATTERN, max_length=253)
    scheduler_name: str | None = Field(None, pattern=NAME_PATTERN, max_length=253)


class TemplateMetadata(_Model):
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    annotations: dict[str, str] = Field(default_factory=dict, max_length=64)


class PodTemplate(_Model):
    """`spec.template`: pod overrides merged into every worker pod."""

    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    spec: PodOverrides = Field(default_factory=PodOverrides)


class Resources(_Model):
    """Per-pod resources, e.g. limits: {nvidia.com/gpu: 8}."""

    requests: dict[str, str] = Field(default_factory=dict, max_length=16)
    limits: dict[str, str] = Field(default_factory=dict, max_length=16)

    @pydantic.field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        for key, qty in value.items():
            if not re.fullmatch(QUANTITY_PATTERN, qty):
                raise ValueError(
                    f"resource {key}={qty!r} is not a quantity like '8', '500m', '4Gi'"
                )
        return value


_SPEC_RULES = _rules(
    _cel(
        "!has(self.minReplicas) || self.minReplicas <= self.replicas",
        "minReplicas must be <= replicas",
        fieldPath=".minReplicas",
    ),
    _cel(
        "self.training.globalBatchSize % (self.training.microBatchSize * self.replicas"
        " * self.nprocPerNode) == 0",
        "training.globalBatchSize must be divisible by training.microBatchSize x replicas x"
        " nprocPerNode",
        fieldPath=".training.globalBatchSize",
    ),
    _cel(
        "self.nprocPerNode == oldSelf.nprocPerNode",
        "nprocPerNode is immutable",
        fieldPath=".nprocPerNode",
    ),
    _cel(
        "self.training.model == oldSelf.training.model"
        " && self.training.globalBatchSize == oldSelf.training.globalBatchSize"
        " && self.training.data == oldSelf.training.data"
        " && self.training.seed == oldSelf.training.seed",
        "training.model, training.data, training.globalBatchSize and training.seed are"
        " immutable (checkpoints depend on them)",
        fieldPath=".training",
    ),
    _cel(
        "self.checkpoint.root == oldSelf.checkpoint.root",
        "checkpoint.root is immutable",
        fieldPath=".checkpoint.root",
    ),
)


class FSDPJobSpec(_Model):
    """`spec` of an FSDPJob."""

    replicas: int = Field(ge=1, le=1024, description="Worker pods (one per node).")
    min_replicas: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Smallest world a restart may shrink to (default replicas).",
    )
    nproc_per_node: int = Field(1, ge=1, le=64, description="torchrun --nproc-per-node.")
    image: str = Field(pattern=IMAGE_PATTERN, max_length=512, description="Worker image.")
    resources: Resources = Field(default_factory=Resources)
    training: wconfig.TrainingConfig = Field(default_factory=wconfig.TrainingConfig)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    suspend: bool = False
    active_deadline_seconds: int | None = Field(None, ge=1, le=31_536_000)
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=31_536_000)
    template: PodTemplate = Field(default_factory=PodTemplate)

    model_config = pydantic.ConfigDict(json_schema_extra=_SPEC_RULES)

    @pydantic.model_validator(mode="after")
    def _check(self) -> FSDPJobSpec:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise ValueError(f"minReplicas={self.min_replicas} must be <= replicas={self.replicas}")
        self.training.accumulation_steps(self.replicas * self.nproc_per_node)
        return self

    @property
    def floor(self) -> int:
        """Smallest replica count a restart may use."""
        return self.min_replicas if self.min_replicas is not None else self.replicas

    def allowed_replicas(self) -> list[int]:
        """Replica counts in [floor, replicas] that keep the global batch exact, largest first."""
        passes = self.training.global_batch_size // self.training.micro_batch_size
        sizes = range(self.floor, self.replicas + 1)
        return sorted((r for r in sizes if passes % (r * self.nproc_per_node) == 0), reverse=True)
