"""Stragglers under real torchrun: a rank at half speed is named by rank 0 within 30 steps with
its slowdown, and a gang with jittery steps and one long pause names no rank (telemetry/pace.py).

The slow rank is made slow by faults.slow_down: off the CPU for as long as it computed, outside
any collective, as a node throttled by cgroup cpu.max would be; its peers wait for it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from worker_harness import launch, training, worker_config

pytestmark = pytest.mark.torch
STEPS = 40


def _verdicts(log: str) -> list[dict[str, Any]]:
    """Rank 0's `pace` lines: one per window of pace.WINDOW_STEPS steps."""
    marker = "fsdp_worker.train.trainer: pace "
    return [json.loads(line.split(marker, 1)[1]) for line in log.splitlines() if marker in line]


def _run(tmp: Path, faults: str) -> list[dict[str, Any]]:
    cfg = worker_config(tmp / "ckpt", train=training(steps=STEPS), intervalSteps=1000)
    run = launch(tmp, nproc=3, config=cfg, faults=faults).wait()
    assert run.rc == 0, run.log[-3000:]
    verdicts = _verdicts(run.log)
    assert [v["step"] for v in verdicts] == [20, 40], run.log[-3000:]
    return verdicts


def test_a_rank_at_half_speed_is_named_with_its_slowdown(tmp_path: Path) -> None:
    verdicts = _run(tmp_path, "slow_rank=1:2")
    first = verdicts[0]
    assert first["slowRank"] == 1, verdicts  # named at step 20: within 30 steps
    assert 1.6 <= first["slowdown"] <= 2.6, verdicts
    assert all(v["slowRank"] == 1 for v in verdicts), verdicts
    # its peers wait for it; it waits least
    assert first["wait"][1] < min(first["wait"][0], first["wait"][2]), verdicts


def test_jittery_steps_and_a_long_pause_name_no_rank(tmp_path: Path) -> None:
    # every rank up to 10 ms longer per step at random, and rank 2 once 1 s (a GC pause)
    verdicts = _run(tmp_path, "jitter=0.01,pause_at=2:7:1.0")
    assert all(v["slowRank"] == -1 for v in verdicts), verdicts
    assert all(v["slowdown"] < 1.3 for v in verdicts), verdicts
