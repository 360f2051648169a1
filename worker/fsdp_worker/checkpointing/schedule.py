"""When to checkpoint: every N steps, or `auto` (the Young/Daly interval, see interval.py).

A fixed interval saves at multiples of N, as always. `auto` saves `steps` after the previous
checkpoint (or the resume point) and chooses the next interval at each checkpoint boundary from
what the ranks measured: the blocking cost of that save and the mean step time since the one
before. Every rank must save at the same step, so the inputs are agreed with one all_reduce
(max) per checkpoint, and every rank then computes the same interval from the same numbers.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from fsdp_worker.contract import config_checkpoint, interval
from fsdp_worker.runtime.distributed import DistInfo
from fsdp_worker.telemetry import metrics

log = logging.getLogger(__name__)


def _max(values: list[float], dist_info: DistInfo | None) -> list[float]:
    """Elementwise max over ranks (one all_reduce), so every rank decides from equal inputs."""
    agreed = torch.tensor(values, dtype=torch.float64)
    if dist_info is not None and dist_info.world_size > 1:
        agreed = agreed.to(dist_info.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return [float(x) for x in agreed.cpu()]


def _agree(r: interval.Reliability, dist_info: DistInfo | None) -> interval.Reliability:
    """Pods of one attempt get the same FSDP_RELIABILITY, except a pod the operator created in
    a later pass (after a restart of its own): the ranks agree on the larger figures."""
    unknown = -1.0
    got = _max(
        [
            float(r.failures),
            r.uptime_seconds,
            r.save_seconds if r.save_seconds is not None else unknown,
            r.step_seconds if r.step_seconds is not None else unknown,
            float(r.gang_failures) if r.gang_failures is not None else unknown,
        ],
        dist_info,
    )
    return interval.Reliability(
        failures=int(got[0]),
        uptime_seconds=got[1],
        save_seconds=got[2] if got[2] >= 0 else None,
        step_seconds=got[3] if got[3] > 0 else None,
        gang_failures=int(got[4]) if got[4] >= 0 else None,
    )


@dataclass
class Schedule:
    """Decides `due(step)`; told of each save with `saved(...)` (collective under auto)."""

    every: int | None  # fixed interval; None: auto
    bounds: config_checkpoint.AutoIntervalConfig
    reliability: interval.Reliability
    meters: metrics.Metrics
    dist: DistInfo | None = None
    memory: bool = False  # the memory tier's schedule (its own gauge), not the claim's
    next_step: int = 0
    started: float = field(default_factory=time.monotonic)
    choice: interval.Choice | None = None
    _mark: tuple[int, float] = (0, 0.0)  # (steps run, step seconds) at the last boundary

    @classmethod
    def of(
        cls,
        cfg: config_checkpoint.CheckpointConfig,
        *,
        start_step: int,
        reliability: interval.Reliability,
        meters: metrics.Metrics,
        dist_info: DistInfo | None,
        generation: int = 0,
        memory: bool = False,
    ) -> Schedule:
        """The claim's schedule, or (`memory`) the memory tier's. `generation`: restarts in
        place so far in this attempt (the operator's FSDP_RELIABILITY predates them).

        The memory tier counts every failure (each restart in place loads it), from a floor of
        1 step, without the claim's measured costs. The claim counts the restarts in place
        only when no memory tier takes them, else only the failures that recreated the gang."""
        steps, bounds = cfg.interval_steps, cfg.auto_interval
        if memory:
            assert cfg.memory is not None
            steps, bounds = cfg.memory.interval_steps, bounds.model_copy(update={"min_steps": 1})
            reliability = interval.Reliability(
                failures=reliability.failures + generation,
                uptime_seconds=reliability.uptime_seconds,
            )
        elif cfg.memory is not None:
            reliability = reliability.beyond_memory()
        else:
            reliability = dataclasses.replace(
                reliability, failures=reliability.failures + generation
            )
        return cls._start(
            steps,
            bounds,
            start_step=start_step,
            reliability=reliability,
            meters=meters,
            dist_info=dist_info,
            memory=memory,
        )

    @classmethod
    def _start(
        cls,
        steps: int | str,
        bounds: config_checkpoint.AutoIntervalConfig,
        *,
        start_step: int,
        reliability: interval.Reliability,
        meters: metrics.Metrics,
        dist_info: DistInfo | None,
        memory: bool = False,
    ) -> Schedule:
        every = None if steps == config_checkpoint.AUTO else int(steps)
        sched = cls(every, bounds, reliability, meters, dist_info, memory)
        if every is not None:
            sched.choice = interval.Choice(steps=every, auto=False)
            sched._record(sched.choice)
        else:
            r = sched.reliability = _agree(reliability, dist_info)
            # the last attempt's measured costs, when the operator knew them
            sched._choose(start_step, save_seconds=r.save_seconds, step_seconds=r.step_seconds)
        return sched

    def due(self, step: int) -> bool:
        if self.every is not None:
            return step % self.every == 0
        return step >= self.next_step

    def mtbf_seconds(self, elapsed: float) -> float:
        r = self.reliability
        return interval.mtbf_estimate(
            failures=r.failures,
            uptime_seconds=r.uptime_seconds + elapsed,
            prior_seconds=self.bounds.prior_mtbf_seconds,
        )

    def saved(self, step: int, *, blocking: float, steps_run: int, step_seconds: float) -> None:
        """A checkpoint of `step` was taken, blocking training `blocking` seconds on this rank;
        `steps_run`/`step_seconds` are this process's totals so far."""
        if self.every is not None:
            return
        steps, secs = steps_run - self._mark[0], step_seconds - self._mark[1]
        self._mark = (steps_run, step_seconds)
        mean = secs / steps if steps > 0 else -1.0
        save_s, step_s, elapsed = _max([blocking, mean, time.monotonic() - self.started], self.dist)
        if step_s <= 0:  # no step since the last boundary: keep what was known
            step_s = self.choice.step_seconds if self.choice and self.choice.step_seconds else -1.0
        self._choose(
            step, save_seconds=save_s, step_seconds=step_s if step_s > 0 else None, elapsed=elapsed
        )

    def _choose(
        self,
        step: int,
        *,
        save_seconds: float | None,
        step_seconds: float | None,
        elapsed: float = 0.0,
    ) -> None:
        self.choice = interval.choose(
            save_seconds=save_seconds,
            step_seconds=step_seconds,
            mtbf_seconds=self.mtbf_seconds(elapsed),
            floor=self.bounds.min_steps,
            ceiling=self.bounds.max_steps,
            failures=self.reliability.failures,
        )
        self.next_step = step + self.choice.steps
        self._record(self.choice)
        if self.dist is None or self.dist.rank == 0:  # once per checkpoint: not noisy
            c = self.choice
            doc = {
                "tier": "memory" if self.memory else "claim",
                "steps": c.steps,
                "saveSeconds": c.save_seconds,
                "stepSeconds": c.step_seconds,
                "mtbfSeconds": c.mtbf_seconds,
                "failures": c.failures,
                "nextCheckpoint": self.next_step,
            }
            log.info("checkpoint interval %s", json.dumps(doc))

    def _record(self, choice: interval.Choice) -> None:
        if self.memory:
            self.meters.memory_interval.set(choice.steps)
        else:
            self.meters.chose(choice)
