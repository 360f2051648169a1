"""Where an FSDPJob's time went (`Goodput`), how far it is and when it should finish
(`Progress`), and its failure record (`Reliability`, what `checkpoint.intervalSteps: auto`
chooses from), as its status keeps them beyond the history's limit.

A part of status.py, which re-exports every name (`status.Goodput`). Pure data: no I/O, no
clock reads, no kopf.
"""

from __future__ import annotations

from pydantic import Field

from fsdp_operator.types.status_base import Time, _Model


class Goodput(_Model):
    """Where the job's wall time went, since its first attempt was launched."""

    since: Time = Field(description="When the first attempt was launched.")
    wall_seconds: float = Field(
        0.0, description="Seconds from since to now, or to the job's finish."
    )
    productive_seconds: float = Field(0.0, description="Steps that count: not redone.")
    fraction: float = Field(0.0, description="productiveSeconds / wallSeconds.")
    lost_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="By cause: Startup (first attempt to its first step), CheckpointSave "
        "(training blocked on saves), each failure cause (recovery to the next first step, plus "
        "steps redone), Other (what no measurement explains: scrape gaps, logging).",
    )
    redone_seconds: float = Field(0.0, description="Part of lostSeconds: steps computed again.")
    folded_productive_seconds: float = Field(
        0.0, description="Of attempts no longer in history (its limit): kept as totals."
    )
    folded_lost_seconds: dict[str, float] = Field(
        default_factory=dict,
        description="lostSeconds by cause of attempts no longer in history, kept as totals.",
    )
    folded_redone_seconds: float = Field(
        0.0, description="redoneSeconds of attempts no longer in history, kept as a total."
    )


class Progress(_Model):
    """How far the job is, and when it should finish at the pace it has kept lately
    (policy/progress.py)."""

    percent: float | None = Field(
        None,
        ge=0,
        le=100,
        description="step / training.steps, in percent to one decimal; null: no step known yet.",
    )
    estimated_seconds_remaining: int | None = Field(
        None,
        ge=0,
        description="Steps left x the current attempt's seconds per step / the goodput of the "
        "last hour's attempts (restarts and saves slow it; a first start does not): wall "
        "seconds to the last step. Null until a step time and a goodput are measured, and once "
        "the job failed or is suspended; 0 once it succeeded.",
    )


class Reliability(_Model):
    """The job's failure record, for `intervalSteps: auto` (beyond the history's limit)."""

    failures: int = Field(0, description="Unplanned attempt ends and restarts in place.")
    gang_failures: int = Field(
        0, description="Of those, the ones that recreated the gang (no memory tier survives)."
    )
    uptime_seconds: float = Field(0.0, description="Seconds attempts ran before they ended.")
