"""Training options a user turns on: bf16 mixed precision with activation checkpointing, and a
model of their own from a factory."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from worker_harness import launch, marker, training, worker_config

pytestmark = pytest.mark.torch


def test_bf16_params_with_activation_checkpointing_train_and_checkpoint(tmp_path: Path) -> None:
    train = training(
        steps=6, precision={"param": "bf16", "reduce": "fp32"}, activationCheckpointing=True
    )
    run = launch(tmp_path, nproc=2, config=worker_config(tmp_path / "ckpt", train=train)).wait()
    assert run.rc == 0, run.log[-3000:]
    losses = run.losses()
    assert all(math.isfinite(v) for v in losses.values())
    assert losses[6] < losses[1]  # it learns
    assert marker(tmp_path / "ckpt" / "step-6")["step"] == 6


def test_a_user_factory_model_is_sharded_and_trained(tmp_path: Path) -> None:
    train = training(steps=3, model={"factory": "factory_model:build", "vocabSize": 64})
    run = launch(tmp_path, nproc=2, config=worker_config(tmp_path / "ckpt", train=train)).wait()
    assert run.rc == 0, run.log[-3000:]
    ledger = json.loads(run.log.split("ledger ", 1)[1].splitlines()[0])
    assert ledger["parameters"] == 64 * 24 + 2 * (24 * 24 + 24) + (24 * 64 + 64)
    assert sorted(run.losses()) == [1, 2, 3]


def test_an_unimportable_factory_is_a_config_error(tmp_path: Path) -> None:
    train = training(model={"factory": "no_such_module:build"})
    run = launch(tmp_path, nproc=2, config=worker_config(tmp_path / "ckpt", train=train)).wait()
    term = run.termination()
    assert (term["class"], term["exitCode"]) == ("ConfigError", 78)
    assert "training.model.factory='no_such_module:build'" in term["message"]
