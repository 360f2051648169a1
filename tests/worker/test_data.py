"""The global sample cursor: every world size consumes exactly the same global batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from fsdp_worker.contract import batch, config, errors
from fsdp_worker.train import data


@pytest.mark.parametrize("world", [1, 2, 3, 4, 6, 12])
def test_every_world_size_covers_the_same_global_batch_once(world: int) -> None:
    cfg = config.TrainingConfig(global_batch_size=12, micro_batch_size=1)
    cursor = 36
    seen: list[int] = []
    for rank in range(world):
        plan = batch.make_plan(cfg, world_size=world, rank=rank)
        assert plan.micro_batch * plan.world_size * plan.accumulation == 12
        for a in range(plan.accumulation):
            seen.extend(plan.indices(cursor=cursor, accum_index=a))
    assert sorted(seen) == list(range(36, 48))


def test_an_impossible_world_size_is_a_config_error_naming_the_fields() -> None:
    cfg = config.TrainingConfig(global_batch_size=12, micro_batch_size=2)
    with pytest.raises(errors.ConfigError, match=r"globalBatchSize=12 .* worldSize=4"):
        batch.make_plan(cfg, world_size=4, rank=0)


def test_synthetic_samples_depend_only_on_their_index() -> None:
    a = data.SyntheticSource(seed=1, vocab_size=64, seq_len=16)
    b = data.SyntheticSource(seed=1, vocab_size=64, seq_len=16)
    assert torch.equal(a.sample(7), b.sample(7))
    assert a.sample(7).shape == (17,)
    assert not torch.equal(a.sample(7), a.sample(8))
    assert not torch.equal(
        a.sample(7), data.SyntheticSource(seed=2, vocab_size=64, seq_len=16).sample(7)
    )


def test_token_file_windows_wrap_around(tmp_path: Path) -> None:
    path = tmp_path / "tokens.bin"
    np.arange(41, dtype=np.uint16).tofile(path)
    src = data.TokenFileSource(path=str(path), dtype="uint16", vocab_size=1000, seq_len=10)
    assert src.n_samples == 4
    assert src.sample(1).tolist() == list(range(10, 21))
    assert torch.equal(src.sample(5), src.sample(1))
    with pytest.raises(errors.ConfigError, match="training.data.path"):
        data.TokenFileSource(path=str(tmp_path / "nope"), dtype="uint16", vocab_size=9, seq_len=4)
