"""`intervalSteps: auto` in real torchrun gangs: the ranks agree on every checkpoint step, the
first interval is the floor (nothing measured yet) or follows the costs the operator passed,
and each later interval is the Young/Daly rule applied to what the ranks measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from worker_harness import launch, training, worker_config

from fsdp_worker.contract import catalog, interval, selection

pytestmark = pytest.mark.torch

BOUNDS = {"minSteps": 4, "maxSteps": 1000, "priorMtbfSeconds": 2.0}


def _choices(log: str) -> list[dict[str, float]]:
    return [
        json.loads(line.split("checkpoint interval ", 1)[1])
        for line in log.splitlines()
        if "checkpoint interval {" in line
    ]


def _saved_steps(root: Path) -> list[int]:
    found = selection.list_checkpoints(catalog.LocalStorage(str(root)), str(root), deep=True)
    assert all(c.ok for c in found), [(c.path, c.reason) for c in found]
    return sorted(c.step for c in found)


def test_auto_ranks_agree_and_each_interval_follows_the_rule(tmp_path: Path) -> None:
    """A short prior MTBF (2 s) and slowed saves keep the optimum at tens of steps, so one
    40-step run crosses several checkpoint boundaries."""
    root = tmp_path / "ckpt"
    cfg = worker_config(
        root, train=training(steps=40), intervalSteps="auto", keep=100, autoInterval=BOUNDS
    )
    run = launch(tmp_path, nproc=2, config=cfg, faults="slow_write=0.2,step_sleep=0.02").wait()
    assert run.rc == 0, run.log[-3000:]  # a disagreement would leave one rank in a collective
    choices = _choices(run.log)
    first, later = choices[0], choices[1:]
    assert first["steps"] == 4 and first["saveSeconds"] is None  # nothing measured: the floor
    assert later, run.log[-3000:]
    for c in later:
        assert c["saveSeconds"] >= 0.2  # the slowed write blocked training (sync save)
        want = interval.choose(
            save_seconds=c["saveSeconds"],
            step_seconds=c["stepSeconds"],
            mtbf_seconds=c["mtbfSeconds"],
            floor=4,
            ceiling=1000,
        )
        assert c["steps"] == want.steps
    # the checkpoints on disk are exactly the schedule: each boundary plus the final step
    planned = [int(c["nextCheckpoint"]) for c in choices if c["nextCheckpoint"] < 40]
    assert _saved_steps(root) == [*planned, 40]


def test_auto_starts_from_the_costs_the_operator_passed(tmp_path: Path) -> None:
    """FSDP_RELIABILITY from the previous attempt: the first interval is already informed."""
    root = tmp_path / "ckpt"
    bounds = {**BOUNDS, "priorMtbfSeconds": 50.0}
    cfg = worker_config(
        root, train=training(steps=20), intervalSteps="auto", keep=100, autoInterval=bounds
    )
    hint = interval.Reliability(
        failures=1, uptime_seconds=50.0, save_seconds=0.5, step_seconds=0.25
    ).to_json()
    run = launch(tmp_path, nproc=2, config=cfg, extra_env={"FSDP_RELIABILITY": hint}).wait()
    assert run.rc == 0, run.log[-3000:]
    first = _choices(run.log)[0]
    # MTBF (50 + 50) / (1 + 1) = 50 s; Daly: 6.74 s of compute; at 0.25 s a step: 27 steps
    assert (first["failures"], first["mtbfSeconds"]) == (1, 50.0)
    assert (
        first["steps"]
        == 27
        == interval.choose(
            save_seconds=0.5, step_seconds=0.25, mtbf_seconds=50.0, floor=4, ceiling=1000
        ).steps
    )
    assert _saved_steps(root)[0] == 20  # the run ends before step 27: only the final save


def test_the_memory_tier_chooses_its_own_interval_from_its_own_costs(tmp_path: Path) -> None:
    """checkpoint.memory with auto beside a fixed claim interval: after its first save (the
    floor, 1 step) the memory tier's interval is the rule applied to its measured save and the
    step time the built-in trainer measured, with a floor of 1."""
    root = tmp_path / "ckpt"
    cfg = worker_config(
        root,
        train=training(steps=30),
        intervalSteps=10,
        keep=100,
        autoInterval=BOUNDS,
        memory={"intervalSteps": "auto"},
    )
    run = launch(
        tmp_path,
        nproc=2,
        config=cfg,
        faults="step_sleep=0.02",
        extra_env={"FSDP_MEMORY_ROOT": str(tmp_path / "memory")},
    ).wait()
    assert run.rc == 0, run.log[-3000:]
    memory = [c for c in _choices(run.log) if c.get("tier") == "memory"]
    assert memory and memory[0]["steps"] == 1 and memory[0]["stepSeconds"] is None
    assert len(memory) >= 2, run.log[-3000:]
    for c in memory[1:]:
        assert c["stepSeconds"] and c["stepSeconds"] > 0.02, c  # the trainer's step time
        want = interval.choose(
            save_seconds=c["saveSeconds"],
            step_seconds=c["stepSeconds"],
            mtbf_seconds=c["mtbfSeconds"],
            floor=1,
            ceiling=1000,
        )
        assert c["steps"] == want.steps
    assert _saved_steps(root) == [10, 20, 30]  # the claim's own fixed interval
