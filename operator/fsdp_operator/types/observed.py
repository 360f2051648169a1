"""What the operator saw in one pass: pods, nodes, checkpoints and rank 0's progress.

Plain frozen dataclasses built by io/observe.py (from API objects; the workers' own JSON
documents by io/reports.py) and read by the policies, so decisions are testable as truth tables
without a cluster. Everything here is parsed already: no JSON, no I/O, no clock, no kopf.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any, overload

from fsdp_operator.types import api, queueing, status
from fsdp_worker import contract


class PodPhase(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


@dataclasses.dataclass(frozen=True)
class Termination:
    """The worker's JSON termination message (contract.TERMINATION_KEYS and the optional keys),
    parsed once by io/reports.py. Every field is empty when it wrote none, or not JSON: a
    report is advice, and a pod without one is judged by its exit code and reason."""

    kind: str | None = None
    """Its `class`: a contract.FailureClass or contract.RecordClass value."""
    step: int | None = None  # the last step the rank completed
    exit_code: int | None = None  # the worker's own (`exitCode`)
    words: str = ""  # its `message`
    phase: str | None = None  # where the rank was (flight.Recorder.where)
    memory: Mapping[str, Any] | None = None  # its memory figures
    ledger: Mapping[str, Any] | None = None  # the ledger's planned bytes per rank
    sums: tuple[int, float, float] | None = None  # rank 0's steps run, train and blocked seconds
    milestones: Mapping[str, float] = dataclasses.field(default_factory=dict)  # rank 0's final
    sealed_step: int | None = None  # a COMPLETED report's newest sealed step
    resumed_from: int | None = None  # rank 0's final: the step it loaded (-1: none), once loaded
    from_memory: bool = False  # ...and whether from the memory tier


SCHEDULER_MESSAGE_LIMIT = 1024
"""Characters of a pod's PodScheduled message kept (a large cluster's lists every node kind)."""


@dataclasses.dataclass(frozen=True)
class SidecarView:
    """A team's native sidecar (restartPolicy Always) of a worker pod: never a rank, so its
    restarts are told, not judged (policy/sidecars.py)."""

    name: str
    restarts: int = 0
    reason: str = ""  # its last termination's: OOMKilled, Error, Completed
    exit_code: int | None = None


@dataclasses.dataclass(frozen=True)
class PodView:
    """One worker pod, reduced to what decisions need."""

    name: str
    attempt: int
    rank: int
    phase: PodPhase
    node: str | None = None
    deleting: bool = False  # deletionTimestamp is set
    exit_code: int | None = None
    reason: str = ""  # container terminated reason: Error, OOMKilled, Completed
    message: str = ""  # termination message (JSON from the worker, or log tail)
    finished: float | None = None  # container finishedAt
    disrupted: bool = False  # DisruptionTarget condition (eviction, preemption, taint)
    unschedulable: bool = False  # PodScheduled=False reason Unschedulable
    scheduler_message: str = ""  # PodScheduled=False's message: the scheduler's own reason
    image_error: str = ""  # waiting reason such as ErrImagePull, InvalidImageName
    ip: str | None = None
    ready: bool | None = None  # Ready condition (None: none yet); rank 0's is its progress probe
    ready_changed: float | None = None  # that condition's lastTransitionTime
    ready_reason: str = ""  # that condition's reason (the kubelet always gives one for False)
    gated: bool = False  # Kueue's admission scheduling gate: queued, not unschedulable
    queue_evicted: str = ""  # Kueue's TerminationTarget (preemption): its reason and message
    spare: int | None = None  # a warm spare's number (rank -1 until it takes a node's place)
    termination: Termination = dataclasses.field(default_factory=Termination)  # `message`'s
    sidecars: tuple[SidecarView, ...] = ()  # the team's sidecars that restarted (never ranks)

    @property
    def probe_failed(self) -> bool:
        """Ready is False by the kubelet's own verdict (for rank 0: its progress probe). The
        node lifecycle controller also turns Ready False, on every pod of a node it finds
        silent, keeping the True condition's empty reason: that says nothing of the probe
        (seen after a 45 s API-server stall at Kubernetes' default 50 s grace)."""
        return self.ready is False and bool(self.ready_reason)


class ConflictKind(enum.StrEnum):
    """Why something the job would create, or would resume from, is not the job's own."""

    PREVIOUS_JOB = "PreviousJobTerminating"  # an earlier FSDPJob of this name still holds it
    FOREIGN = "NameConflict"  # someone else's object carries this job's name or labels
    CHECKPOINTS = "CheckpointsOfAnotherJob"  # the checkpoint directory holds another job's


@dataclasses.dataclass(frozen=True)
class Conflict:
    """An object with this job's name, labels or checkpoint directory that it does not own."""

    kind: ConflictKind
    what: str  # e.g. "pod train-a1-0", "checkpoint ./step-500"
    owner: str  # e.g. "FSDPJob train uid 1234...", "no controller"

    def describe(self) -> str:
        return f"{self.what} is owned by {self.owner}"


@dataclasses.dataclass(frozen=True)
class NodeView:
    name: str
    ready: bool
    not_ready_since: float | None = None  # when Ready stopped being True
    schedulable: bool = True  # not cordoned
    fits: bool = True  # a worker pod of this job fits (selector, taints, free resources)
    lease_silent_seconds: float | None = None
    """Set when the node is lost by its Lease (nodelease.py): no renewal seen for this long."""
    lease_quiet: bool = False
    """It missed a Lease renewal (lost or not yet): its jobs' rank 0 is scraped every second."""
    lease_renewed: float | None = None
    """When (the pass's clock) the operator last saw its Lease renewed; None while the Lease
    watch cannot tell (stalled, off)."""
    lease_period: float | None = None
    """Its kubelet's renew period (a quarter of the Lease's duration)."""

    @property
    def usable(self) -> bool:
        """Ready, and its kubelet still renews its Lease."""
        return self.ready and self.lease_silent_seconds is None


class NodeIndex(Sequence[NodeView]):
    """Nodes by name, each view made when first asked for: a pass of a healthy job reads only
    its pods' nodes; the capacity estimate, when a pass needs it, all of them."""

    def __init__(self, names: Sequence[str], make: Callable[[str], NodeView]) -> None:
        self._names = list(names)
        self._make = make
        self._made: dict[str, NodeView] = {}
        self._known = set(self._names)

    def get(self, name: str | None) -> NodeView | None:
        if name is None or name not in self._known:
            return None
        view = self._made.get(name)
        if view is None:
            view = self._made[name] = self._make(name)
        return view

    def __len__(self) -> int:
        return len(self._names)

    @overload
    def __getitem__(self, i: int) -> NodeView: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[NodeView]: ...
    def __getitem__(self, i: int | slice) -> NodeView | Sequence[NodeView]:
        if isinstance(i, slice):
            return [v for n in self._names[i] if (v := self.get(n)) is not None]
        view = self.get(self._names[i])
        assert view is not None
        return view


@dataclasses.dataclass(frozen=True)
class InPlaceRecord:
    """A rank failure the attempt's pods restarted from in place: the record its node's keeper
    made (fsdp_worker.keeper.gang), as rank 0 serves it, parsed by io/reports.py."""

    generation: int  # the generation that failed
    node: int = 0  # the node rank it failed on
    termination: Termination = dataclasses.field(default_factory=Termination)
    message: str = ""  # that termination message as the failing pod would carry it (JSON)
    exit_code: int | None = None  # torchrun's
    reason: str = ""  # the container's, e.g. OOMKilled (an OOM kill seen in its cgroup)
    time: float | None = None  # when it failed
    detected: float | None = None  # when its keeper saw it
    memory_step: int | None = None  # the newest step checkpoint.memory held then
    taken_over: bool = False  # a spare took the failed node's place (the operator's replace)
    pod: str = ""  # then the pod it replaced (lost or frozen),
    node_name: str | None = None  # and that pod's node


@dataclasses.dataclass(frozen=True)
class ClaimView:
    """spec.checkpoint.claimName's PersistentVolumeClaim, read while the attempt's pods wait
    on their nodes (a volume that cannot be attached to all of them keeps them there)."""

    name: str
    found: bool
    access_modes: tuple[str, ...] = ()

    @property
    def shared(self) -> bool:
        """Whether pods on different nodes can all mount it."""
        return "ReadWriteMany" in self.access_modes


@dataclasses.dataclass(frozen=True)
class Progress:
    """Rank 0's metrics endpoint, as last scraped (this attempt's process)."""

    step: int | None
    last_step_time: float | None = None
    milestones: Mapping[str, float] = dataclasses.field(default_factory=dict)  # contract names
    steps_run: int | None = None
    train_seconds: float | None = None
    blocked_seconds: float | None = None
    interval: status.CheckpointInterval | None = None
    memory: status.MemoryTier | None = None  # checkpoint.memory's interval and last save
    checkpoint_step: int | None = None  # the newest step it sealed (None: none yet)
    resumed_from: int | None = None  # the step it resumed from, -1 fresh (None: not reported)
    quarantined: tuple[int, ...] = ()  # steps it set aside at resume (it chose: auto)
    generation: int = 0  # restarts in place before this process (fsdp_worker.keeper.gang)
    resumed_from_memory: bool = False  # resumed_from came from the memory tier
    restarts_in_place: tuple[InPlaceRecord, ...] = ()  # their failure records, by generation
    slow_rank: int | None = None  # the global rank rank 0 names slow (None: none, or not told)
    slowdown: float | None = None  # the slowest rank's compute over the others' median


BLIND_AFTER = 3
"""Scrapes in a row that could not reach rank 0's pod (no answer: a NetworkPolicy drops them,
a network in the way) after which the operator no longer reads its own silence as the job's: a
hang is then judged on the kubelet's readiness probe of rank 0 (detect._hung). Three, about 6 s
with the prober's backoff: one or two slow answers on a loaded node are no news. A refused
connection reached the pod (its server is not up, or has stopped): that is the pod's state,
judged as ever."""


@dataclasses.dataclass(frozen=True)
class ScrapeHealth:
    """How the operator's scrapes of rank 0's metrics endpoint have gone lately."""

    pod: str  # rank 0's pod the endpoint belongs to
    failures: int  # scrapes in a row that could not reach the pod (0: the last one reached it)
    error: str = ""  # what the last failed scrape met
    address: str = ""  # ip:port scraped
    answered: bool = True  # a scrape of this pod got its metrics (False: refused every time)

    @property
    def blind(self) -> bool:
        return self.failures >= BLIND_AFTER


GANG_SILENT_SECONDS = 5.0
"""A keeper that has not asked its coordinator for this long (it asks every 0.2 s) cannot take
part in a restart in place: its pod is frozen, or it gave up and waits for the operator."""


@dataclasses.dataclass(frozen=True)
class GangHealth:
    """What the in-place gang's coordinator (node rank 0's keeper) said when the operator asked,
    past a hang's deadline, whether a restart in place can still come."""

    answered: bool
    error: str = ""  # why it did not answer
    final: bool = False  # a keeper gave up restarting in place
    silent: Mapping[int, float] = dataclasses.field(default_factory=dict)  # node -> seconds
    gathering: bool = False  # a promoted spare's coordinator waits for the others to rejoin
    late_seconds: float | None = None
    """Not answered: for how long, in a row, it has accepted the operator's asks and said nothing
    (contract.keeper.AnswerLate: the process is there, slow or frozen); None when it answered or
    could not be reached at all."""

    @classmethod
    def of(cls, answer: Mapping[str, Any]) -> GangHealth:
        quiet = answer.get("quiet") if isinstance(answer.get("quiet"), dict) else {}
        silent = {
            int(n): float(t)
            for n, t in (quiet or {}).items()
            if str(n).isdigit() and isinstance(t, int | float) and t >= GANG_SILENT_SECONDS
        }
        return cls(
            answered=True,
            final=bool(answer.get("final")),
            silent=silent,
            gathering=bool(answer.get("gathering")),
        )

    @property
    def restarting(self) -> bool:
        """Whether every keeper is there to restart the ranks in place."""
        return self.answered and not self.final and not self.silent

    def why_not(self) -> str:
        """Why the gang cannot restart in place ("" when it can)."""
        if not self.answered:
            return f"the gang's coordinator did not answer ({self.error})"
        if self.final:
            return "the gang stopped restarting in place"
        quiet = ", ".join(f"node {n} for {t:.0f}s" for n, t in sorted(self.silent.items()))
        return f"keepers silent: {quiet}" if quiet else ""


@dataclasses.dataclass(frozen=True)
class Observed:
    """Everything one reconcile pass knows. `now` is passed in: decisions never read a clock."""

    spec: api.FSDPJobSpec
    generation: int
    now: float
    pods: Sequence[PodView] = ()
    nodes: Sequence[NodeView] = ()
    checkpoint: status.CheckpointRef | None = None  # newest that passes catalog + lineage
    corrupt_checkpoints: Sequence[str] = ()  # failed verification: quarantine them
    checkpoints_visible: bool = True  # whether this operator can read the job's checkpoints
    checkpoint_dir: str = ""  # the job's checkpoint directory as its pods see it
    progress: Progress | None = None
    scrape: ScrapeHealth | None = None  # of the current attempt's running rank 0
    spec_error: str = ""  # what only the operator can check (templating), "" when fine
    created: float | None = None  # the FSDPJob's creationTimestamp
    conflicts: Sequence[Conflict] = ()  # never adopted: the job waits while any exists
    validated_generation: int | None = None  # a server-side dry run passed for it this pass
    created_at: float | None = None  # this process created the current attempt's pods then
    profile: api.RuntimeProfileSpec | None = None  # spec.runtimeProfile's, read this pass
    spares: Sequence[PodView] = ()  # warm spares (spec.spares): not members of the gang
    queue: queueing.Queue | None = None  # the Kueue LocalQueue the job names (its labels)
    admission: queueing.Admission | None = None  # Kueue's Workload of a queued attempt
    gang: GangHealth | None = None  # asked only in a hang's grace for a restart in place
    resume_rules: contract.ResumeRules | None = None  # the status's resumeRules, parsed
    claim: ClaimView | None = None  # checkpoint.claimName's, read only while pods wait on nodes
    # Last, and keyword-only: a field named like the status module hides it from the
    # annotations after it.
    status: status.FSDPJobStatus = dataclasses.field(kw_only=True)

    def attempt_pods(self, attempt: int) -> list[PodView]:
        return sorted((p for p in self.pods if p.attempt == attempt), key=lambda p: p.rank)

    def node(self, name: str | None) -> NodeView | None:
        if isinstance(self.nodes, NodeIndex):
            return self.nodes.get(name)
        return next((n for n in self.nodes if n.name == name), None)

    def capacity(self, excluded: Sequence[str], *, enough: int | None = None) -> int:
        """Nodes a worker pod could land on now (counting stops at `enough`: with a thousand
        nodes, a pass asks only whether the largest size it could use fits)."""
        found = 0
        for n in self.nodes:
            if n.usable and n.schedulable and n.fits and n.name not in excluded:
                found += 1
                if enough is not None and found >= enough:
                    break
        return found
