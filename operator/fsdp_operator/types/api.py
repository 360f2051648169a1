"""The FSDPJob API types: spec and status as pydantic models, the one source of truth.

The CRD in crds/ is generated from these models (see crd.py); a test fails when the committed
file drifts. Cross-field rules live here twice on purpose, in one place: as Python validators
(the operator re-checks what it reads) and as CEL strings attached to the schema (the API server
rejects bad specs at admission). No I/O, no clock, no kopf.
"""

from __future__ import annotations

import enum
import re
from typing import Annotated, Any

import pydantic
from pydantic import Field

from fsdp_operator.types import kubetypes
from fsdp_worker import contract
from fsdp_worker.contract import config

GROUP = "fsdpoperator.io"
VERSION = "v1alpha1"
KIND = "FSDPJob"
PLURAL = "fsdpjobs"
SINGULAR = "fsdpjob"
SHORT_NAMES = ["fsdpj"]
CATEGORIES = ["training"]

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@-]*$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
NO_VAR_EXPANSION = "!self.contains('$(')"


class _Model(config._Model):
    """Spec models share the worker config's wire conventions (camelCase, extra=forbid)."""


def _cel(rule: str, message: str, **extra: str) -> dict[str, str]:
    return {"rule": rule, "message": message, **extra}


def _rules(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


def _immutable(field: str) -> dict[str, Any]:
    return _rules(_cel("self == oldSelf", f"{field} is immutable"))


# What the API server would refuse when it creates the pod (core/v1 validation), said at
# admission of the FSDPJob instead of in its status after the operator's dry run.
_TOLERATION_RULES = (
    _cel(
        "self.all(t, !has(t.operator) || t.operator in ['Exists', 'Equal'])",
        "tolerations[].operator must be Exists or Equal",
    ),
    _cel(
        "self.all(t, !has(t.effect) || "
        "t.effect in ['NoSchedule', 'PreferNoSchedule', 'NoExecute'])",
        "tolerations[].effect must be NoSchedule, PreferNoSchedule or NoExecute",
    ),
    _cel(
        "self.all(t, (has(t.key) && t.key != '') || (has(t.operator) && t.operator == 'Exists'))",
        "a toleration without a key must have operator Exists",
    ),
    _cel(
        "self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')",
        "a toleration with operator Exists has no value",
    ),
    _cel(
        "self.all(t, !has(t.tolerationSeconds) || (has(t.effect) && t.effect == 'NoExecute'))",
        "tolerations[].tolerationSeconds needs effect NoExecute",
    ),
)


class Backoff(_Model):
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
        30,
        ge=0,
        le=3600,
        description="How long a node may be NotReady/Unknown before its pods count lost. A node "
        "whose kubelet stops renewing its Lease is lost sooner, but only once the job stops "
        "stepping too: a kubelet restarting under a gang that trains on restarts nothing "
        "until this grace has passed.",
    )
    progress_deadline_seconds: int = Field(
        600, ge=5, le=604_800, description="Hang: no step advance on rank 0 for this long."
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
        120, ge=1, le=86_400, description="Pods Pending this long: shrink, or fail on image errors."
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


class CheckpointSpec(config.CheckpointConfig):
    """`spec.checkpoint`: the worker's checkpoint config plus where the volume comes from and
    what proves a checkpoint complete."""

    completion: contract.Proof = Field(
        contract.Proof.MARKER,
        description="What proves a step-<N> checkpoint complete. Marker: the COMPLETE.json a "
        "trainer keeping docs/contract.md writes last (manifest, lineage, config hash and data "
        "cursor are checked). DCPMetadata: DCP's .metadata, as torchtitan writes its "
        "checkpoints (only its presence is checked: no manifest, lineage or config check).",
    )

    claim_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="PersistentVolumeClaim (RWX) mounted at root in every worker pod.",
    )

    def worker_config(self) -> config.CheckpointConfig:
        return config.CheckpointConfig.model_validate(
            self.model_dump(by_alias=True, exclude={"claim_name", "completion"})
        )


PROFILE_ONLY_RESOURCES = ("rdma/", "hugepages-")
"""Resource name prefixes only a profile grants (the chart's admissionPolicies default)."""
RESERVED_ENV_PREFIX = "FSDP_"  # the worker reads this prefix (FSDP_WORKER_CONFIG_FILE, ...)
RESERVED_VOLUME_PREFIX = "fsdp-"  # the operator's own volumes
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
QUALIFIED_NAME_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
# Annotations that loosen a container's confinement: Pod Security "baseline" forbids them.
CONFINEMENT_ANNOTATIONS = (
    "container.apparmor.security.beta.kubernetes.io/",
    "seccomp.security.alpha.kubernetes.io/",
    "container.seccomp.security.alpha.kubernetes.io/",
)
# The generated Volume holds exactly the sources Pod Security "restricted" allows.
_VOLUME_SOURCES = tuple(name for name in kubetypes.Volume.model_fields if name != "name")


def _reserved_name(
    *, pattern: str, max_length: int, prefix: str, description: str
) -> Any:  # a FieldInfo
    """A name field that may not start with the operator's `prefix`: CEL at admission."""
    message = f"names starting with {prefix} are reserved for the operator"
    rule = _cel(f"!self.startsWith('{prefix}')", message)
    return Field(
        pattern=pattern,
        max_length=max_length,
        description=description,
        json_schema_extra=_rules(rule),
    )


def _refuse_reserved(name: str, *, kind: str, prefix: str) -> str:
    """The same rule in the operator's check (the model also reads specs the CRD never saw)."""
    if name.startswith(prefix):
        raise ValueError(
            f"{kind} name {name!r}: names starting with {prefix!r} are reserved for the"
            " operator; choose another name"
        )
    return name


class EnvVar(kubetypes.EnvVar):
    """A worker env var: Kubernetes' EnvVar without `$(VAR)` expansion or the operator's names."""

    name: str = _reserved_name(
        pattern=ENV_NAME_PATTERN,
        max_length=128,
        prefix=RESERVED_ENV_PREFIX,
        description=f"Variable name; names starting with {RESERVED_ENV_PREFIX} are reserved.",
    )
    value: str | None = Field(
        None,
        max_length=4096,
        description="The value, as written: it must not contain '$(' (Kubernetes would expand "
        "it). Or set valueFrom.",
        json_schema_extra=_rules(
            _cel(NO_VAR_EXPANSION, "value must not contain '$(' (variable expansion)")
        ),
    )

    @pydantic.field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        return _refuse_reserved(name, kind="env", prefix=RESERVED_ENV_PREFIX)

    @pydantic.field_validator("value")
    @classmethod
    def _no_expansion(cls, value: str | None) -> str | None:
        if value is not None and "$(" in value:
            raise ValueError(f"env value {value!r} must not contain '$(' (variable expansion)")
        return value


_ONE_SOURCE = " + ".join(f"(has(self.{k}) ? 1 : 0)" for k in _VOLUME_SOURCES) + " <= 1"


class Volume(kubetypes.Volume):
    """A pod volume of one of the sources Pod Security "restricted" allows (no hostPath, ...)."""

    name: str = _reserved_name(
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        prefix=RESERVED_VOLUME_PREFIX,
        description=f"Volume name; names starting with {RESERVED_VOLUME_PREFIX} are reserved.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=_rules(_cel(_ONE_SOURCE, "a volume may have at most one source"))
    )

    @pydantic.field_validator("name")
    @classmethod
    def _not_reserved(cls, name: str) -> str:
        return _refuse_reserved(name, kind="volume", prefix=RESERVED_VOLUME_PREFIX)

    @pydantic.model_validator(mode="after")
    def _one_source(self) -> Volume:
        given = [k for k in _VOLUME_SOURCES if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"volume {self.name!r} has sources {given}; at most one is allowed")
        return self


LabelValue = Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]
_KEYS_RULE = _cel(
    f"self.all(k, k.size() <= 316 && k.matches(r'{QUALIFIED_NAME_PATTERN}'))",
    "keys must be qualified names: [prefix/]name, name of [A-Za-z0-9-_.] (<= 63),"
    " prefix a DNS subdomain",
)
_CONFINEMENT_RULE = _cel(
    "!self.exists(k, "
    + " || ".join(f"k.startsWith('{prefix}')" for prefix in CONFINEMENT_ANNOTATIONS)
    + ")",
    "AppArmor and seccomp annotations are the operator's (it sets RuntimeDefault)",
)


def _check_keys(values: dict[str, str], *, what: str) -> dict[str, str]:
    for key in values:
        name = key.rsplit("/", 1)[-1]
        if len(key) > 316 or len(name) > 63 or not re.fullmatch(QUALIFIED_NAME_PATTERN, key):
            raise ValueError(
                f"{what} key {key!r} is not a qualified name ([prefix/]name, name <= 63"
                " characters of [A-Za-z0-9-_.], prefix a DNS subdomain)"
            )
    return values


class Capability(enum.StrEnum):
    """A capability a runtime profile may grant: what GPU networking needs, nothing more."""

    IPC_LOCK = "IPC_LOCK"  # RDMA: pin (register) memory for InfiniBand/RoCE verbs
    SYS_NICE = "SYS_NICE"  # NUMA binding and thread priorities of data-loader and NCCL threads


class PodOverrides(_Model):
    """`spec.template.spec`: the pod fields a user may set, as Kubernetes types them.

    Anything else in the pod is the operator's (security context, command, ports, hostname).
    """

    node_selector: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels a node must have to run a worker pod.",
        json_schema_extra=_rules(_KEYS_RULE),
    )
    tolerations: list[kubetypes.Toleration] = Field(
        default_factory=list,
        max_length=64,
        description="Taints the worker pods tolerate (e.g. those of GPU nodes).",
        json_schema_extra=_rules(*_TOLERATION_RULES),
    )
    affinity: kubetypes.Affinity | None = Field(
        None,
        description="Node and pod affinity of the worker pods. The operator adds its own "
        "rules: one worker pod per node, and none on nodes excluded after a failure.",
    )
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=64,
        description='More volumes for the worker pods, of the sources Pod Security "restricted" '
        "allows (no hostPath), one source each.",
    )
    volume_mounts: list[kubetypes.VolumeMount] = Field(
        default_factory=list,
        max_length=64,
        description="Where the worker container mounts those volumes; not at /dev/shm, /tmp, "
        "the termination log or checkpoint.root, which the operator mounts.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        max_length=128,
        description="More environment variables of the worker container, after the operator's "
        "own.",
    )
    termination_grace_period_seconds: int = Field(
        120,
        ge=1,
        le=86_400,
        description="Time a worker gets on SIGTERM to finish its step and save a checkpoint.",
    )
    priority_class_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="PriorityClass of the worker pods; the system-* classes are refused (they "
        "would let training preempt the pods that keep nodes and the cluster running).",
        json_schema_extra=_rules(
            _cel("!self.startsWith('system-')", "the system-* priority classes are reserved")
        ),
    )
    scheduler_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="Scheduler that places the worker pods; unset: the cluster's default.",
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=len(Capability),
        description="Linux capabilities added to the worker container (all others stay "
        "dropped). Only with spec.runtimeProfile, and only those its profile grants.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )

    @pydantic.field_validator("priority_class_name")
    @classmethod
    def _not_system(cls, name: str | None) -> str | None:
        if name is not None and name.startswith("system-"):
            raise ValueError(
                f"priorityClassName {name!r}: the system-* priority classes are reserved for"
                " the pods that keep nodes and the cluster running"
            )
        return name

    @pydantic.field_validator("node_selector")
    @classmethod
    def _selector_keys(cls, values: dict[str, str]) -> dict[str, str]:
        return _check_keys(values, what="nodeSelector")


class TemplateMetadata(_Model):
    """`spec.template.metadata`: labels and annotations the user adds to the job's objects."""

    labels: dict[str, LabelValue] = Field(
        default_factory=dict,
        max_length=64,
        description="Labels added to every worker pod and to the job's headless Service. Keys "
        "under fsdpoperator.io/ and the operator's own label keys are dropped.",
        json_schema_extra=_rules(_KEYS_RULE),
    )
    annotations: dict[str, Annotated[str, Field(max_length=65_536)]] = Field(
        default_factory=dict,
        max_length=64,
        description="Annotations added to every worker pod. Keys under fsdpoperator.io/ are "
        "dropped; AppArmor and seccomp ones are refused (the operator sets RuntimeDefault).",
        json_schema_extra=_rules(_KEYS_RULE, _CONFINEMENT_RULE),
    )

    @pydantic.field_validator("labels")
    @classmethod
    def _label_keys(cls, values: dict[str, str]) -> dict[str, str]:
        return _check_keys(values, what="label")

    @pydantic.field_validator("annotations")
    @classmethod
    def _annotation_keys(cls, values: dict[str, str]) -> dict[str, str]:
        for key in values:
            if key.startswith(CONFINEMENT_ANNOTATIONS):
                raise ValueError(
                    f"annotation {key!r} sets a container's AppArmor or seccomp profile, which"
                    " Pod Security forbids users to loosen; the operator sets RuntimeDefault"
                )
        return _check_keys(values, what="annotation")


class PodTemplate(_Model):
    """`spec.template`: pod overrides merged into every worker pod."""

    metadata: TemplateMetadata = Field(
        default_factory=TemplateMetadata,
        description="Labels and annotations for the worker pods.",
    )
    spec: PodOverrides = Field(
        default_factory=PodOverrides,
        description="The pod fields a user may set, as Kubernetes types them. The rest of the "
        "pod (security context, command, ports, hostname) is the operator's.",
    )


MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"
SCRIPT_PATTERN = r"^/[A-Za-z0-9._/+-]*[A-Za-z0-9_+-]$"
_ARG_REFERENCE = re.compile(r"\(([A-Za-z_][A-Za-z0-9_]*)\)")


def arg_parts(arg: str) -> list[tuple[str, bool]]:
    """A trainer argument as Kubernetes reads it: literal text and `$(NAME)` references, as
    (text, is_reference) pairs; `$$` is a literal `$`, as in a container's args."""
    parts: list[tuple[str, bool]] = []
    literal, i = "", 0
    while i < len(arg):
        ref = _ARG_REFERENCE.match(arg, i + 1) if arg[i] == "$" else None
        if arg.startswith("$$", i):
            literal, i = literal + "$", i + 2
        elif ref is not None:
            parts += [(literal, False), (ref.group(1), True)]
            literal, i = "", ref.end()
        else:
            literal, i = literal + arg[i], i + 1
    return [p for p in [*parts, (literal, False)] if p[0]]


class Trainer(_Model):
    """`spec.trainer`: the team's own training code, in `spec.image`, started by the operator's
    torchrun (rendezvous, ranks, restarts and environment stay the operator's: see
    docs/contract.md). Without it every rank runs the built-in trainer."""

    module: str | None = Field(
        None,
        pattern=MODULE_PATTERN,
        max_length=256,
        description="Python module each rank runs (`torchrun -m <module>`), e.g. team.train.",
    )
    script: str | None = Field(
        None,
        pattern=SCRIPT_PATTERN,
        max_length=1024,
        description="Or an absolute path of a Python script in the image (`torchrun <script>`).",
        json_schema_extra=_rules(_cel("!self.contains('/../')", "script must not contain /../")),
    )
    args: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list,
        max_length=256,
        description="Arguments after the module or script, passed as a list (no shell). "
        "$(FSDP_CHECKPOINT_ROOT) and the other variables docs/contract.md lists for arguments "
        "are expanded; every other $ reaches the trainer as written.",
    )

    model_config = pydantic.ConfigDict(
        json_schema_extra=_rules(
            _cel("has(self.module) != has(self.script)", "set exactly one of module and script")
        )
    )

    @pydantic.model_validator(mode="after")
    def _one_entry(self) -> Trainer:
        if (self.module is None) == (self.script is None):
            raise ValueError(
                f"trainer: set exactly one of module and script (got module={self.module!r},"
                f" script={self.script!r})"
            )
        if self.script is not None and "/../" in self.script:
            raise ValueError(f"trainer.script {self.script!r} must not contain /../")
        for index, arg in enumerate(self.args):
            refs = [text for text, is_ref in arg_parts(arg) if is_ref]
            unknown = [n for n in refs if n not in contract.ARG_VARIABLES]
            if unknown:
                raise ValueError(
                    f"trainer.args[{index}]={arg!r} references $({unknown[0]}); arguments may"
                    f" reference only {', '.join(contract.ARG_VARIABLES)} (write $$( for a"
                    " literal $()"
                )
        return self


_SPEC_RULES = _rules(
    _cel(
        "!has(self.spares) || self.spares == 0 || (has(self.failurePolicy) &&"
        " has(self.failurePolicy.inPlaceRestarts) && self.failurePolicy.inPlaceRestarts > 0)",
        "spares needs failurePolicy.inPlaceRestarts > 0: a spare joins the gang in a restart in"
        " place",
        fieldPath=".spares",
    ),
    _cel(
        "!has(self.checkpoint) || !has(self.checkpoint.memory) || (has(self.failurePolicy) &&"
        " has(self.failurePolicy.inPlaceRestarts) && self.failurePolicy.inPlaceRestarts > 0)",
        "checkpoint.memory needs failurePolicy.inPlaceRestarts > 0: the memory tier survives"
        " only restarts in place",
        fieldPath=".checkpoint.memory",
    ),
    _cel(
        "!has(self.minReplicas) || self.minReplicas <= self.replicas",
        "minReplicas must be <= replicas",
        fieldPath=".minReplicas",
    ),
    _cel(
        # Guarded: replicas 0 (refused by its own minimum) would add "modulus by zero" beside
        # the real error.
        "self.replicas < 1 || self.nprocPerNode < 1 || self.training.microBatchSize < 1 ||"
        " self.training.globalBatchSize % (self.training.microBatchSize * self.replicas"
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
        "!has(self.template.spec.capabilities) || size(self.template.spec.capabilities) == 0"
        " || has(self.runtimeProfile)",
        "template.spec.capabilities needs spec.runtimeProfile: capabilities come only from a"
        " runtime profile the cluster admin made",
        fieldPath=".template.spec.capabilities",
    ),
    _cel(
        "has(self.runtimeProfile) || !has(self.resources) || "
        + " && ".join(
            f"(!has(self.resources.{part}) || self.resources.{part}.all(k, "
            + " && ".join(f"!k.startsWith('{p}')" for p in PROFILE_ONLY_RESOURCES)
            + "))"
            for part in ("limits", "requests")
        ),
        "resources under rdma/ and hugepages- come only from a runtime profile"
        " (spec.runtimeProfile)",
        fieldPath=".resources",
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
    trainer: Trainer | None = Field(
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
    checkpoint: CheckpointSpec = Field(
        default_factory=CheckpointSpec,
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
        if self.runtime_profile is None and (refused := resource_refusal(self, granted={})):
            raise ValueError(refused)
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


quantity = config.quantity  # the worker's config holds it: checkpoint.memory.sizeLimit's too


# --- Runtime profiles -------------------------------------------------------------------------
# An FSDPRuntimeProfile is the cluster admin's: cluster-scoped, and no tenant role may write it.
# A job names one in spec.runtimeProfile. The chart's admission policies check every FSDPJob
# that names one and every pod the operator makes under one against it (the API server's
# ValidatingAdmissionPolicy with the profile as its parameter); `refusal` below is the
# operator's own copy of the job-level check.

PROFILE_KIND = "FSDPRuntimeProfile"
PROFILE_PLURAL = "fsdpruntimeprofiles"
PROFILE_SINGULAR = "fsdpruntimeprofile"
PROFILE_SHORT_NAMES = ["fsdprp"]
RESTRICTED_PROFILE = "restricted"
"""The chart's own profile, which grants nothing: the admission policy's parameter for every
pod made under no profile (or under one the chart does not bind)."""
REGISTRY_PATTERN = (
    r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]([-a-z0-9._]*[a-z0-9])?)*$"
)
_OWN_RESOURCES = ("cpu", "memory", "ephemeral-storage")


class ProfileEnv(EnvVar):
    """A variable every worker pod under the profile gets (a job's own env wins)."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_rules(
            _cel("has(self.value) && !has(self.valueFrom)", "a profile's env sets value only")
        )
    )

    @pydantic.model_validator(mode="after")
    def _value_only(self) -> ProfileEnv:
        if self.value is None or self.valueFrom is not None:
            raise ValueError(f"profile env {self.name!r}: set value (and no valueFrom)")
        return self


DnsLabel = Annotated[str, Field(max_length=63, pattern=DNS_LABEL_PATTERN)]
ObjectName = Annotated[str, Field(max_length=253, pattern=NAME_PATTERN)]


class RuntimeProfileSpec(_Model):
    """`spec` of an FSDPRuntimeProfile: what its jobs may have beyond restricted, and get."""

    namespaces: list[DnsLabel] = Field(
        default_factory=list,
        max_length=1024,
        description="The namespaces whose FSDPJobs may name this profile (empty: none).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        max_length=len(Capability),
        description="Capabilities a job may ask for in template.spec.capabilities.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    resources: dict[str, kubetypes.Quantity] = Field(
        default_factory=dict,
        max_length=16,
        description="Resources added to every worker container's requests and limits, e.g. "
        "{rdma/ib: 1, hugepages-2Mi: 2Gi}. Names under rdma/ and hugepages- come only from a "
        "profile; a job may ask for at most these amounts. Not cpu, memory or "
        "ephemeral-storage (the job's own).",
        json_schema_extra=_rules(
            _KEYS_RULE,
            _cel(
                "self.all(k, !(k in " + str(list(_OWN_RESOURCES)) + "))",
                "resources may not name cpu, memory or ephemeral-storage (the job's own)",
            ),
        ),
    )
    runtime_class_name: str | None = Field(
        None,
        pattern=NAME_PATTERN,
        max_length=253,
        description="RuntimeClass of the worker pods (e.g. nvidia).",
    )
    shm_size: kubetypes.Quantity | None = Field(
        None,
        description="Size limit of the worker pods' /dev/shm (a memory-backed emptyDir; unset: "
        "no limit of its own, the pod's memory bounds it).",
    )
    env: list[ProfileEnv] = Field(
        default_factory=list,
        max_length=64,
        description="Variables every worker container gets, e.g. NCCL_IB_HCA, NCCL_SOCKET_IFNAME;"
        " a job's own env of the same name wins.",
    )
    image_registries: list[Annotated[str, Field(max_length=255, pattern=REGISTRY_PATTERN)]] = Field(
        default_factory=list,
        max_length=64,
        description="Registries (host[:port][/path]) a job's image must come from, matched "
        "as written: `registry.example.com/team` admits registry.example.com/team/<image>. "
        "Empty: any.",
    )
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets (in the job's namespace) the worker pods pull their image with.",
    )
    priority_class_names: list[ObjectName] = Field(
        default_factory=list,
        max_length=64,
        description="PriorityClasses a job may set in template.spec.priorityClassName. Empty: "
        "any (the system-* ones stay refused).",
    )

    @pydantic.field_validator("resources")
    @classmethod
    def _resources(cls, values: dict[str, Any]) -> dict[str, Any]:
        own = [k for k in values if k in _OWN_RESOURCES]
        if own:
            raise ValueError(f"resources may not name {own[0]!r} (the job's own)")
        _check_keys({k: str(v) for k, v in values.items()}, what="resource")
        return values

    def refusal(self, spec: FSDPJobSpec, *, namespace: str, name: str) -> str:
        """Why a job in `namespace` may not have `spec` under this profile ("" when it may).
        The chart's admission policy for FSDPJobs says the same at admission."""
        if namespace not in self.namespaces:
            return (
                f"spec.runtimeProfile={name!r}: namespace {namespace!r} is not one of the"
                f" profile's namespaces {self.namespaces}"
            )
        extra = [str(c) for c in spec.template.spec.capabilities if c not in self.capabilities]
        if extra:
            return (
                f"spec.template.spec.capabilities: {extra[0]} is not granted by runtime profile"
                f" {name!r} (it grants {[str(c) for c in self.capabilities]})"
            )
        if self.image_registries and not any(
            spec.image.startswith(r + "/") for r in self.image_registries
        ):
            return (
                f"spec.image={spec.image!r} is not from a registry runtime profile {name!r}"
                f" allows {self.image_registries}"
            )
        wanted = spec.template.spec.priority_class_name
        if self.priority_class_names and wanted and wanted not in self.priority_class_names:
            return (
                f"spec.template.spec.priorityClassName={wanted!r} is not one runtime profile"
                f" {name!r} allows {self.priority_class_names}"
            )
        return resource_refusal(spec, granted=self.resources, profile=name)


def resource_refusal(
    spec: FSDPJobSpec, *, granted: dict[str, Any], profile: str | None = None
) -> str:
    """A profile-only resource (rdma/, hugepages-) the job asks for beyond its profile's."""
    asked = {**(spec.resources.requests or {}), **(spec.resources.limits or {})}
    for key, value in asked.items():
        if not key.startswith(PROFILE_ONLY_RESOURCES):
            continue
        if key not in granted:
            where = f"runtime profile {profile!r}" if profile else "no runtime profile"
            return (
                f"spec.resources: {key} comes only from a runtime profile, and {where}" " grants it"
            )
        if quantity(value) > quantity(granted[key]):
            return (
                f"spec.resources: {key}={value} exceeds runtime profile {profile!r}'s"
                f" {granted[key]}"
            )
    return ""


class FSDPRuntimeProfile(_Model):
    """The object as the operator reads it: only its spec matters."""

    spec: RuntimeProfileSpec
