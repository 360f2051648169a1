"""Choosing the resume point beside the memory tier (resume.choose's rank-0 part, no gang):
the claim's newest step is hashed (its files read whole) only when it is the one loaded. When
memory's step is not older it is loaded instead, and of the claim's step only the marker is
read, enough to say which step the claim offers; when memory offers nothing or an older step,
the claim's step is verified whole before it is used, and a damaged one is set aside."""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from worker_harness import worker_config

from fsdp_worker import contract
from fsdp_worker.checkpointing import resume
from fsdp_worker.contract import catalog, config, fence, selection, store

ME = fence.Writer(1, 1, "uid-1")


def _save(root: Path, step: int, cfg: config.WorkerConfig) -> None:
    """A sealed step of two data files, their sha256 in the marker (a save under 256 MiB)."""
    path = root / catalog.step_dir_name(step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(bytes([step]) * 4096)
    (path / ".metadata").write_bytes(b"m" * 64)
    storage = catalog.LocalStorage(str(root))
    files = catalog.build_manifest(storage, str(path), checksums=True)
    marker = catalog.Marker(
        step=step,
        attempt=1,
        world_size=2,
        global_batch_size=cfg.training.global_batch_size,
        samples_consumed=step * cfg.training.global_batch_size,
        resumed_from_step=None,
        time=time.time(),
        torch_version="2",
        config_hash=cfg.training.resume_hash(),
        files=files,
        job_uid="uid-1",
    )
    (path / catalog.MARKER_NAME).write_bytes(marker.to_json())


@pytest.fixture
def claim(tmp_path: Path) -> tuple[config.WorkerConfig, store.CheckpointStore]:
    root = tmp_path / "ckpt"
    cfg = config.WorkerConfig.parse(worker_config(root))
    for step in (3, 6):
        _save(root, step, cfg)
    st = store.open_store(str(root))
    st.take_over(ME)
    return cfg, st


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file of the claim read (a marker, or a file hashed), by its step and name."""
    seen: list[str] = []
    for name in ("read_bytes", "sha256"):
        original = getattr(catalog.LocalStorage, name)

        def counted(
            self: catalog.LocalStorage, path: str, _original: Callable[..., object] = original
        ) -> object:
            full = self.resolve(path)
            seen.append(posixpath.join(*full.split("/")[-2:]))
            return _original(self, path)

        monkeypatch.setattr(catalog.LocalStorage, name, counted)
    return seen


def _choose(
    cfg: config.WorkerConfig, st: store.CheckpointStore, memory_step: int | None
) -> resume.Choice:
    return resume._choose(
        cfg,
        st,
        resume=contract.RESUME_AUTO,
        attempt=1,
        job_uid="uid-1",
        rules=None,
        generation=1,
        memory_step=memory_step,
    )


def _data(reads: list[str], step: int) -> list[str]:
    return [r for r in reads if r.startswith(f"step-{step}/") and not r.endswith("COMPLETE.json")]


@pytest.mark.parametrize("memory_step", [6, 8], ids=["same-step", "newer"])
def test_memory_not_older_reads_no_data_of_the_claims_step(
    claim: tuple[config.WorkerConfig, store.CheckpointStore], reads: list[str], memory_step: int
) -> None:
    cfg, st = claim
    choice = _choose(cfg, st, memory_step)
    assert choice.point is not None and choice.point.step == 6  # what the claim offers
    assert "step-6/COMPLETE.json" in reads
    assert _data(reads, 6) == [] and _data(reads, 3) == [], reads


@pytest.mark.parametrize("memory_step", [None, 4], ids=["memory-lost", "memory-older"])
def test_the_claims_step_is_hashed_when_memory_does_not_win(
    claim: tuple[config.WorkerConfig, store.CheckpointStore], reads: list[str], memory_step: int
) -> None:
    cfg, st = claim
    choice = _choose(cfg, st, memory_step)
    assert choice.point is not None and choice.point.step == 6
    assert sorted(_data(reads, 6)) == ["step-6/.metadata", "step-6/__0_0.distcp"], reads


def test_a_damaged_claim_step_is_set_aside_once_memory_loses_but_not_read_while_it_wins(
    claim: tuple[config.WorkerConfig, store.CheckpointStore], reads: list[str]
) -> None:
    cfg, st = claim
    data = Path(cfg.checkpoint.root) / "step-6" / "__0_0.distcp"
    data.write_bytes(b"\xff" * data.stat().st_size)  # same size, other bytes
    winning = _choose(cfg, st, 8)
    assert winning.point is not None and winning.point.step == 6 and winning.quarantined == ()
    assert _data(reads, 6) == []
    losing = _choose(cfg, st, None)  # memory failed: the claim is verified before it is used
    assert losing.quarantined == (6,)
    assert losing.point is not None and losing.point.step == 3
    assert "step-6/__0_0.distcp" in _data(reads, 6) and _data(reads, 3), reads
    verdict = selection.verify(st.storage, losing.point.path, deep=True)
    assert verdict.ok, verdict
