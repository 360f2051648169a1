"""Fault injection for the worker's own tests, read from $FSDP_TEST_FAULTS (or, in a job's pods,
where FSDP_* names are the operator's, from $WORKER_TEST_FAULTS: tests/e2e sets it through
`spec.template.spec.env`; a job can only hurt itself with it).

Format: comma-separated `name=value`, e.g. `kill_before_marker=6,step_sleep=0.1`; `name@g=value`
holds only in generation g of an attempt's restarts in place (gang.py's FSDP_GENERATION). Unset
in production, where every hook is a no-op. This module must not change behaviour otherwise.
"""

from __future__ import annotations

import os
import random
import signal
import time

ENV_FAULTS = "FSDP_TEST_FAULTS"
ENV_POD_FAULTS = "WORKER_TEST_FAULTS"


def _parse() -> dict[str, str]:
    raw = os.environ.get(ENV_FAULTS) or os.environ.get(ENV_POD_FAULTS) or ""
    pairs = (item.partition("=") for item in raw.split(",") if item)
    generation = os.environ.get("FSDP_GENERATION", "0")
    found = {}
    for key, _, value in pairs:
        name, at, only = key.strip().partition("@")
        if not at or only == generation:
            found[name] = value.strip()
    return found


FAULTS = _parse()


def reload() -> None:
    """Parse again: a warm launcher imported this before the generation (FSDP_GENERATION) of
    the rank it forks was known."""
    global FAULTS
    FAULTS = _parse()


def number(name: str) -> float | None:
    value = FAULTS.get(name)
    return float(value) if value is not None else None


def at_step(name: str, step: int) -> bool:
    value = number(name)
    return value is not None and int(value) == step


def step_sleep() -> None:
    """Slow every step down so a test can act between steps."""
    delay = number("step_sleep")
    if delay:
        time.sleep(delay)


def _at(name: str, where: str, *, rank: int, step: int) -> bool:
    """`name=<rank>:<step>:<where>`: this rank, this step, this place."""
    parts = FAULTS.get(name, "").split(":")
    return len(parts) == 3 and parts == [str(rank), str(step), where]


def stall_if(where: str, *, rank: int, step: int) -> None:
    """`stall_at=<rank>:<step>:<data|sync>`: this rank stops there for good (a hang)."""
    if _at("stall_at", where, rank=rank, step=step):
        while True:
            time.sleep(3600)


def raise_oom_if(where: str, *, rank: int, step: int) -> None:
    """`raise_oom_at=<rank>:<step>:<where>`: raise torch's OutOfMemoryError there, as the CUDA
    caching allocator does when an allocation does not fit (the CPU has no such error)."""
    if _at("raise_oom_at", where, rank=rank, step=step):
        import torch

        raise torch.OutOfMemoryError(f"injected: CUDA out of memory in {where} at step {step}")


def raise_if(where: str, *, rank: int, step: int) -> None:
    """`raise_at=<rank>:<step>:<where>`: a bug in the training code on this rank alone."""
    if _at("raise_at", where, rank=rank, step=step):
        raise ValueError(f"injected: a bug in the training code in {where} at step {step}")


def exhaust_memory_if(where: str, *, rank: int, step: int) -> None:
    """`oom_at=<rank>:<step>:<backward|save>`: allocate (and touch) memory until the kernel's
    OOM killer ends the process, as an activation or a staging copy that does not fit would."""
    if not _at("oom_at", where, rank=rank, step=step):
        return
    hoard = []
    while True:
        hoard.append(b"\x01" * (64 << 20))  # written: every page is resident


def kill_self_if(name: str, step: int) -> None:
    """SIGKILL this process (no cleanup, no finally blocks) at the named point."""
    if at_step(name, step):
        os.kill(os.getpid(), signal.SIGKILL)


def slow_down(*, rank: int, compute: float) -> None:
    """`slow_rank=<rank>:<factor>`: this rank's step compute takes `factor` times as long, as on
    a node throttled to 1/factor of its CPU (cgroup cpu.max): the process is off the CPU for
    (factor - 1) x the compute it did, outside any collective, so its peers wait for it."""
    rank_text, _, factor = FAULTS.get("slow_rank", "").partition(":")
    if rank_text == str(rank) and factor:
        time.sleep(max(0.0, (float(factor) - 1.0) * compute))


def jitter(*, rank: int, step: int) -> None:
    """`jitter=<seconds>`: every rank's compute of every step is up to that much longer, at
    random; `pause_at=<rank>:<step>:<seconds>`: one step of one rank is that much longer (a GC
    pause). Neither is a slow rank."""
    most = number("jitter")
    if most:
        time.sleep(random.Random(rank * 100_003 + step).uniform(0.0, most))  # noqa: S311 (a test's jitter)
    parts = FAULTS.get("pause_at", "").split(":")
    if len(parts) == 3 and parts[:2] == [str(rank), str(step)]:
        time.sleep(float(parts[2]))
