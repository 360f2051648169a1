"""The FSDPJob API types: spec and status as pydantic models, the one source of truth.

The CRD in crds/ is generated from these models (see crd.py); a test fails when the committed
file drifts. Cross-field rules live here twice on purpose, in one place: as Python validators
(the operator re-checks what it reads) and as CEL strings attached to the schema (the API server
rejects bad specs at admission). No I/O, no clock, no kopf.

This module is the entry every caller imports (`api.<Name>`): the FSDPJob spec itself is here;
its pod template (spec_pod.py), the FSDPRuntimeProfile (spec_profile.py) and what all spec
models share (spec_rules.py) live beside it, their models re-exported here; its checkpoint
(spec_checkpoint.py, spec_storage.py) and trainer (spec_trainer.py) parts too, read through
the spec's fields.
"""

from __future__ import annotations

import pydantic
from pydantic import Field

from fsdp_operator.types import (
    kubetypes,
    spec_checkpoint,
    spec_containers,
    spec_gang,
    spec_profile,
    spec_rules,
    spec_storage,
    spec_trainer,
)
from fsdp_operator.types.spec_containers import (
    Container as Container,
)
from fsdp_operator.types.spec_pod import (
    Capability as Capability,
)
from fsdp_operator.types.spec_pod import (
    EnvVar as EnvVar,
)
from fsdp_operator.types.spec_pod import (
    PodOverrides as PodOverrides,
)
from fsdp_operator.types.spec_pod import (
    PodTemplate as PodTemplate,
)
from fsdp_operator.types.spec_pod import (
    TemplateMetadata as TemplateMetadata,
)
from fsdp_operator.types.spec_pod import (
    Volume as Volume,
)
from fsdp_operator.types.spec_profile import (
    PROFILE_KIND as PROFILE_KIND,
)
from fsdp_operator.types.spec_profile import (
    PROFILE_PLURAL as PROFILE_PLURAL,
)
from fsdp_operator.types.spec_profile import (
    PROFILE_SHORT_NAMES as PROFILE_SHORT_NAMES,
)
from fsdp_operator.types.spec_profile import (
    PROFILE_SINGULAR as PROFILE_SINGULAR,
)
from fsdp_operator.types.spec_profile import (
    RESTRICTED_PROFILE as RESTRICTED_PROFILE,
)
from fsdp_operator.types.spec_profile import (
    FSDPRuntimeProfile as FSDPRuntimeProfile,
)
from fsdp_operator.types.spec_profile import (
    ProfileEnv as ProfileEnv,
)
from fsdp_operator.types.spec_profile import (
    RuntimeProfileSpec as RuntimeProfileSpec,
)
from fsdp_operator.types.spec_profile_pod import (
    ProfileSidecar as ProfileSidecar,
)
from fsdp_operator.types.spec_profile_pod import (
    ProfileVolume as ProfileVolume,
)
from fsdp_operator.types.spec_profile_pod import (
    SidecarSecurity as SidecarSecurity,
)
from fsdp_operator.types.spec_rules import NAME_PATTERN, SpecModel, cel, rules
from fsdp_operator.types.spec_storage import (
    ObjectStore as ObjectStore,
)
from fsdp_worker.contract import config, config_base

GROUP = "fsdpoperator.io"
VERSION = "v1alpha1"
KIND = "FSDPJob"
PLURAL = "fsdpjobs"
SINGULAR = "fsdpjob"
SHORT_NAMES = ["fsdpj"]
CATEGORIES = ["training"]

IMAGE_PATTERN = spec_rules.IMAGE_PATTERN


class Backoff(SpecModel):
    """Exponential backoff between attempts."""

    initial_seconds: int = Field(
        5,
        ge=0,
        le=3600,
        description="Seconds before the 2nd restart in a row without a new checkpoint; the "
        "delay doubles with each further one. A restart after progress is immediate.",
    )
    max_seconds: int = Field(300, ge=0, le=86_400, description="Upper bound of the delay.")

    model_config = pydantic.ConfigDict(
        json_schema_extra=rules(
            cel("self.initialSeconds <= self.maxSeconds", "initialSeconds must be <= maxSeconds")
        )
    )


class FailurePolicy(SpecModel):
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
        30,
        ge=0,
        le=3600,
        description="How long a node may be NotReady/Unknown before its pods count lost. A node "
        "whose kubelet stops renewing its Lease is lost sooner, but only once the job stops "
        "stepping too (before the attempt's first step, with inPlaceRestarts: once the node's "
        "keeper falls silent too): a kubelet restarting under a gang that trains on, or starts "
        "with its keepers speaking, restarts nothing until this grace has passed.",
    )
    progress_deadline_seconds: int = Field(
        600, ge=5, le=604_800, description="Hang: no step advance on rank 0 for this long."
    )
    hang_step_times: int = Field(
        3,
        ge=0,
        le=1000,
        description="With inPlaceRestarts: a rank whose collectives and steps all stop for this "
        "many times its median step (at least hangFloorSeconds), in a step's own phases, ends "
        "its gang's generation as a Hang, restarted in place in seconds instead of after "
        "progressDeadlineSeconds. Not before a generation's fifth step, in a save or a load, in "
        "the two steps after a save to the claim, in a phase a kit loop names itself "
        "(kit.phase), or in the generation that spends the last restart in place (there the "
        "operator's verdicts judge). 0: off.",
    )
    hang_floor_seconds: int = Field(
        10,
        ge=1,
        le=3600,
        description="The shortest stop hangStepTimes takes for a hang: above the longest pause "
        "a healthy rank makes between collectives (a data loader starting an epoch, a "
        "recompile, a synchronous log flush). Lower it for fast detection where steps are "
        "short and such pauses are known to be short.",
    )
    startup_deadline_seconds: int | None = Field(
        None,
        ge=5,
        le=604_800,
        description="Hang before an attempt's first step: from every pod running (imports, "
        "rendezvous, checkpoint load) to rank 0's first step. Unset: progressDeadlineSeconds. "
        "Lets a job with a slow start keep a short deadline between steps.",
    )
    pending_timeout_seconds: int = Field(
        120,
        ge=1,
        le=86_400,
        description="Pods Pending this long: shrink; fail on image errors or a missing claim.",
    )
    in_place_restarts: int = Field(
        0,
        ge=0,
        le=100,
        description="Rank failures an attempt may restart in place: the ranks of every pod "
        "restart inside the running pods (no pod is deleted or scheduled) from the newest "
        "checkpoint. Each is charged like any restart; past this many, or for a node lost, an "
        "eviction or a ConfigError, the gang is recreated. 0: every failure recreates it. The "
        "image must carry fsdp_worker (its in-place keeper runs in front of torchrun).",
    )

    swap_slow_nodes: bool = Field(
        False,
        description="With spec.spares: a node whose rank rank 0 names slow (status.slowRank) "
        "at 1.5 times the other ranks' compute or more, for two of its verdicts in a row (40 "
        "steps), is swapped out: the gang saves a checkpoint (no step is lost), stops and "
        "starts again without that node (kept out like a lost node, not charged as a failure), "
        "on the node a running spare stood on. At most once per attempt. false, or no spare "
        "running: the slow rank is only reported.",
    )

    @property
    def startup_deadline(self) -> int:
        """Seconds allowed to an attempt's first step (startupDeadlineSeconds, else the
        progress deadline)."""
        return self.startup_deadline_seconds or self.progress_deadline_seconds

    @pydantic.field_validator("non_retryable_exit_codes")
    @classmethod
    def _codes(cls, codes: list[int]) -> list[int]:
        bad = [c for c in codes if not 1 <= c <= 255]
        if bad:
            raise ValueError(f"nonRetryableExitCodes {bad} must be within 1..255")
        return codes


_SPEC_RULES = rules(
    cel(
        "!has(self.spares) || self.spares == 0 || (has(self.failurePolicy) &&"
        " has(self.failurePolicy.inPlaceRestarts) && self.failurePolicy.inPlaceRestarts > 0)",
        "spares needs failurePolicy.inPlaceRestarts > 0: a spare joins the gang in a restart in"
        " place",
        fieldPath=".spares",
    ),
    cel(
        "!has(self.checkpoint) || !has(self.checkpoint.memory) || (has(self.failurePolicy) &&"
        " has(self.failurePolicy.inPlaceRestarts) && self.failurePolicy.inPlaceRestarts > 0)",
        "checkpoint.memory needs failurePolicy.inPlaceRestarts > 0: the memory tier survives"
        " only restarts in place",
        fieldPath=".checkpoint.memory",
    ),
    cel(
        "!has(self.minReplicas) || self.minReplicas <= self.replicas",
        "minReplicas must be <= replicas",
        fieldPath=".minReplicas",
    ),
    cel(
        # Guarded: replicas 0 (refused by its own minimum) would add "modulus by zero" beside
        # the real error.
        "self.replicas < 1 || self.nprocPerNode < 1 || self.training.microBatchSize < 1 ||"
        " self.training.globalBatchSize % (self.training.microBatchSize * self.replicas"
        " * self.nprocPerNode) == 0",
        "training.globalBatchSize must be divisible by training.microBatchSize x replicas x"
        " nprocPerNode",
        fieldPath=".training.globalBatchSize",
    ),
    cel(
        "self.nprocPerNode == oldSelf.nprocPerNode",
        "nprocPerNode is immutable",
        fieldPath=".nprocPerNode",
    ),
    cel(
        "self.training.model == oldSelf.training.model"
        " && self.training.globalBatchSize == oldSelf.training.globalBatchSize"
        " && self.training.data == oldSelf.training.data"
        " && self.training.seed == oldSelf.training.seed",
        "training.model, training.data, training.globalBatchSize and training.seed are"
        " immutable (checkpoints depend on them)",
        fieldPath=".training",
    ),
    cel(
        "!has(self.template.spec.capabilities) || size(self.template.spec.capabilities) == 0"
        " || has(self.runtimeProfile)",
        "template.spec.capabilities needs spec.runtimeProfile: capabilities come only from a"
        " runtime profile the cluster admin made",
        fieldPath=".template.spec.capabilities",
    ),
    cel(
        "has(self.runtimeProfile) || !has(self.template.spec.initContainers) ||"
        " self.template.spec.initContainers.all(c, !has(c.securityContext) ||"
        " !has(c.securityContext.capabilities) || !has(c.securityContext.capabilities.add) ||"
        " c.securityContext.capabilities.add.all(a, a == 'NET_BIND_SERVICE'))",
        "template.spec.initContainers[].securityContext.capabilities.add: beyond"
        " NET_BIND_SERVICE needs spec.runtimeProfile granting it",
        fieldPath=".template.spec.initContainers",
    ),
    cel(
        "has(self.runtimeProfile) || !has(self.resources) || "
        + " && ".join(
            f"(!has(self.resources.{part}) || self.resources.{part}.all(k, "
            + " && ".join(f"!k.startsWith('{p}')" for p in spec_profile.PROFILE_ONLY_RESOURCES)
            + "))"
            for part in ("limits", "requests")
        ),
        "resources under rdma/ and hugepages- come only from a runtime profile"
        " (spec.runtimeProfile)",
        fieldPath=".resources",
    ),
    cel(
        "self.checkpoint.root == oldSelf.checkpoint.root",
        "checkpoint.root is immutable",
        fieldPath=".checkpoint.root",
    ),
    cel(
        "has(self.checkpoint.objectStore) == has(oldSelf.checkpoint.objectStore) &&"
        " (!has(self.checkpoint.objectStore) ||"
        " (self.checkpoint.objectStore.bucket == oldSelf.checkpoint.objectStore.bucket &&"
        " self.checkpoint.objectStore.prefix == oldSelf.checkpoint.objectStore.prefix))",
        "checkpoint.objectStore (its bucket and prefix) is immutable",
        fieldPath=".checkpoint.objectStore",
    ),
    spec_gang.SCHEDULER_RULE,
)


class FSDPJobSpec(SpecModel):
    """`spec` of an FSDPJob."""

    replicas: int = Field(ge=1, le=1024, description="Worker pods (one per node).")
    min_replicas: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Smallest world a restart may shrink to (default replicas).",
    )
    nproc_per_node: int = Field(1, ge=1, le=64, description="torchrun --nproc-per-node.")
    spares: int = Field(
        0,
        ge=0,
        le=64,
        description="Warm standby pods (scheduled, image started, imports done) on other nodes: "
        "when a node is lost, or its pod freezes whole (a hang whose keeper falls silent), a "
        "spare takes its place in a restart in place (node rank 0's too: the spare becomes the "
        "gang's coordinator and store), without the scheduler or an image start, and a new "
        "spare is started behind it. "
        "Needs failurePolicy.inPlaceRestarts > 0. 0: none.",
    )
    image: str = Field(
        pattern=IMAGE_PATTERN,
        max_length=512,
        description="Worker image: the project's, or the team's own with spec.trainer.",
    )
    trainer: spec_trainer.Trainer | None = Field(
        None, description="The team's own training code; unset: the built-in trainer."
    )
    resources: kubetypes.ResourceRequirements = Field(
        default_factory=kubetypes.ResourceRequirements,
        description="Per-pod resources, e.g. limits: {nvidia.com/gpu: 8}.",
    )
    training: config.TrainingConfig = Field(
        default_factory=config.TrainingConfig,
        description="The training run: model, data, batch sizes, optimizer and schedule. model, "
        "data, globalBatchSize and seed are immutable (checkpoints depend on them).",
    )
    checkpoint: spec_checkpoint.CheckpointSpec = Field(
        default_factory=spec_checkpoint.CheckpointSpec,
        description="Where checkpoints are written, how often, how many are kept, and what "
        "proves one complete.",
    )
    failure_policy: FailurePolicy = Field(default_factory=FailurePolicy)
    suspend: bool = Field(
        False,
        description="true: the worker pods save a checkpoint and exit, and the job stays "
        "Suspended; false again: it resumes from its newest checkpoint. Costs no restart budget.",
    )
    active_deadline_seconds: int | None = Field(
        None,
        ge=1,
        le=31_536_000,
        description="Seconds the job may run, counted from its start or its last resume from "
        "suspension; then it fails (DeadlineExceeded). Unset: no limit.",
    )
    ttl_seconds_after_finished: int | None = Field(
        None,
        ge=0,
        le=31_536_000,
        description="Seconds after the job succeeded or failed before the operator deletes it, "
        "and its pods with it. Unset: kept until deleted.",
    )
    template: PodTemplate = Field(
        default_factory=PodTemplate,
        description="Labels, annotations and pod fields merged into every worker pod.",
    )
    runtime_profile: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="The FSDPRuntimeProfile (cluster-scoped, the cluster admin's) the worker "
        'pods are made under: what they may have beyond Pod Security "restricted" (e.g. '
        "IPC_LOCK, RDMA devices, a runtime class) and what it adds (NCCL variables, /dev/shm "
        "size, pull secrets). Unset: restricted, nothing added.",
    )
    service_account_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description=spec_storage.SERVICE_ACCOUNT_DESCRIPTION,
    )
    gang_scheduling: spec_gang.GangScheduling | None = Field(
        None,
        description="A gang scheduler's PodGroup for each attempt (Coscheduling or Volcano): "
        "none of its pods is placed until all can be. Unset: spec.runtimeProfile's, else none.",
    )

    model_config = pydantic.ConfigDict(json_schema_extra=_SPEC_RULES)

    @pydantic.model_validator(mode="after")
    def _check(self) -> FSDPJobSpec:
        if self.min_replicas is not None and self.min_replicas > self.replicas:
            raise ValueError(f"minReplicas={self.min_replicas} must be <= replicas={self.replicas}")
        self.training.accumulation_steps(self.replicas * self.nproc_per_node)
        if self.checkpoint.memory is not None and not self.failure_policy.in_place_restarts:
            raise ValueError(
                "checkpoint.memory is set but failurePolicy.inPlaceRestarts="
                f"{self.failure_policy.in_place_restarts}: the memory tier survives only restarts"
                " in place; set inPlaceRestarts > 0 or remove checkpoint.memory"
            )
        if self.spares and not self.failure_policy.in_place_restarts:
            raise ValueError(
                f"spares={self.spares} but failurePolicy.inPlaceRestarts="
                f"{self.failure_policy.in_place_restarts}: a spare joins the gang in a restart in"
                " place; set inPlaceRestarts > 0 or spares: 0"
            )
        if self.template.spec.capabilities and self.runtime_profile is None:
            raise ValueError(
                f"template.spec.capabilities={[str(c) for c in self.template.spec.capabilities]}"
                " needs spec.runtimeProfile: capabilities come only from a runtime profile the"
                " cluster admin made"
            )
        if self.runtime_profile is None and (
            refused := spec_profile.resource_refusal(self, granted={})
            or spec_containers.refusal(self)
        ):
            raise ValueError(refused)
        if refused := spec_containers.refusal(self, granted=[str(c) for c in Capability]):
            raise ValueError(refused)
        if refused := spec_gang.scheduler_refusal(
            self.gang_scheduling, self.template.spec.scheduler_name
        ):
            raise ValueError(refused)
        self._env_left_to_the_store()
        return self

    def _env_left_to_the_store(self) -> None:
        """The AWS variables objectStore sets are its own: a template env var of the same name
        would silently win over (or lose to) the spec's endpoint, region or keys."""
        store = self.checkpoint.object_store
        taken = store.env_names() if store is not None else []
        for index, var in enumerate(self.template.spec.env):
            if var.name in taken:
                raise ValueError(
                    f"template.spec.env[{index}].name={var.name!r} is set from"
                    " checkpoint.objectStore (endpoint, region, credentialsSecret); set it there"
                    " or leave that field unset"
                )

    @property
    def floor(self) -> int:
        """Smallest replica count a restart may use."""
        return self.min_replicas if self.min_replicas is not None else self.replicas

    def allowed_replicas(self) -> list[int]:
        """Replica counts in [floor, replicas] that keep the global batch exact, largest first."""
        passes = self.training.global_batch_size // self.training.micro_batch_size
        sizes = range(self.floor, self.replicas + 1)
        return sorted((r for r in sizes if passes % (r * self.nproc_per_node) == 0), reverse=True)


quantity = config_base.quantity  # the worker's config holds it: checkpoint.memory.sizeLimit's too
