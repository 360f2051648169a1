"""In-process tests (one gloo rank) of the row-banded checkpoint layout (layout.py). Loads at
other world sizes through real torchrun gangs are in test_resume.py."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from fsdp_worker.checkpointing import layout, reader


@pytest.mark.parametrize(("rows", "bands"), [(10, 4), (4, 4), (3, 1), (1000, 7)])
def test_band_rows_cover_every_row_once_in_near_equal_runs(rows: int, bands: int) -> None:
    runs = layout.band_rows(rows, bands)
    assert [r for first, n in runs for r in range(first, first + n)] == list(range(rows))
    assert max(n for _, n in runs) - min(n for _, n in runs) <= 1


def test_rows_view_owns_exactly_its_bytes_and_shares_memory() -> None:
    t = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    view = layout.rows_view(t, 3, 4)
    assert torch.equal(view, t[3:7])
    assert view.untyped_storage().nbytes() == 4 * 4 * 4  # DCP's writer will not copy it
    view[0, 0] = -1.0
    assert t[3, 0] == -1.0
    strided = t.t()  # not contiguous: a plain narrow, which DCP's writer copies
    assert torch.equal(layout.rows_view(strided, 1, 2), strided[1:3])


@pytest.fixture
def mesh() -> Iterator[object]:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _state(mesh: object) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "big": distribute_tensor(torch.randn(64, 32, generator=g), mesh, [Shard(0)]),  # type: ignore[arg-type]
        "small": distribute_tensor(torch.randn(3, 2, generator=g), mesh, [Shard(0)]),  # type: ignore[arg-type]
        "plain": torch.arange(12, dtype=torch.int64),
    }


def _save(state: dict[str, torch.Tensor], path: Path, *, bands: int, min_band_bytes: int) -> None:
    dcp.save(
        state,
        storage_writer=layout.BandedWriter(str(path), single_file_per_rank=True),
        planner=layout.BandedSavePlanner(bands=bands, min_band_bytes=min_band_bytes),
    )


def test_bands_go_to_their_own_files_and_load_with_any_reader(mesh: object, tmp_path: Path) -> None:
    src = _state(mesh)
    _save(src, tmp_path, bands=4, min_band_bytes=1024)  # "big" is 8 KiB, "small" 24 bytes
    assert sorted(p.name for p in tmp_path.glob("*.distcp")) == [
        f"__0_{b}.distcp" for b in range(4)
    ]
    md = FileSystemReader(str(tmp_path)).read_metadata()
    chunks = md.state_dict_metadata["big"].chunks  # type: ignore[union-attr]
    assert [(c.offsets[0], c.sizes[0]) for c in chunks] == [(0, 16), (16, 16), (32, 16), (48, 16)]
    assert len(md.state_dict_metadata["small"].chunks) == 1  # type: ignore[union-attr]
    files = {idx.fqn: [] for idx in md.storage_data}  # type: ignore[union-attr]
    for idx, info in md.storage_data.items():  # type: ignore[union-attr]
        files[idx.fqn].append(info.relative_path)
    assert sorted(files["big"]) == [f"__0_{b}.distcp" for b in range(4)]
    assert files["small"] == files["plain"] == ["__0_0.distcp"]
    for rd in (reader.RangeReader(str(tmp_path)), FileSystemReader(str(tmp_path))):
        dst = {k: torch.zeros_like(v) for k, v in src.items()}
        dcp.load(dst, storage_reader=rd)
        for key, value in src.items():
            got = dst[key].full_tensor() if isinstance(dst[key], DTensor) else dst[key]
            want = value.full_tensor() if isinstance(value, DTensor) else value
            assert torch.equal(got, want), (type(rd).__name__, key)


def test_one_band_is_dcps_one_file_per_rank(mesh: object, tmp_path: Path) -> None:
    _save(_state(mesh), tmp_path, bands=1, min_band_bytes=0)
    assert [p.name for p in tmp_path.glob("*.distcp")] == ["__0_0.distcp"]
    md = FileSystemReader(str(tmp_path)).read_metadata()
    assert len(md.state_dict_metadata["big"].chunks) == 1  # type: ignore[union-attr]


def test_a_planner_refuses_zero_bands() -> None:
    with pytest.raises(ValueError, match="bands must be >= 1, got 0"):
        layout.BandedSavePlanner(bands=0, min_band_bytes=0)


def test_every_file_is_fsynced_before_write_data_returns(
    mesh: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Durability before the marker: the fsyncs move to the end of the rank's writes, they do
    not go away."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    writer = layout.BandedWriter(str(tmp_path), single_file_per_rank=True, sync_files=True)
    dcp.save(
        _state(mesh),
        storage_writer=writer,
        planner=layout.BandedSavePlanner(bands=4, min_band_bytes=1024),
    )
    assert sorted(Path(p).name for p in synced if p.endswith(".distcp")) == [
        f"__0_{b}.distcp" for b in range(4)
    ]
    assert writer.sync_files  # restored for the next save
