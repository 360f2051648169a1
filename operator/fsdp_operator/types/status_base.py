"""What every part of an FSDPJob's status is built of: the mutable model base, `Time`, and
`Cause` (why an attempt ended) with the restart budget it is charged to.

Below status.py and its parts (status_history.py, status_goodput.py), which all use these;
every name here is read through status.py (`status.Cause`, `status.Time`). Pure data: no I/O,
no clock reads, no kopf.
"""

from __future__ import annotations

import datetime
import enum
from typing import Annotated

import pydantic

from fsdp_worker.contract import config_base


def parse_rfc3339(value: str) -> float:
    """An RFC 3339 time (a status time, an object's timestamp) -> unix seconds."""
    try:
        at = datetime.datetime.fromisoformat(value)
    except ValueError:
        raise ValueError(f"{value!r} is not an RFC 3339 time") from None
    if at.tzinfo is None:
        raise ValueError(f"{value!r} has no time zone (RFC 3339 needs Z or an offset)")
    return at.timestamp()


def unix_seconds(value: object) -> object:
    """A status time as the operator computes with it: unix seconds. The status says RFC 3339;
    a number (what operators before 0.2 wrote) is taken as it is, so an upgrade reads old
    status."""
    return parse_rfc3339(value) if isinstance(value, str) else value


def rfc3339(unix: float) -> str:
    """Unix seconds as Kubernetes writes a MicroTime: UTC, microseconds, `Z`."""
    at = datetime.datetime.fromtimestamp(unix, datetime.UTC)
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


# A point in time: a float in the operator's arithmetic, RFC 3339 in the status (as Kubernetes
# APIs write times; microseconds, as in a Lease's or an Event's MicroTime).
Time = Annotated[
    float,
    pydantic.BeforeValidator(unix_seconds),
    pydantic.PlainSerializer(rfc3339, return_type=str, when_used="json"),
    pydantic.WithJsonSchema({"type": "string", "format": "date-time"}),
]


class _Model(config_base.ConfigModel):
    """Status models are rebuilt each pass by decide(), so they are mutable copies."""

    model_config = pydantic.ConfigDict(frozen=False)


class Cause(enum.StrEnum):
    """Why an attempt ended. Each cause is charged to one restart budget (budget_of)."""

    CRASH = "Crash"  # a rank exited non-zero
    OOM = "OOMKilled"
    CONFIG_ERROR = "ConfigError"  # the worker said its config is invalid: permanent
    NON_RETRYABLE = "NonRetryableExitCode"
    NODE_LOST = "NodeLost"
    EVICTED = "Evicted"  # DisruptionTarget, or the pod vanished under us
    HANG = "Hang"  # progress deadline passed
    # the deadline passed before rank 0 served at all: the gang never met (infrastructure)
    RENDEZVOUS = "RendezvousTimeout"
    UNSCHEDULABLE = "Unschedulable"  # pending timeout: shrink
    IMAGE_PULL = "ImagePullError"  # pending with image errors: permanent
    RESIZE = "Resize"  # planned restart to grow back or apply a replicas edit
    DEADLINE = "DeadlineExceeded"
    SUSPENDED = "Suspended"  # spec.suspend: a planned stop
    PREEMPTED = "Preempted"  # Kueue evicted the pod group (preemption): wait for re-admission
    STRAGGLER = "Straggler"  # a slow node swapped out for a spare's at a save: a planned stop
    CIRCUIT_BREAKER = "CircuitBreaker"  # too many restarts without a new checkpoint
    BUDGET = "RestartBudgetExhausted"
    INVALID_SPEC = "InvalidSpec"


class Budget(enum.StrEnum):
    APPLICATION = "application"
    INFRASTRUCTURE = "infrastructure"
    NONE = "none"  # planned restarts cost nothing


def budget_of(cause: Cause) -> Budget:
    if cause in (Cause.NODE_LOST, Cause.EVICTED, Cause.UNSCHEDULABLE, Cause.RENDEZVOUS):
        return Budget.INFRASTRUCTURE
    if cause in (Cause.RESIZE, Cause.SUSPENDED, Cause.PREEMPTED, Cause.STRAGGLER):
        return Budget.NONE
    return Budget.APPLICATION
