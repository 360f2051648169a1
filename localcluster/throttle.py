"""CPU throttling of a container's cgroup (cgroup v1 CFS bandwidth): the rules of the
``throttle`` fault (faults.py), on directories handed in, so that they are tested on a
temporary tree without root. A pod limited to a fraction of the CPU it uses at full speed runs
its compute at about that fraction: the node a straggler stands on.

Nothing here finds pods or nodes (faults.py does); it must not write outside the directories
it is given.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

PERIOD_US = 100_000  # the kernel's default CFS period (and the kubelet's)
MIN_QUOTA_US = 1_000  # the kernel refuses a smaller quota
UNLIMITED = -1
QUOTA_FILE, PERIOD_FILE, USAGE_FILE = "cpu.cfs_quota_us", "cpu.cfs_period_us", "cpuacct.usage"


@dataclasses.dataclass(frozen=True)
class Limit:
    """One cgroup's CFS bandwidth: `quota_us` of CPU time per `period_us` (-1: none)."""

    quota_us: int
    period_us: int = PERIOD_US

    @property
    def cores(self) -> float | None:
        return None if self.quota_us < 0 else self.quota_us / self.period_us


def quota_for(*, fraction: float, cores: float, period_us: int = PERIOD_US) -> Limit:
    """`fraction` of `cores` CPUs, as a quota per period (never below the kernel's floor)."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction {fraction} must be within (0, 1]: the share of CPU left")
    if cores <= 0:
        raise ValueError(f"cores {cores} must be > 0: the CPUs the pod uses at full speed")
    return Limit(max(MIN_QUOTA_US, round(fraction * cores * period_us)), period_us)


def kube_limit(cpu: str | None, period_us: int = PERIOD_US) -> Limit:
    """The limit the kubelet set for a container's `resources.limits.cpu` ("500m", "2"; None:
    no limit): what undoing a throttle restores."""
    if not cpu:
        return Limit(UNLIMITED, period_us)
    cores = float(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu)
    return Limit(max(MIN_QUOTA_US, round(cores * period_us)), period_us)


def read_limit(cpu_dir: Path) -> Limit:
    return Limit(int((cpu_dir / QUOTA_FILE).read_text()), int((cpu_dir / PERIOD_FILE).read_text()))


def write_limit(cpu_dir: Path, limit: Limit) -> None:
    """The period first: a quota is checked against the period in force."""
    (cpu_dir / PERIOD_FILE).write_text(str(limit.period_us))
    (cpu_dir / QUOTA_FILE).write_text(str(limit.quota_us))


def cores_used(
    cpuacct_dir: Path,
    *,
    seconds: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> float:
    """CPUs the cgroup used on average over `seconds` (cpuacct.usage counts nanoseconds)."""
    before, began = int((cpuacct_dir / USAGE_FILE).read_text()), clock()
    sleep(seconds)
    after, took = int((cpuacct_dir / USAGE_FILE).read_text()), clock() - began
    return max(0.0, (after - before) / 1e9 / max(took, 1e-9))
