"""What one pass decides: the frozen Decision that apply() carries out, and the Draft the
policies write while decide() builds it.

A Decision is complete: the new status (written in one patch), the pods to delete and create,
the Events, when to look again, and whatever apply() needs to do it (the launch of the pods it
makes). What apply() learns by I/O on the way (a failure's evidence, a keeper's refusal) comes
back through a policy as a new Decision (failure.explained, spares.refused), so that it goes
out in the same status patch. Data and the few helpers every policy reads; no decisions here.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from fsdp_operator.types import observed, queueing, status


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclasses.dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class PodDelete:
    name: str
    force: bool = False  # grace 0: the node is gone, nobody will confirm the kill
    grace: int | None = None  # seconds; None: the pod's own terminationGracePeriodSeconds

    @property
    def grace_seconds(self) -> int | None:
        return 0 if self.force else self.grace


@dataclasses.dataclass(frozen=True)
class Launch:
    """Create every pod of `attempt` that does not exist yet (idempotent)."""

    attempt: int
    replicas: int
    resume_path: str
    excluded_nodes: tuple[str, ...] = ()
    reliability: str = ""  # FSDP_RELIABILITY (intervalSteps: auto), the same for every pod
    resume_rules: str = ""  # FSDP_RESUME_RULES, with resume_path "auto"
    queue: queueing.Queue | None = None  # the pods form a Kueue pod group
    pod_group: str = ""  # its name


@dataclasses.dataclass(frozen=True)
class Collect:
    """Before the failed attempt's pods are deleted: read each one's log tail and the ranks'
    evidence in it, compare them, keep both (reconcile.py does the I/O)."""

    attempt: int
    pods: tuple[tuple[int, str, str | None], ...]  # (node rank, pod, node) of those still there
    nproc_per_node: int
    world_size: int
    hang: bool  # compare the ranks' stall records (the others only keep logs)
    drop: tuple[int, ...] = ()  # older attempts whose evidence goes (the newest few are kept)
    unreadable: tuple[int, ...] = ()  # pods on a node that is gone or none: no log to ask for
    told: status.Failure | None = None
    """Set where the logs are kept for what is not the job's failure (pods that did not exit
    once rank 0's ended well): the ConfigMap says this, and the status is left as it is."""


@dataclasses.dataclass(frozen=True)
class Takeover:
    """Spare pod `spare` (number `index`) takes lost pod `lost`'s node rank: reconcile asks
    the gang's coordinator (`coordinator`, host:port) to `replace` it, then relabels the spare
    and force-deletes the lost pod; if the coordinator refuses, the gang is recreated.

    Node rank 0's place (its keeper was the coordinator, its ranks hosted the store): the
    spare's keeper is told to `promote` itself (`coordinator` is the spare's, `master` its
    store's host:port, `generation` the restarts in place counted so far), then every other
    gang pod's keeper (`followers`) to `follow` it. Another node rank's: the spare's keeper
    (at `spare_at`) is first told to `follow` node rank 0's coordinator and store (`master`),
    which may be another spare's since a takeover of node rank 0, not its template's."""

    spare: str
    index: int
    node_rank: int
    lost: str
    coordinator: str
    failure: dict[str, Any]
    master: str = ""
    followers: tuple[str, ...] = ()
    generation: int = 0
    spare_at: str = ""


@dataclasses.dataclass(frozen=True)
class Decision:
    """What apply() does for one pass, and the status it writes. Frozen: nothing after
    decide() changes it; a policy that learns more returns a new one."""

    delete: tuple[PodDelete, ...] = ()
    launch: Launch | None = None
    events: tuple[Event, ...] = ()
    quarantine: tuple[str, ...] = ()
    delete_job: bool = False
    release: tuple[str, ...] = ()  # Kueue Workloads to delete
    requeue_after: float | None = None
    failure: status.Failure | None = None  # detected in this pass (for metrics)
    collect: Collect | None = None  # the failed attempt's evidence, before its pods go
    recovered: status.HistoryEntry | None = None  # an attempt launched after a failure
    resumed: status.HistoryEntry | None = None  # an attempt whose timeline completed in this pass
    in_place: tuple[status.InPlaceRestart, ...] = ()  # restarts in place first seen now
    spares: tuple[int, ...] = ()  # spare pods to create (numbers)
    spare_launch: Launch | None = None  # the running attempt's launch, the spares' template
    takeover: Takeover | None = None  # a spare takes a lost node's place (run/keepers.py)
    # Last, and keyword-only: a field named like the status module hides it from the
    # annotations after it.
    status: status.FSDPJobStatus = dataclasses.field(kw_only=True)


@dataclasses.dataclass
class Draft:
    """The Decision while decide() builds it: each policy adds to it in turn."""

    delete: list[PodDelete] = dataclasses.field(default_factory=list)
    launch: Launch | None = None
    events: list[Event] = dataclasses.field(default_factory=list)
    quarantine: list[str] = dataclasses.field(default_factory=list)
    delete_job: bool = False
    release: list[str] = dataclasses.field(default_factory=list)
    requeue_after: float | None = None
    failure: status.Failure | None = None
    collect: Collect | None = None
    recovered: status.HistoryEntry | None = None
    resumed: status.HistoryEntry | None = None
    in_place: list[status.InPlaceRestart] = dataclasses.field(default_factory=list)
    stop: tuple[status.Cause, str] | None = None  # a restart in place spent a budget
    spares: list[int] = dataclasses.field(default_factory=list)
    spare_launch: Launch | None = None
    takeover: Takeover | None = None
    status: status.FSDPJobStatus = dataclasses.field(kw_only=True)

    def emit(self, reason: str, message: str, *, warning: bool = False) -> None:
        kind = EventType.WARNING if warning else EventType.NORMAL
        self.events.append(Event(kind, reason, message))

    def again(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )

    def freeze(self) -> Decision:
        return Decision(
            delete=tuple(self.delete),
            launch=self.launch,
            events=tuple(self.events),
            quarantine=tuple(self.quarantine),
            delete_job=self.delete_job,
            release=tuple(self.release),
            requeue_after=self.requeue_after,
            failure=self.failure,
            collect=self.collect,
            recovered=self.recovered,
            resumed=self.resumed,
            in_place=tuple(self.in_place),
            spares=tuple(self.spares),
            spare_launch=self.spare_launch,
            takeover=self.takeover,
            status=self.status,
        )


# --- what every policy reads -------------------------------------------------------------------
EXITED = (observed.PodPhase.SUCCEEDED, observed.PodPhase.FAILED)


def current_entry(s: status.FSDPJobStatus) -> status.HistoryEntry | None:
    """The history entry of the attempt under way (None before the first, or once dropped)."""
    entry = s.history[-1] if s.history else None
    return entry if entry is not None and entry.attempt == s.attempt else None


def node_gone(obs: observed.Observed, pod: observed.PodView) -> bool:
    """The pod's node is gone or unusable: nobody will confirm its kill (force the delete)."""
    node = obs.node(pod.node) if pod.node else None
    return bool(pod.node) and (node is None or not node.usable)
