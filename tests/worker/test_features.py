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


@pytest.mark.parametrize(
    "factory", ["build_on_meta", "build_on_meta_with_buffer"], ids=["params", "buffer"]
)
def test_a_meta_built_factory_model_starts_the_same_at_every_world_size(
    tmp_path: Path, factory: str
) -> None:
    """Built on meta, a user model is initialised module by module after sharding, from
    per-module seeds, so its first loss (same data, same global batch) does not depend on
    how many ranks share it."""
    train = training(steps=2, model={"factory": f"factory_model:{factory}", "vocabSize": 64})
    first = {}
    for nproc in (1, 2):
        cfg = worker_config(tmp_path / f"ckpt{nproc}", train=train)
        run = launch(tmp_path / f"w{nproc}", nproc=nproc, config=cfg).wait()
        assert run.rc == 0, run.log[-3000:]
        losses = run.losses()
        assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
        first[nproc] = losses[1]
    assert abs(first[1] - first[2]) < 1e-5, first


@pytest.mark.parametrize(
    ("factory", "says"),
    [
        ("build_on_meta_uninitialisable", ("module '(root)' (Scaled)", "reset_parameters()")),
        (
            "build_on_meta_with_unfilled_buffer",
            ("module 'scaler' (Scaler)", "left buffer 'gain' unset"),
        ),
    ],
    ids=["no_reset", "buffer"],
)
def test_a_meta_factory_model_that_cannot_initialise_is_a_config_error(
    tmp_path: Path, factory: str, says: tuple[str, str]
) -> None:
    model = {"factory": f"factory_model:{factory}", "vocabSize": 64}
    cfg = worker_config(tmp_path / "ckpt", train=training(model=model))
    term = launch(tmp_path, nproc=2, config=cfg).wait().termination()
    assert (term["class"], term["exitCode"]) == ("ConfigError", 78)
    for words in says:
        assert words in term["message"]


def test_a_meta_buffer_is_filled_by_its_modules_reset_parameters() -> None:
    """In-process, unsharded: what the worker copies into the live model is what the module's
    own reset_parameters() computed, not the uninitialised memory `to_empty` left."""
    import factory_model
    import torch

    from fsdp_worker.contract import config
    from fsdp_worker.train import model

    cfg = config.TrainingConfig.model_validate(
        training(model={"factory": "factory_model:build_on_meta_with_buffer", "vocabSize": 64})
    )
    net = model.build(cfg)
    template = model.meta_template(net, factory=cfg.model.factory)
    model.materialize(net, device=torch.device("cpu"), seed=0, template=template)
    assert isinstance(net, factory_model.WithBuffer)
    assert torch.equal(net.scaler.gain, torch.linspace(0.5, 1.5, 24))


def test_an_unimportable_factory_is_a_config_error(tmp_path: Path) -> None:
    train = training(model={"factory": "no_such_module:build"})
    run = launch(tmp_path, nproc=2, config=worker_config(tmp_path / "ckpt", train=train)).wait()
    term = run.termination()
    assert (term["class"], term["exitCode"]) == ("ConfigError", 78)
    assert "training.model.factory='no_such_module:build'" in term["message"]
