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


def test_a_factory_model_built_on_meta_starts_the_same_at_every_world_size(
    tmp_path: Path,
) -> None:
    """Built on meta, a user model is initialised module by module after sharding, from
    per-module seeds, so its first loss (same data, same global batch) does not depend on
    how many ranks share it."""
    train = training(steps=2, model={"factory": "factory_model:build_on_meta", "vocabSize": 64})
    first = {}
    for nproc in (1, 2):
        cfg = worker_config(tmp_path / f"ckpt{nproc}", train=train)
        run = launch(tmp_path / f"w{nproc}", nproc=nproc, config=cfg).wait()
        assert run.rc == 0, run.log[-3000:]
        losses = run.losses()
        assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
        first[nproc] = losses[1]
    assert abs(first[1] - first[2]) < 1e-5, first


def test_a_meta_factory_module_that_cannot_initialise_itself_is_a_config_error(
    tmp_path: Path,
) -> None:
    model = {"factory": "factory_model:build_on_meta_uninitialisable", "vocabSize": 64}
    cfg = worker_config(tmp_path / "ckpt", train=training(model=model))
    term = launch(tmp_path, nproc=2, config=cfg).wait().termination()
    assert (term["class"], term["exitCode"]) == ("ConfigError", 78)
    assert "module '(root)' (Scaled)" in term["message"]
    assert "reset_parameters()" in term["message"]


def test_an_unimportable_factory_is_a_config_error(tmp_path: Path) -> None:
    train = training(model={"factory": "no_such_module:build"})
    run = launch(tmp_path, nproc=2, config=worker_config(tmp_path / "ckpt", train=train)).wait()
    term = run.termination()
    assert (term["class"], term["exitCode"]) == ("ConfigError", 78)
    assert "training.model.factory='no_such_module:build'" in term["message"]
