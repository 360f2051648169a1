"""An FSDPJob's attempts as its status records them: the failure that ended one (`Failure`),
how the next came to train (`Timeline` and its phases), the rank failures restarted from in
place (`InPlaceRestart`), and one entry per attempt (`HistoryEntry`).

A part of status.py, which re-exports every name (`status.HistoryEntry`). Pure data and pure
functions of it: no I/O, no clock reads, no kopf.
"""

from __future__ import annotations

from pydantic import Field

from fsdp_operator.types.status_base import Cause, Time, _Model

HISTORY_LIMIT = 20
IN_PLACE_LIMIT = 100  # failurePolicy.inPlaceRestarts' maximum

SYMPTOMS_LIMIT = 16


class Failure(_Model):
    """A failure the operator detected: what failed, where, and why."""

    cause: Cause = Field(
        description="Why the attempt failed, e.g. Crash, OOMKilled, NodeLost, Hang."
    )
    rank: int | None = Field(
        None, description="Node rank (pod index) of the failing pod; null: no single pod."
    )
    pod: str | None = Field(None, description="Name of the failing pod; null: no single pod.")
    node: str | None = Field(None, description="Node the failing pod ran on, if it was bound.")
    exit_code: int | None = Field(None, description="The failing container's exit code.")
    step: int | None = Field(None, description="The step the failing rank was at (its report).")
    message: str = Field(
        "",
        max_length=4096,
        description="What went wrong, in words: the failing rank's own message, else the pod's "
        "or the operator's (at most 1024 characters).",
    )
    phase: str | None = Field(
        None,
        description="Where the failing rank was, by its own record: e.g. 'backward of block 7', "
        "'checkpoint save', 'data loading'; null: it kept no record.",
    )
    diagnosis: str = Field(
        "",
        max_length=1024,
        description="The likely cause and the setting to try (an OOM's phase, a hang's odd rank "
        "out); empty when there is nothing to add to the message.",
    )
    evidence: str = Field(
        "",
        max_length=2048,
        description="Every rank's evidence compared before the pods were deleted: who is not "
        "where the others are (a hang), or what each pod's last record says.",
    )
    symptoms: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="Other pods that failed only because the failing one did (a peer gone, a "
        "collective timed out), each with its own words: never the cause while a pod with a "
        "cause of its own exists.",
    )
    evidence_ref: str | None = Field(
        None,
        description="The ConfigMap (in the job's namespace) keeping this attempt's evidence "
        "and each pod's last log lines: `fsdpctl why` and `fsdpctl logs` read it.",
    )
    time: Time = Field(
        description="When the attempt stopped being useful: the pod's exit, "
        "the node going NotReady, the last step before a hang, or the end of the pending "
        "timeout (eviction, vanished pods: when the operator saw it).",
    )


class Timeline(_Model):
    """How an attempt came to train: times in order, from its predecessor's stop (absent
    for the job's first attempt) to its own first step. Worker times are rank 0's report."""

    cause: Cause | None = Field(None, description="Why the previous attempt ended.")
    failed: Time | None = Field(None, description="The previous attempt stopped being useful.")
    detected: Time | None = Field(None, description="The operator detected that end.")
    gang_gone: Time | None = Field(None, description="No pod of an earlier attempt was left.")
    launched: Time | None = Field(None, description="This attempt's pods were created.")
    admitted: Time | None = Field(
        None,
        description="Kueue admitted its pods (a job under a queue): the wait before it is the "
        "queue's, and goodput does not count it (lostSeconds.Queued, outside fraction).",
    )
    scheduled: Time | None = Field(None, description="Every pod was bound to a node.")
    running: Time | None = Field(None, description="Every pod's container was running.")
    rendezvous: Time | None = Field(None, description="Rank 0's process group was up.")
    loaded: Time | None = Field(None, description="Model built, checkpoint loaded.")
    first_step: Time | None = Field(None, description="The first optimizer step completed.")


# (phase, milestone it ends at): each phase runs from the previous milestone to its own, so the
# phases add up to the time to resume (failed -> first step) or, for a first attempt, to the
# time to start (launched -> first step).
PHASES: tuple[tuple[str, str], ...] = (
    ("detect", "detected"),
    ("teardown", "gang_gone"),
    ("schedule", "scheduled"),
    ("start", "running"),
    ("rendezvous", "rendezvous"),
    ("load", "loaded"),
    ("firstStep", "first_step"),
)


def breakdown(tl: Timeline) -> list[tuple[str, float | None]]:
    """Seconds per phase; None where its milestone is not known (a missing one's time joins the
    next phase). The phases add up to the time to resume.

    The operator sees pods bound and running on its passes, so those times are upper bounds,
    while rank 0 stamps its own milestones. A milestone stamped later than the one after it
    therefore happened no later than that one: it is moved back to it. Phases never overlap
    and never go negative (new pods bound while old ones still terminate: schedule is 0)."""
    phases = PHASES if tl.failed is not None else PHASES[2:]
    start = tl.failed if tl.failed is not None else tl.launched
    times: list[float | None] = [getattr(tl, milestone) for _, milestone in phases]
    bound: float | None = None
    for i in reversed(range(len(times))):
        at = times[i]
        if at is not None:
            times[i] = at if bound is None else min(at, bound)
            bound = times[i]
    out: list[tuple[str, float | None]] = []
    last = start
    for (phase, _), at in zip(phases, times, strict=True):
        if at is None or last is None:
            out.append((phase, None))
            continue
        at = max(at, last)
        out.append((phase, at - last))
        last = at
    return out


def complete(tl: Timeline) -> bool:
    """Training again, and (after a failure) the old gang gone: nothing more will be learned."""
    return tl.first_step is not None and (tl.failed is None or tl.gang_gone is not None)


def time_to_resume(tl: Timeline) -> float | None:
    start = tl.failed if tl.failed is not None else tl.launched
    if start is None or tl.first_step is None:
        return None
    return max(0.0, tl.first_step - start)


class InPlaceRestart(_Model):
    """A rank failure the attempt's pods restarted from without being recreated
    (failurePolicy.inPlaceRestarts): every rank of the gang started again in its pod."""

    generation: int = Field(description="The generation that failed (0: the attempt's first).")
    failure: Failure = Field(description="Its first failure, as its rank reported it.")
    detected: Time | None = Field(
        None, description="When the operator judged the node lost (a spare's takeover only)."
    )
    rendezvous: Time | None = Field(
        None,
        description="The next generation's process group up (from the failure: the ranks "
        "killed, torchrun and the ranks started, imports, rendezvous).",
    )
    loaded: Time | None = Field(
        None, description="The next generation's checkpoint loaded (from memory or the claim)."
    )
    resumed: Time | None = Field(
        None, description="The next generation's first step (null: not trained yet)."
    )
    resumed_from_step: int | None = Field(
        None, description="The checkpoint step the next generation loaded (-1: none)."
    )
    from_memory: bool | None = Field(
        None,
        description="true: it loaded that step from the pods' memory (checkpoint.memory), "
        "false: from the claim; null: not reported yet.",
    )
    steps_lost: int | None = Field(
        None,
        description="Steps trained again after it. For a failure with no step of its own (a "
        "lost node's), from the steps rank 0 counted in the failed generation as last "
        "scraped: at least that many.",
    )
    steps_run: int = Field(0, description="Steps the failed generation completed (rank 0).")
    train_seconds: float = Field(0.0, description="Seconds those steps took.")
    blocked_seconds: float = Field(0.0, description="Seconds it was blocked on saves.")


class Swap(_Model):
    """A slow node swapped out (policy/straggler.py): the rank rank 0 named slow, where it ran,
    and the spare whose node stood free for the next attempt."""

    rank: int = Field(description="The slow rank's global rank.")
    pod: str = Field(description="Its pod.")
    node: str = Field(description="Its node, kept out of the next attempts like a lost node.")
    slowdown: float = Field(description="Its compute per step over the other ranks' median.")
    step: int = Field(description="The step the job had reached when the swap began.")
    spare: str = Field(description="The running spare pod that stood on another node.")
    spare_node: str = Field(description="That spare's node.")


class HistoryEntry(_Model):
    """One attempt: a launch of the whole gang of worker pods, and how it ended."""

    attempt: int = Field(description="The attempt's number (1 for the first).")
    started: Time | None = Field(None, description="When its pods were created.")
    ended: Time | None = Field(
        None,
        description="When the operator ended it; null while it runs, and for an "
        "attempt that completed the training.",
    )
    cause: Cause | None = Field(
        None,
        description="Why it ended (Resize and Suspended are planned stops); null like ended.",
    )
    resumed_from_step: int | None = Field(
        None,
        description="The checkpoint step it loaded; null: it started from scratch, or its pods "
        "chose the checkpoint and have not reported it yet.",
    )
    steps_lost: int | None = Field(
        None,
        description="Steps it trained past the checkpoint the next attempt resumed from: work "
        "done again. Known when the next attempt launches.",
    )
    world_size: int = Field(description="Ranks: pods x nprocPerNode.")
    detect_seconds: float | None = Field(
        None,
        description="Seconds from its failure to the operator detecting it; null for planned "
        "stops and for attempts that ended with the job.",
    )
    recover_seconds: float | None = Field(
        None,
        description="Seconds from the teardown of the attempt before it to all its own pods "
        "running; null for the first attempt.",
    )
    timeline: Timeline | None = Field(
        None,
        description="How it came to train: times from the previous attempt's stop (absent "
        "for the first attempt) to its own first step. Worker times are rank 0's report.",
    )
    failure: Failure | None = Field(
        None,
        description="The failure that ended it, as lastFailure said then (null: it did not fail).",
    )
    swap: Swap | None = Field(
        None, description="The slow node this attempt ended to swap out (cause Straggler)."
    )
    steps_run: int | None = Field(None, description="Steps this attempt completed (rank 0).")
    train_seconds: float | None = Field(None, description="Seconds those steps took.")
    blocked_seconds: float | None = Field(None, description="Seconds blocked on saves.")
    restarts_in_place: list[InPlaceRestart] = Field(
        default_factory=list,
        max_length=IN_PLACE_LIMIT,
        description="Rank failures it restarted from inside its pods, oldest first.",
    )
