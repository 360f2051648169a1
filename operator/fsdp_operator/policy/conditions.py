"""The job's phase and conditions, and the conditions that say what the operator cannot do:
read rank 0's progress, or create what someone else holds.

A condition keeps its transition time while its status stays; each says which generation of
the spec it was set for. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

import datetime

from fsdp_operator.policy import decision
from fsdp_operator.types import observed, status

QUEUED = "Queued"  # condition: the attempt's pods wait for Kueue's admission (queueing.py)
CONFLICT = "Conflict"  # condition: objects with this job's names/labels that it does not own
RECONCILE_ERROR = "ReconcileError"  # condition: the operator's last pass failed (reconcile.py)
PROGRESS_OBSERVED = "ProgressObserved"  # condition: whether rank 0's metrics answer the operator
CONFLICT_POLL_SECONDS = 2.0  # a job waiting on someone else's objects looks again this often
PROGRESSING = frozenset(
    {status.Phase.PENDING, status.Phase.QUEUED, status.Phase.RUNNING, status.Phase.RESTARTING}
)


def stamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    d: decision.Draft, obs: observed.Observed, *, kind: str, true: bool, reason: str, msg: str
) -> None:
    value = "True" if true else "False"
    conds = [c for c in d.status.conditions if c.type != kind]
    old = next((c for c in d.status.conditions if c.type == kind), None)
    when = old.last_transition_time if old and old.status == value else stamp(obs.now)
    conds.append(
        status.Condition(
            type=kind,
            status=value,
            reason=reason,
            message=msg,
            last_transition_time=when,
            observed_generation=obs.generation,
        )
    )
    d.status.conditions = sorted(conds, key=lambda c: c.type)


def set_phase(
    d: decision.Draft, obs: observed.Observed, phase: status.Phase, reason: str, msg: str = ""
) -> None:
    """The phase, and the four conditions that mirror it."""
    s = d.status
    s.phase, s.reason, s.message = phase, reason, msg
    for kind, true in (
        ("Progressing", phase in PROGRESSING),
        ("Suspended", phase is status.Phase.SUSPENDED),
        ("Complete", phase is status.Phase.SUCCEEDED),
        ("Failed", phase is status.Phase.FAILED),
    ):
        set_condition(d, obs, kind=kind, true=true, reason=reason, msg=msg)


def progress_observed(d: decision.Draft, obs: observed.Observed) -> None:
    """Say whether the operator reads rank 0's progress. When it cannot (a NetworkPolicy that
    blocks its scrape is the common cause), step, goodput and time to resume stop moving, and
    a hang is judged on rank 0's readiness probe alone (detect._hung): never on the silence."""
    scrape = obs.scrape
    if scrape is None or 0 < scrape.failures < observed.BLIND_AFTER:
        return  # no running rank 0 to read, or one miss that may be a blip
    if not scrape.blind and not scrape.answered:
        return  # rank 0 reached but serving nothing yet: its own state (detect._hung)
    old = next((c for c in d.status.conditions if c.type == PROGRESS_OBSERVED), None)
    if not scrape.blind:
        if old is None or old.status != "True":
            msg = f"the operator's scrapes reach rank 0's metrics port at {scrape.address}"
            set_condition(d, obs, kind=PROGRESS_OBSERVED, true=True, reason="Scraped", msg=msg)
        return
    msg = (
        f"the operator's scrapes do not reach rank 0's metrics port at {scrape.address} "
        f"({scrape.failures} in a row; last: {scrape.error}). Step and goodput are not "
        "updated; a hang is judged on rank 0's readiness probe (is a NetworkPolicy blocking "
        f'the operator? docs/install.md, "Network policies")'
    )
    if old is None or old.status != "False":
        d.emit("ProgressUnobserved", msg, warning=True)
    if old is None or old.status != "False" or old.message.split(" (")[0] != msg.split(" (")[0]:
        set_condition(d, obs, kind=PROGRESS_OBSERVED, true=False, reason="ScrapeFailing", msg=msg)


def conflicts(d: decision.Draft, obs: observed.Observed) -> None:
    """Say in a condition (and once in an Event) what the job will not adopt, or that it is over.

    The objects are never touched: they are not the job's to delete.
    """
    old = next((c for c in d.status.conditions if c.type == CONFLICT), None)
    if not obs.conflicts:
        if old is not None and old.status == "True":
            set_condition(d, obs, kind=CONFLICT, true=False, reason="Resolved", msg="")
        return
    first = obs.conflicts[0]
    more = f" (and {len(obs.conflicts) - 1} more)" if len(obs.conflicts) > 1 else ""
    msg = f"{first.describe()}{more}; the job does not adopt it and waits until it is gone"
    if first.kind is observed.ConflictKind.CHECKPOINTS:
        msg = (
            f"{first.describe()}; set spec.checkpoint.resumeFromPreviousJobs: true to resume from"
            " it, or remove those checkpoints or use another checkpoint.root"
        )
    if old is None or old.status != "True" or old.message != msg:
        d.emit(first.kind.value, msg, warning=True)
    set_condition(d, obs, kind=CONFLICT, true=True, reason=first.kind.value, msg=msg)


def blocked(d: decision.Draft, obs: observed.Observed) -> bool:
    """No pods are created while anything conflicts; look again soon."""
    if obs.conflicts:
        d.again(CONFLICT_POLL_SECONDS)
    return bool(obs.conflicts)
