"""Which rank holds the gang back: each rank's compute and wait per step, and rank 0's verdict.

In a synchronous gang every rank's step takes as long as the slowest rank's: the others wait
for it inside the collectives (FSDP's all-gathers and reduce-scatters, the step's all-reduce).
So a rank's *compute* is its step's wall time less the time it spent blocked in collectives
(flight.collective_seconds), and its *wait* is that blocked time. A rank at half speed computes
twice as long and waits least; its peers wait about its lag. Per step this costs two clock
reads per collective and a subtraction; every `window` steps one all-gather of two floats per
rank brings each rank's window median to every rank, and rank 0 judges.

A rank is named slow when the median of its compute over the window is at least `slow_ratio`
times the median of the other ranks' medians: a median over the window, so one jittery step, a
GC pause or a slow save (saves are outside the step anyway) never names one. A named rank stays
named until it falls below `clear_ratio`, so a rank near the threshold does not flap.

This module must not read the clock of another rank or act on a slow rank: it measures and
reports (Verdict.export; metrics.py stays torch-free); the operator decides what the user sees.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time

import torch
import torch.distributed as dist

from fsdp_worker import contract
from fsdp_worker.telemetry import flight, metrics

log = logging.getLogger(__name__)

WINDOW_STEPS = contract.PACE_WINDOW_STEPS
"""Steps per verdict: a slow rank is named at most this many steps after it slowed (plus one
window while the window it slowed in is half old and half new)."""
SLOW_RATIO = 1.3
"""Compute this many times the others' median names a rank (a node at 77 % speed or worse)."""
CLEAR_RATIO = 1.15
"""A named rank below this many times the others' median is no longer slow."""
TOP_K = 3
"""Ranks whose compute and wait are exported by rank (the slowest), besides the median: a
1,000-rank gang has 4 series, not 1,000."""
MIN_SAMPLES = 5
"""A window shorter than this (the steps before the first boundary after a resume) is judged
with the next one."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Rank 0's view of one window: every rank's median compute and wait per step."""

    step: int
    computes: tuple[float, ...]  # by rank: median seconds of local compute per step
    waits: tuple[float, ...]  # by rank: median seconds blocked in collectives per step
    slow_rank: int  # -1: none
    slowdown: float  # the slowest rank's compute over the median of the others' (1.0: alone)

    def shown(self, k: int = TOP_K) -> list[tuple[str, float, float]]:
        """(rank label, compute, wait) of the `k` slowest ranks and the median: the bounded
        series metrics export."""
        order = sorted(range(len(self.computes)), key=lambda r: -self.computes[r])[:k]
        rows = [(str(r), self.computes[r], self.waits[r]) for r in order]
        median = (statistics.median(self.computes), statistics.median(self.waits))
        return [*rows, (contract.RANK_MEDIAN, *median)]

    def export(self, meters: metrics.Metrics) -> None:
        meters.paced(shown=self.shown(), slow_rank=self.slow_rank, slowdown=self.slowdown)

    def summary(self) -> dict[str, object]:
        return {
            "step": self.step,
            "slowRank": self.slow_rank,
            "slowdown": round(self.slowdown, 3),
            "compute": [round(c, 4) for c in self.computes],
            "wait": [round(w, 4) for w in self.waits],
        }


def judge(
    *,
    step: int,
    computes: tuple[float, ...],
    waits: tuple[float, ...],
    named: int = -1,
    slow_ratio: float = SLOW_RATIO,
    clear_ratio: float = CLEAR_RATIO,
) -> Verdict:
    """The window's verdict. `named`: the rank named slow after the previous window (-1: none).
    The reference is the others' median, not the gang's: at world size 2 the gang's median is
    the mean of the slow rank and the fast one, and a rank twice as slow would read 1.33."""
    if len(computes) < 2:
        return Verdict(step, computes, waits, -1, 1.0)
    slowest = max(range(len(computes)), key=computes.__getitem__)
    others = statistics.median(c for r, c in enumerate(computes) if r != slowest)
    slowdown = computes[slowest] / others if others > 0 else 1.0
    limit = clear_ratio if slowest == named else slow_ratio
    return Verdict(step, computes, waits, slowest if slowdown >= limit else -1, slowdown)


class Pace:
    """One rank's step timer. Call `begin` when a step starts and `end` when it is done
    (collective every `window` steps: every rank must call it after the same steps)."""

    def __init__(self, *, world_size: int, device: torch.device, window: int = WINDOW_STEPS):
        self.world_size, self.device, self.window = world_size, device, window
        self.computes: list[float] = []
        self.waits: list[float] = []
        self.named = -1
        self._began = time.monotonic()
        self._blocked = 0.0

    def begin(self) -> None:
        self._began, self._blocked = time.monotonic(), flight.collective_seconds()

    def compute_so_far(self) -> float:
        """This step's local compute until now (the slow-rank fault sizes its extra work by it)."""
        return time.monotonic() - self._began - self.waited_so_far()

    def waited_so_far(self) -> float:
        return flight.collective_seconds() - self._blocked

    def end(self, step: int, *, excluded: float = 0.0) -> Verdict | None:
        """Record the step, less `excluded` seconds that were neither compute nor wait; at a
        window boundary exchange the window's medians (collective) and return the verdict
        (every rank gets it; rank 0 reports it)."""
        self.waits.append(self.waited_so_far())
        self.computes.append(time.monotonic() - self._began - self.waits[-1] - excluded)
        if step % self.window != 0:
            return None
        mine = torch.tensor(
            [statistics.median(self.computes), statistics.median(self.waits)], dtype=torch.float64
        )
        enough = torch.tensor([float(len(self.computes) >= MIN_SAMPLES)], dtype=torch.float64)
        rows = self._gather(torch.cat([mine, enough]))
        if not all(row[2] > 0 for row in rows):
            return None  # after a resume: judged with the next window, these samples kept
        self.computes, self.waits = [], []
        verdict = judge(
            step=step,
            computes=tuple(row[0] for row in rows),
            waits=tuple(row[1] for row in rows),
            named=self.named,
        )
        self.named = verdict.slow_rank
        return verdict

    def _gather(self, mine: torch.Tensor) -> list[list[float]]:
        if self.world_size < 2 or not dist.is_initialized():
            return [mine.tolist()]
        parts = [torch.empty_like(mine, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(parts, mine.to(self.device))
        return [part.cpu().tolist() for part in parts]
