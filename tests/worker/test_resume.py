"""Exact resume: after SIGKILL of every rank, and at a smaller or larger world size."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_harness import flatten, gather, launch, marker, worker_config

pytestmark = pytest.mark.torch

# Across world sizes only the order of float32 reductions changes. Losses agree to ~1e-6;
# Adam turns rounding noise in near-zero gradients into up to a few % of one step (lr=0.01),
# so parameters and moments are compared at 2% of the learning rate.
LOSS_ATOL = 1e-4
STATE_ATOL = 2e-4


def _assert_state_equal(a: dict[str, Any], b: dict[str, Any], *, atol: float | None) -> None:
    for section in ("model", "optim"):
        keys_a = sorted(k for k, v in flatten(a[section]).items() if torch.is_tensor(v))
        keys_b = sorted(k for k, v in flatten(b[section]).items() if torch.is_tensor(v))
        assert keys_a == keys_b and keys_a, section
        fa, fb = flatten(a[section]), flatten(b[section])
        for key in keys_a:
            if atol is None:
                assert torch.equal(fa[key], fb[key]), key
            else:
                torch.testing.assert_close(fa[key], fb[key], atol=atol, rtol=1e-4, msg=key)


def test_sigkill_every_rank_then_resume_is_bitwise_identical(
    reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root)
    first = launch(tmp_path, nproc=2, config=cfg, faults="step_sleep=0.3", name="first")
    first.wait_for(lambda log: "checkpoint step 6 complete" in log)
    first.kill_all()
    killed_at = max(first.losses())
    assert killed_at < 12

    second = launch(tmp_path, nproc=2, config=cfg, attempt=2, resume="auto", name="second")
    assert second.wait().rc == 0, second.log[-3000:]
    resumed = second.losses()
    start = min(resumed) - 1
    assert start in (6, 9) and f"resumed from step-{start}" in second.log
    for step, loss in resumed.items():
        assert loss == reference["losses"][step], step  # bitwise, not approximately
    _assert_state_equal(
        gather(root / "step-12", tmp_path),
        gather(reference["root"] / "step-12", tmp_path),
        atol=None,
    )
    assert marker(root / "step-12")["resumed_from_step"] == start


def _check_cross_world(
    reference: dict[str, Any], tmp_path: Path, *, root: Path, new_world: int, old_world: int
) -> str:
    """Resume at `new_world` from `root`; returns the resumed run's log."""
    cfg = worker_config(root)
    run = launch(tmp_path, nproc=new_world, config=cfg, attempt=2, resume="auto", name="resume")
    assert run.wait().rc == 0, run.log[-3000:]
    assert f"saved at world size {old_world}, now {new_world}" in run.log
    resumed = run.losses()
    assert sorted(resumed) == list(range(7, 13))
    for step, loss in resumed.items():
        assert loss == pytest.approx(reference["losses"][step], abs=LOSS_ATOL), step
    final = marker(root / "step-12")
    assert (final["world_size"], final["global_batch_size"]) == (new_world, 12)
    assert final["samples_consumed"] == 12 * 12
    _assert_state_equal(
        gather(root / "step-12", tmp_path),
        gather(reference["root"] / "step-12", tmp_path),
        atol=STATE_ATOL,
    )
    return run.log


def test_resume_at_smaller_world_size_4_to_2(reference: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    first = launch(tmp_path, nproc=4, config=worker_config(root), faults="crash_after=6")
    assert first.wait().rc != 0
    assert marker(root / "step-6")["world_size"] == 4
    # The optimizer state written by 4 ranks, gathered, equals the 2-rank reference's.
    _assert_state_equal(
        gather(root / "step-6", tmp_path),
        gather(reference["root"] / "step-6", tmp_path),
        atol=STATE_ATOL,
    )
    _check_cross_world(reference, tmp_path, root=root, new_world=2, old_world=4)


def test_resume_at_larger_world_size_2_to_3(reference: dict[str, Any], tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    shutil.copytree(reference["root"] / "step-6", root / "step-6")
    log = _check_cross_world(reference, tmp_path, root=root, new_world=3, old_world=2)
    # The 2 writers cut every tensor into 4 row bands, one file each (layout.py): a reader at
    # world size 3 needs 8/3 bands' worth of rows, so it opens at most 4 of the 8 files.
    touched = [int(n) for n in re.findall(r"as ranges from (\d+) of 8 files", log)]
    assert len(touched) == 3 and all(1 <= n <= 4 for n in touched), touched
