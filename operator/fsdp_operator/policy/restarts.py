"""Restart policies: budgets, circuit breaker, backoff, world size, node exclusion. Pure.

Each function answers one question from the spec, the status and what was observed; the
policies (failure.py, launch.py, decide.py) string them together. No I/O, no clock reads, no kopf.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.types import api, observed, status

PERMANENT_CAUSES = frozenset(
    {
        status.Cause.CONFIG_ERROR,
        status.Cause.NON_RETRYABLE,
        status.Cause.IMAGE_PULL,
        status.Cause.INVALID_SPEC,  # a claim the spec names does not exist (scheduling.py)
    }
)


@dataclasses.dataclass(frozen=True)
class Tunables:
    """Operator-wide knobs (settings.py fills them from the environment)."""

    node_exclusion_seconds: float = 300.0
    """How long a node blamed for a failure is kept out of new attempts."""
    max_excluded_nodes: int = 8
    """Cap on excluded nodes, so exclusion alone never starves a job of nodes."""
    drain_timeout_seconds: float = 120.0
    """A planned restart waits this long for old pods to save and exit, then moves on."""
    failure_grace_seconds: int = 5
    """Grace period when tearing down a failed gang (planned stops use the pod's own)."""


def charge(restarts: status.Restarts, cause: status.Cause) -> status.Restarts:
    """Restart counters after one more restart for `cause`."""
    budget = status.budget_of(cause)
    return restarts.model_copy(
        update={
            "total": restarts.total + (budget is not status.Budget.NONE),
            "application": restarts.application + (budget is status.Budget.APPLICATION),
            "infrastructure": restarts.infrastructure + (budget is status.Budget.INFRASTRUCTURE),
        }
    )


def made_progress(job_status: status.FSDPJobStatus, newest: status.CheckpointRef | None) -> bool:
    """Did the attempt that just ended write a checkpoint past where it resumed from?

    A checkpoint proven only by DCP's `.metadata` (`completion: DCPMetadata`) does not say
    which attempt wrote it: a step past the restart point counts as the attempt's own."""
    if newest is None or newest.attempt not in (job_status.attempt, None):
        return False
    resumed = job_status.resumed_from_step
    return resumed is None or newest.step > resumed


def stop_reason(
    *, spec: api.FSDPJobSpec, restarts: status.Restarts, cause: status.Cause
) -> tuple[status.Cause, str] | None:
    """Why the job must fail instead of restarting, or None to restart."""
    fp = spec.failure_policy
    if cause in PERMANENT_CAUSES:
        return cause, f"{cause.value} is not retryable"
    if restarts.application > fp.max_restarts:
        return status.Cause.BUDGET, f"application restarts exceed maxRestarts={fp.max_restarts}"
    if restarts.infrastructure > fp.max_infra_restarts:
        limit = fp.max_infra_restarts
        return status.Cause.BUDGET, f"infrastructure restarts exceed maxInfraRestarts={limit}"
    if restarts.without_progress >= fp.max_restarts_without_progress:
        return (
            status.Cause.CIRCUIT_BREAKER,
            f"{restarts.without_progress} failed attempts in a row wrote no new checkpoint "
            f"(maxRestartsWithoutProgress={fp.max_restarts_without_progress})",
        )
    return None


def backoff_seconds(spec: api.FSDPJobSpec, restarts: status.Restarts) -> float:
    """Delay before the next attempt.

    The first restart after progress is immediate (a crash mid-run should cost seconds); each
    further restart without a new checkpoint doubles from initialSeconds up to maxSeconds.
    """
    b = spec.failure_policy.backoff
    k = restarts.without_progress
    if k <= 1:
        return 0.0
    return float(min(b.max_seconds, b.initial_seconds * 2 ** (k - 2)))


def active_exclusions(
    job_status: status.FSDPJobStatus, *, now: float, blame: str | None, tun: Tunables
) -> list[status.ExcludedNode]:
    """Excluded nodes still in force, plus `blame` (newest kept when over the cap)."""
    kept = [e for e in job_status.excluded_nodes if e.until > now and e.node != blame]
    if blame:
        kept.append(status.ExcludedNode(node=blame, until=now + tun.node_exclusion_seconds))
    return kept[-tun.max_excluded_nodes :]


def world_size(
    *, obs: observed.Observed, excluded: list[str], cause: status.Cause | None, current: int | None
) -> int:
    """Replica count for the next attempt.

    The desired `replicas` when capacity allows; otherwise the largest size in
    [minReplicas, replicas] that keeps the global batch exact and fits the Ready nodes. After an
    Unschedulable timeout the size strictly shrinks, so a wrong capacity estimate cannot loop.
    """
    allowed = obs.spec.allowed_replicas()
    if not allowed:  # CEL guarantees replicas itself is allowed; stay defensive
        return obs.spec.replicas
    if current is None:
        return allowed[0]
    limit = max(obs.capacity(excluded, enough=allowed[0]), min(allowed))
    if cause is status.Cause.UNSCHEDULABLE:
        limit = min(limit, current - 1)
    fitting = [r for r in allowed if r <= limit]
    return fitting[0] if fitting else min(allowed)


def grow_target(obs: observed.Observed, excluded: list[str]) -> int | None:
    """A better replica count for a healthy running attempt, or None to keep it."""
    current = obs.status.replicas
    if current is None or current == obs.spec.replicas:
        return None  # at the size asked for: no node needs looking at
    allowed = obs.spec.allowed_replicas()
    capacity = obs.capacity(excluded, enough=allowed[0] if allowed else None)
    fitting = [r for r in allowed if r <= capacity]
    if obs.spec.replicas < current:  # a replicas edit down: always honoured
        return fitting[0] if fitting else min(allowed)
    if fitting and fitting[0] > current:
        return fitting[0]
    return None


GROW_RETRY_SECONDS = 300.0
"""After a resize whose attempt came out no larger than the one it stopped (the capacity
estimate counts requests, selectors and taints, not affinity terms or other schedulers), how
long this attempt trains before growing is tried again: an unbudgeted Resize must not loop.
Seen in e2e: two jobs kept off a node by their affinity grew and relaunched at the same size
every 2-3 s, 180 attempts in 8 minutes."""


def grow_came_to_nothing(s: status.FSDPJobStatus, now: float) -> bool:
    """The attempt before this one stopped to grow, and this one is no larger: hold off."""
    if len(s.history) < 2 or s.attempt_started is None or s.world_size is None:
        return False
    before = s.history[-2]
    return (
        before.cause is status.Cause.RESIZE
        and s.world_size <= before.world_size
        and now - s.attempt_started < GROW_RETRY_SECONDS
    )
