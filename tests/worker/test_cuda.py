"""The CUDA path on one GPU: NCCL, bf16 on the device, the CUDA RNG row, pinned async staging,
and checkpoints that move between a GPU gang and a CPU one.

Every test here needs a CUDA GPU and is skipped without one; the rest of tests/worker covers the
same features on CPU with gloo. `make gpu-check` runs only this file (docs/worker.md, "GPU
check", says how on a machine without our virtual environment). One GPU means world size 1 on
NCCL: NCCL refuses two ranks on one device.

GPU kernels are not bitwise reproducible between processes (atomic adds in the embedding
backward, cuBLAS split-K choices), so a resume is compared with the uninterrupted run within
LOSS_RTOL, not bitwise as on CPU.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_harness import (
    check_async_save_overlaps_training,
    launch,
    marker,
    training,
    worker_config,
)

from fsdp_worker.checkpointing import reader, state
from fsdp_worker.contract import catalog, selection

pytestmark = [
    pytest.mark.torch,
    pytest.mark.skipif(
        not torch.cuda.is_available(),
        reason="needs a CUDA GPU (NCCL, bf16 on the device, CUDA RNG, pinned staging); "
        "this machine has none",
    ),
]

LOSS_RTOL = 2e-2  # bf16 parameters; the CPU runs of the same config agree with each other exactly
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def _bf16(**overrides: Any) -> dict[str, Any]:
    return training(
        precision={"param": "bf16", "reduce": "fp32"}, activationCheckpointing=True, **overrides
    )


def _close(got: dict[int, float], want: dict[int, float]) -> None:
    assert got, "no steps ran"
    for step, loss in got.items():
        assert math.isclose(loss, want[step], rel_tol=LOSS_RTOL), (step, loss, want[step])


@pytest.fixture(scope="module")
def gpu_reference(worker_tmp: Path) -> dict[str, Any]:
    """An uninterrupted 12-step bf16 run on the GPU (checkpoints at 3, 6, 9, 12)."""
    tmp = worker_tmp / "gpu-reference"
    root = tmp / "ckpt"
    run = launch(tmp, nproc=1, config=worker_config(root, train=_bf16())).wait()
    assert run.rc == 0, run.log[-3000:]
    return {"root": root, "losses": run.losses(), "log": run.log}


def test_a_gpu_run_uses_nccl_and_reports_device_memory(gpu_reference: dict[str, Any]) -> None:
    losses, log = gpu_reference["losses"], gpu_reference["log"]
    assert sorted(losses) == list(range(1, 13))
    assert all(math.isfinite(v) for v in losses.values()) and losses[12] < losses[1]
    assert re.search(r"on device cuda:0, backend \S*nccl", log), log[-3000:]
    found = re.search(r"ledger (\{\"measuredPeakBytesRank0\".*\})", log)
    assert found, log[-3000:]
    assert json.loads(found[1])["measuredPeakBytesRank0"] > 0  # torch.cuda.max_memory_allocated


def test_a_gpu_checkpoint_holds_the_cuda_rng_row_and_verifies(
    gpu_reference: dict[str, Any],
) -> None:
    step = gpu_reference["root"] / "step-12"
    keys = set(reader.RangeReader(str(step)).read_metadata().state_dict_metadata)
    assert {state.RNG_CPU, state.RNG_CUDA} <= keys
    storage = catalog.LocalStorage(str(gpu_reference["root"]))
    assert selection.verify(storage, str(step), deep=True).ok
    assert marker(step)["world_size"] == 1


def test_sigkill_on_the_gpu_then_resume_continues_the_loss_curve(
    gpu_reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    cfg = worker_config(root, train=_bf16())
    first = launch(tmp_path, nproc=1, config=cfg, faults="step_sleep=0.3", name="first")
    first.wait_for(lambda log: "checkpoint step 6 complete" in log)
    first.kill_all()
    second = launch(tmp_path, nproc=1, config=cfg, attempt=2, resume="auto", name="second")
    assert second.wait().rc == 0, second.log[-3000:]
    resumed = second.losses()
    assert min(resumed) - 1 in (6, 9) and max(resumed) == 12
    _close(resumed, gpu_reference["losses"])


def test_a_gpu_checkpoint_resumes_on_two_cpu_ranks(
    gpu_reference: dict[str, Any], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    _copy_upto(gpu_reference["root"], root, step=6)
    cfg = worker_config(root, train=_bf16())
    run = launch(tmp_path, nproc=2, config=cfg, attempt=2, resume="auto", extra_env=CPU_ONLY)
    assert run.wait().rc == 0, run.log[-3000:]
    assert "saved at world size 1, now 2" in run.log
    assert sorted(run.losses()) == list(range(7, 13))
    _close(run.losses(), gpu_reference["losses"])


def test_a_cpu_checkpoint_resumes_on_the_gpu(gpu_reference: dict[str, Any], tmp_path: Path) -> None:
    cfg = worker_config(tmp_path / "cpu-ckpt", train=_bf16())
    cpu = launch(tmp_path, nproc=2, config=cfg, extra_env=CPU_ONLY, name="cpu").wait()
    assert cpu.rc == 0, cpu.log[-3000:]
    root = tmp_path / "ckpt"
    _copy_upto(tmp_path / "cpu-ckpt", root, step=6)
    cfg = worker_config(root, train=_bf16())
    gpu = launch(tmp_path, nproc=1, config=cfg, attempt=2, resume="auto", name="gpu").wait()
    assert gpu.rc == 0, gpu.log[-3000:]
    assert "saved at world size 2, now 1" in gpu.log
    assert sorted(gpu.losses()) == list(range(7, 13))
    _close(gpu.losses(), cpu.losses())
    _close(gpu.losses(), gpu_reference["losses"])


def test_async_save_on_the_gpu_stages_and_completes_every_checkpoint(tmp_path: Path) -> None:
    check_async_save_overlaps_training(tmp_path, nproc=1, train=_bf16(steps=9))


def _copy_upto(src: Path, dst: Path, *, step: int) -> None:
    """The checkpoints of `src` up to `step`, as a job that stopped there would have left."""
    dst.mkdir(parents=True)
    for child in src.iterdir():
        if child.name.startswith("step-") and int(child.name.split("-")[1]) <= step:
            shutil.copytree(child, dst / child.name)
