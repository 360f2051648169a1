"""Where an FSDPJob's time went (`Goodput`) and its failure record (`Reliability`, what
`checkpoint.intervalSteps: auto` chooses from), as its status keeps them beyond the history's
limit.

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


class Reliability(_Model):
    """The job's failure record, for `intervalSteps: auto` (beyond the history's limit)."""

    failures: int = Field(0, description="Unplanned attempt ends and restarts in place.")
    gang_failures: int = Field(
        0, description="Of those, the ones that recreated the gang (no memory tier survives)."
    )
    uptime_seconds: float = Field(0.0, description="Seconds attempts ran before they ended.")
