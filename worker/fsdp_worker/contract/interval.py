"""The checkpoint interval: a fixed number of steps, or the Young/Daly optimum (`auto`).

Young (1974) and Daly (2006): with a blocking save cost `delta` and a mean time between failures
`M`, the compute time between checkpoints that maximises goodput is close to sqrt(2 delta M);
Daly's higher-order form is used here. `auto` turns that time into steps with the measured step
time, and clamps it to the user's floor and ceiling. The failure rate is the job's own: its
uptime and failures so far (the operator passes them at launch) plus the time this attempt has
run, with a prior of one failure per `prior_mtbf_seconds` before anything was seen.

Pure and torch-free (the operator imports it for status and the benchmark for its model curve).
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Annotated

import pydantic
import pydantic.dataclasses
from pydantic import Field

from fsdp_worker import contract
from fsdp_worker.contract import config_base, wire


def daly_interval_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    """Compute time between checkpoints that maximises goodput (Daly 2006, higher order)."""
    if mtbf_seconds <= 0:
        raise ValueError(f"mtbf_seconds must be > 0, got {mtbf_seconds}")
    delta = max(0.0, save_seconds)
    if delta >= 2 * mtbf_seconds:
        return mtbf_seconds
    x = math.sqrt(delta / (2 * mtbf_seconds))
    return math.sqrt(2 * delta * mtbf_seconds) * (1 + x / 3 + x * x / 9) - delta


def young_interval_seconds(save_seconds: float, mtbf_seconds: float) -> float:
    return math.sqrt(2 * max(0.0, save_seconds) * mtbf_seconds)


def model_goodput(
    *,
    interval_seconds: float,
    save_seconds: float,
    restart_seconds: float,
    mtbf_seconds: float,
    fail_while_restarting: bool = True,
) -> float:
    """Expected useful fraction of wall time under Poisson failures: work tau per segment, each
    segment costs tau + delta, a failure costs R plus the work since the last checkpoint.

    Daly (2006) lets failures strike during the restart too: wall per segment
    M e^(R/M) (e^((tau+delta)/M) - 1). With failures only while training (a fault process on
    the job's uptime, as bench/goodput.py injects), it is (M + R) (e^((tau+delta)/M) - 1).
    The best interval is the same in both: R only scales the wall time."""
    tau, delta, r, m = interval_seconds, save_seconds, restart_seconds, mtbf_seconds
    if tau <= 0 or m <= 0:
        return 0.0
    scale = m * math.exp(r / m) if fail_while_restarting else m + r
    return tau / (scale * math.expm1((tau + delta) / m))


def mtbf_estimate(*, failures: int, uptime_seconds: float, prior_seconds: float) -> float:
    """Mean time between failures: observed uptime plus one prior failure-free `prior_seconds`,
    over observed failures plus that one prior failure (a Gamma prior on the failure rate)."""
    return (max(0.0, uptime_seconds) + prior_seconds) / (max(0, failures) + 1)


def _measured(value: object) -> float | None:
    """A finite number >= 0, else None: FSDP_RELIABILITY is advice, and a figure that does not
    read is one not measured, never a failure."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def _count(value: object) -> int | None:
    measured = _measured(value)
    return None if measured is None else int(measured)


def _count_or_zero(value: object) -> int:
    return _count(value) or 0


def _seconds_or_zero(value: object) -> float:
    return _measured(value) or 0.0


Seconds = Annotated[float | None, pydantic.BeforeValidator(_measured)]
Count = Annotated[int | None, pydantic.BeforeValidator(_count)]


@pydantic.dataclasses.dataclass(frozen=True, config=wire.CAMEL)
class Reliability:
    """What the operator knows at launch (env FSDP_RELIABILITY): the job's failures and uptime
    so far, and the last measured save and step costs (so `auto` need not re-learn them).
    Read leniently: a field that does not read is not known."""

    failures: Annotated[int, pydantic.BeforeValidator(_count_or_zero)] = 0
    uptime_seconds: Annotated[float, pydantic.BeforeValidator(_seconds_or_zero)] = 0.0
    save_seconds: Seconds = None
    step_seconds: Seconds = None
    # Of `failures`, those that recreated the gang (a memory tier does not survive them);
    # None: not told (an operator before the memory tier), taken as all of them.
    gang_failures: Count = None

    def beyond_memory(self) -> Reliability:
        """The failures the claim must cover when a memory tier takes the restarts in place."""
        gang = self.failures if self.gang_failures is None else self.gang_failures
        return dataclasses.replace(self, failures=min(gang, self.failures))

    @pydantic.field_serializer("uptime_seconds")
    def _to_the_millisecond(self, seconds: float) -> float:
        return round(seconds, 3)

    def to_json(self) -> str:
        doc = wire.to_doc(self, drop_none={"gangFailures"})  # unknown before the memory tier
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def parse(cls, raw: str) -> Reliability:
        """Lenient: a missing or malformed document is no knowledge, never a failure."""
        try:
            return wire.parse(cls, raw, what=contract.ENV_RELIABILITY)
        except ValueError:
            return cls()


class Choice(config_base.ConfigModel):
    """The checkpoint interval in use, and (auto) the inputs it was chosen from."""

    steps: int = Field(description="Steps between checkpoints now.")
    auto: bool = Field(description="Chosen by intervalSteps: auto (else the fixed number).")
    save_seconds: float | None = Field(None, description="Blocking cost of one checkpoint.")
    step_seconds: float | None = Field(
        None, description="Mean seconds of one training step, as the ranks measured it."
    )
    mtbf_seconds: float | None = Field(None, description="The job's MTBF, prior included.")
    failures: int | None = Field(None, description="Failures that estimate has seen.")


def choose(
    *,
    save_seconds: float | None,
    step_seconds: float | None,
    mtbf_seconds: float,
    floor: int,
    ceiling: int,
    failures: int | None = None,
) -> Choice:
    """`auto`'s steps between checkpoints. Until both costs are measured: the floor (a first
    checkpoint soon, which measures the save)."""
    if floor < 1 or ceiling < floor:
        raise ValueError(f"need 1 <= floor <= ceiling, got floor={floor} ceiling={ceiling}")
    known = save_seconds is not None and step_seconds is not None and step_seconds > 0
    if not known:
        steps = floor
    else:
        assert save_seconds is not None and step_seconds is not None
        tau = daly_interval_seconds(save_seconds, mtbf_seconds)
        steps = min(ceiling, max(floor, round(tau / step_seconds)))
    return Choice(
        steps=steps,
        auto=True,
        save_seconds=save_seconds,
        step_seconds=step_seconds,
        mtbf_seconds=mtbf_seconds,
        failures=failures,
    )
