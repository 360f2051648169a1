"""In-process unit tests (no torchrun) for the checkpoint state plumbing: RNG entries (CPU
always, CUDA only where CUDA really is available) and the ranged DCP reader."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo

from fsdp_worker.checkpointing import reader, state

HAS_CUDA = torch.cuda.is_available()


def test_rng_states_have_a_cuda_entry_only_when_cuda_is_available() -> None:
    states = state.local_rng_states()
    assert set(states) == ({state.RNG_CPU, state.RNG_CUDA} if HAS_CUDA else {state.RNG_CPU})
    assert torch.equal(states[state.RNG_CPU], torch.get_rng_state())
    if not HAS_CUDA:
        assert not torch.cuda.is_initialized()  # asking did not initialise CUDA


def test_gather_rng_makes_one_row_per_rank() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rows = state.gather_rng(dist.group.WORLD)  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
    assert set(rows) == set(state.local_rng_states())
    assert rows[state.RNG_CPU].shape == (1, torch.get_rng_state().numel())


def test_rng_template_requests_cuda_rows_only_if_usable_and_saved() -> None:
    n = torch.get_rng_state().numel()
    cpu_ckpt = state.rng_template(saved_world_size=3, saved_keys={"model", state.RNG_CPU})
    assert set(cpu_ckpt) == {state.RNG_CPU}
    assert cpu_ckpt[state.RNG_CPU].shape == (3, n)
    cuda_ckpt = state.rng_template(saved_world_size=3, saved_keys={state.RNG_CPU, state.RNG_CUDA})
    assert (state.RNG_CUDA in cuda_ckpt) == HAS_CUDA


@pytest.mark.parametrize(
    ("saved", "rank", "world", "cpu_row", "cuda_row"),
    [
        (2, 0, 2, 0, 0),  # same world size: every generator continues
        (2, 1, 2, 1, 1),
        (4, 1, 2, 1, None),  # shrink: CPU keeps its row, CUDA reseeds
        (2, 2, 3, None, None),  # grow: a new rank has no row
        (2, 1, 3, 1, None),
    ],
)
def test_rng_rows_carry_over_deliberately(
    saved: int, rank: int, world: int, cpu_row: int | None, cuda_row: int | None
) -> None:
    assert state.rng_row(saved, rank=rank, world_size=world, same_world_only=False) == cpu_row
    assert state.rng_row(saved, rank=rank, world_size=world, same_world_only=True) == cuda_row


def test_apply_rng_restores_or_reseeds_reproducibly() -> None:
    torch.manual_seed(5)
    rows = torch.stack([torch.get_rng_state(), torch.get_rng_state()])
    expected = torch.rand(3)
    sd = {state.RNG_CPU: rows, state.RNG_CUDA: torch.zeros((2, 16), dtype=torch.uint8)}
    torch.manual_seed(99)
    state.apply_rng(sd, rank=1, world_size=2, seed=0, step=4)
    assert torch.equal(torch.rand(3), expected)
    state.apply_rng(sd, rank=2, world_size=3, seed=7, step=4)
    first = torch.rand(3)
    state.apply_rng(sd, rank=2, world_size=3, seed=7, step=4)
    assert torch.equal(torch.rand(3), first)
    assert not torch.equal(first, expected)


def test_a_checkpoint_with_cuda_rng_rows_loads_on_cpu(tmp_path: Path) -> None:
    rows = torch.stack([torch.get_rng_state()] * 2)
    saved = {state.RNG_CPU: rows, state.RNG_CUDA: torch.ones((2, 16), dtype=torch.uint8)}
    dcp.save(saved, checkpoint_id=str(tmp_path), no_dist=True)
    rd = reader.RangeReader(str(tmp_path))
    keys = set(rd.read_metadata().state_dict_metadata)
    assert keys == {state.RNG_CPU, state.RNG_CUDA}
    sd = state.rng_template(saved_world_size=2, saved_keys=keys)
    dcp.load(sd, storage_reader=rd, no_dist=True)
    assert torch.equal(sd[state.RNG_CPU], rows)
    if HAS_CUDA:
        assert torch.equal(sd[state.RNG_CUDA], saved[state.RNG_CUDA])


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(37, 8, generator=g),
        "bf": torch.randn(6, 3, 5, generator=g).to(torch.bfloat16),
        "t": torch.randn(8, 5, generator=g).t(),  # non-contiguous: DCP's own path
        "step": torch.tensor(7.0),  # scalar: DCP's own path
        "i": torch.arange(11, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
    }


def test_range_reader_loads_what_dcp_saved(tmp_path: Path) -> None:
    src = _tensors()
    dcp.save(src, checkpoint_id=str(tmp_path), no_dist=True)
    dst = {k: torch.full_like(v, -1) for k, v in src.items()}
    rd = reader.RangeReader(str(tmp_path))
    dcp.load(dst, storage_reader=rd, no_dist=True)
    for key, value in src.items():
        assert torch.equal(dst[key], value), key
    assert rd.fallback_items == 2  # "t" and "step"
    assert rd.ranged_bytes == sum(
        v.numel() * v.element_size() for k, v in src.items() if k not in ("t", "step")
    )


@pytest.mark.parametrize("name", ["w", "bf", "i"])
def test_a_dim0_slice_reads_exactly_the_rows_torch_load_would_give(name: str) -> None:
    value = _tensors()[name]
    buf = io.BytesIO(b"x" * 13)  # the archive starts at an unaligned offset, as in a .distcp
    buf.seek(13)
    torch.save(value, buf)
    sinfo = _StorageInfo("f", 13, buf.tell() - 13)
    layout = reader.stored_layout(buf, sinfo)
    assert layout is not None and layout.size == tuple(value.shape)
    rows = value.shape[0]
    for first, count in [(0, rows), (0, 1), (rows // 2, rows - rows // 2), (1, rows - 2)]:
        offsets = (first,) + (0,) * (value.dim() - 1)
        lengths = (count, *value.shape[1:])
        span = reader.row_range(layout, offsets, lengths)
        assert span is not None
        out = torch.empty(lengths, dtype=value.dtype)
        reader.read_exactly(buf, 13 + layout.data_offset + span[0], out)
        assert torch.equal(out, value.narrow(0, first, count))
    if value.dim() > 1:  # narrowed along dim 1: not one run of bytes, DCP's own path
        narrowed = (rows, 1, *value.shape[2:])
        assert reader.row_range(layout, (0,) * value.dim(), narrowed) is None


def _saved(value: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(_tensors()))
def test_the_layout_from_an_items_head_equals_the_one_from_its_zip_directory(name: str) -> None:
    """head_layout reads only the first HEAD_BYTES; it must agree with the full parse."""
    value = _tensors()[name]
    raw = _saved(value)
    full = reader.stored_layout(io.BytesIO(raw), _StorageInfo("f", 0, len(raw)))
    head = reader.head_layout(raw[: reader.HEAD_BYTES])
    if value.dim() == 0:  # both turn a scalar down for ranged reads
        assert full is None and head is not None and reader.row_range(head, (), ()) is None
    elif value.numel() == 0:  # no data record before the end: the full parse decides
        assert head is None
    else:
        assert head == full and head is not None
    sliced = torch.arange(40, dtype=torch.float32).reshape(10, 4)[3:]  # storage offset 12
    assert reader.head_layout(_saved(sliced)) == reader.stored_layout(
        io.BytesIO(_saved(sliced)), _StorageInfo("f", 0, len(_saved(sliced)))
    )


def test_a_range_reader_load_parses_no_zip_directory(tmp_path: Path) -> None:
    """Every tensor item of a DCP checkpoint is located from its head (forward reads only)."""
    src = {k: v for k, v in _tensors().items() if v.numel()}
    dcp.save(src, checkpoint_id=str(tmp_path), no_dist=True)
    dst = {k: torch.full_like(v, -1) for k, v in src.items()}
    rd = reader.RangeReader(str(tmp_path))
    dcp.load(dst, storage_reader=rd, no_dist=True)
    assert all(torch.equal(dst[k], v) for k, v in src.items())
    assert rd.full_parses == 0


def test_a_hostile_or_damaged_head_is_refused_without_running_anything(tmp_path: Path) -> None:
    import os
    import pickle

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    writer = torch._C.PyTorchFileWriter(buf)
    for name, data in (
        ("data.pkl", pickle.dumps(Evil(), protocol=2)),
        ("byteorder", sys.byteorder.encode()),
        ("data/0", b"\0" * 64),
    ):
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    raw = buf.getvalue()
    assert reader.head_layout(raw[: reader.HEAD_BYTES]) is None
    with pytest.raises(pickle.UnpicklingError):
        reader.stored_layout(io.BytesIO(raw), _StorageInfo("f", 0, len(raw)))
    assert not marker.exists()
    good = _saved(torch.randn(50, 3))
    for damaged in (good[:20], good[:200], b"PK\x03\x04" + b"\xff" * 60, b"\0" * 4096):
        assert reader.head_layout(damaged) is None


def test_checkpoints_written_without_zip_crc32_load_through_both_readers(tmp_path: Path) -> None:
    """checkpoint.ZIP_CRC32 is False: torch.save then writes no CRC32. This pins that no reader
    on the load path relies on it (a torch upgrade that starts checking would fail here)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from fsdp_worker.checkpointing import checkpoint

    assert checkpoint.ZIP_CRC32 is False
    src = _tensors()
    torch.serialization.set_crc32_options(False)
    try:
        dcp.save(src, checkpoint_id=str(tmp_path), no_dist=True)
    finally:
        torch.serialization.set_crc32_options(True)
    for rd in (reader.RangeReader(str(tmp_path)), FileSystemReader(str(tmp_path))):
        dst = {k: torch.full_like(v, -1) for k, v in src.items()}
        dcp.load(dst, storage_reader=rd, no_dist=True)
        for key, value in src.items():
            assert torch.equal(dst[key], value), (type(rd).__name__, key)


def test_eager_writeback_files_hold_exactly_what_dcp_wrote(tmp_path: Path) -> None:
    from torch.distributed.checkpoint.filesystem import FileSystemWriter

    from fsdp_worker.checkpointing import writeback

    src = _tensors()
    dcp.save(src, checkpoint_id=str(tmp_path / "plain"), no_dist=True)
    w = FileSystemWriter(str(tmp_path / "eager"), sync_files=True, thread_count=2)
    w.fs = writeback.EagerWritebackFileSystem(chunk=4096)  # advise many times per file
    dcp.save(src, storage_writer=w, no_dist=True)
    for name in ("__0_0.distcp", "__0_1.distcp"):
        assert (tmp_path / "eager" / name).stat().st_size > 0
    dst = {k: torch.full_like(v, -1) for k, v in src.items()}
    dcp.load(dst, storage_reader=reader.RangeReader(str(tmp_path / "eager")), no_dist=True)
    for key, value in src.items():
        assert torch.equal(dst[key], value), key


def test_prefetcher_asks_for_a_window_ahead_of_the_reader(tmp_path: Path) -> None:
    mib = 1024 * 1024
    path = tmp_path / "f"
    with open(path, "wb") as f:
        f.truncate(100 * mib)
    with open(path, "rb") as f:
        ahead = reader.Prefetcher(
            f.fileno(), [(0, 30 * mib), (40 * mib, 100 * mib)], window=16 * mib
        )
        ahead.advance(0)
        assert ahead.advised == 16 * mib  # pieces starting before 0 + 16 MiB
        ahead.advance(10 * mib)
        assert ahead.advised == 30 * mib  # the first span is done; 40 MiB is beyond the window
        ahead.advance(90 * mib)
        assert ahead.advised == 90 * mib  # everything, and nothing twice


def test_range_reader_prefetches_only_items_it_reads_whole(tmp_path: Path) -> None:
    src = {"w": torch.randn(64, 8), "v": torch.randn(32)}
    dcp.save(src, checkpoint_id=str(tmp_path), no_dist=True)
    whole = reader.RangeReader(str(tmp_path))
    dcp.load({k: torch.empty_like(v) for k, v in src.items()}, storage_reader=whole, no_dist=True)
    assert whole.prefetched_bytes >= whole.ranged_bytes > 0
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, ReadItem

    def item(first: int, rows: int) -> ReadItem:
        index = MetadataIndex("w", torch.Size([0, 0]))
        return ReadItem(
            LoadItemType.TENSOR,
            index,
            torch.Size([0, 0]),
            index,
            torch.Size([first, 0]),
            torch.Size([rows, 8]),
        )

    assert whole._spans([item(0, 64)]) and not whole._spans([item(32, 32)])  # half: no prefetch
