"""direct.DirectFileSystem: checkpoint files written with O_DIRECT through bounce buffers hold
exactly what DCP's own writer writes, whatever the write sizes; refusal of O_DIRECT falls back
to buffered writes; an I/O error in the background write reaches the saver."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from fsdp_worker.checkpointing import direct, layout, reader

SMALL_BUFFER = 2 * direct.ALIGN  # many buffer switches per tensor, and a tail in every file


def _tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return {
        "big": torch.randn(1000, 37, generator=g),  # 148,000 bytes: many buffers, odd tail
        "bf": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "i": torch.arange(13, dtype=torch.int64),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
    }


def _save(src: dict[str, torch.Tensor], path: Path, fs: object | None, **kw: object) -> None:
    writer = FileSystemWriter(str(path), sync_files=True, thread_count=1, **kw)  # type: ignore[arg-type]
    if fs is not None:
        writer.fs = fs
    dcp.save(src, storage_writer=writer, no_dist=True)


def _files(path: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(path.glob("*.distcp"))}


def _assert_loads(src: dict[str, torch.Tensor], path: Path) -> None:
    dst = {k: torch.full_like(v, -1) for k, v in src.items()}
    dcp.load(dst, storage_reader=reader.RangeReader(str(path)), no_dist=True)
    for key, value in src.items():
        assert torch.equal(dst[key], value), key


@pytest.mark.parametrize("buffer_bytes", [SMALL_BUFFER, direct.BUFFER_BYTES])
def test_direct_files_are_byte_for_byte_what_dcp_writes(
    tmp_path: Path, buffer_bytes: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = _tensors()
    _save(src, tmp_path / "plain", None)
    # DCP's own writer calls os.fsync(stream.fileno()) and only then closes the stream: by the
    # time of that fsync every byte, the buffered tail too, must be in the file.
    sizes_at_fsync, real_fsync = [], os.fsync

    def recording_fsync(fd: int) -> None:
        sizes_at_fsync.append(os.fstat(fd).st_size)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    fs = direct.DirectFileSystem(buffer_bytes=buffer_bytes)
    _save(src, tmp_path / "direct", fs)
    fs.close()
    plain, written = _files(tmp_path / "plain"), _files(tmp_path / "direct")
    assert written == plain and sum(map(len, written.values())) > 148_000
    every_file = [p.stat().st_size for p in (tmp_path / "direct").iterdir()]  # with .metadata
    assert sorted(sizes_at_fsync) == sorted(every_file) and len(every_file) == 2
    assert fs.buffered_files == 0
    # Every byte went out with O_DIRECT (the tails zero-padded to ALIGN, then truncated).
    assert fs.direct_bytes >= sum(map(len, written.values()))
    _assert_loads(src, tmp_path / "direct")


def test_the_banded_writer_through_direct_writes_reuses_its_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production writer (layout.BandedWriter), two saves through one file system, as a
    CheckpointManager does. Its files' last writes finish in the background while the next
    file is written (`deferred_closes`); each must be whole when it is fsync'd."""
    src = _tensors()
    _save(src, tmp_path / "plain", None)
    sizes_at_fsync: dict[str, int] = {}
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        sizes_at_fsync[os.readlink(f"/proc/self/fd/{fd}")] = os.fstat(fd).st_size
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    fs = direct.DirectFileSystem(buffer_bytes=SMALL_BUFFER)
    for name in ("a", "b"):
        writer = layout.BandedWriter(str(tmp_path / name), sync_files=True, thread_count=1)
        writer.fs = fs
        planner = layout.BandedSavePlanner(bands=4, min_band_bytes=1024)
        dcp.save(src, storage_writer=writer, planner=planner, no_dist=True)
    assert len(fs.buffers._free) >= 1 and fs.buffered_files == 0
    fs.close()
    assert _files(tmp_path / "b") == _files(tmp_path / "a") == _files(tmp_path / "plain")
    for name in ("a", "b"):
        for path in (tmp_path / name).glob("*.distcp"):
            assert sizes_at_fsync[str(path)] == path.stat().st_size, path
    _assert_loads(src, tmp_path / "b")


# This kernel (6.18) accepts O_DIRECT on every file system here, tmpfs included, so a refusal is
# injected: os.open / os.pwrite raise EINVAL exactly as a FUSE or older tmpfs mount does.


def test_o_direct_refused_at_open_writes_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = os.open

    def refusing_open(path: str, flags: int, *args: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(direct.os, "open", refusing_open)
    _assert_all_buffered_and_exact(tmp_path)


def test_o_direct_refused_at_the_first_write_finishes_the_file_buffered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import fcntl

    real_pwrite = os.pwrite

    def refusing_pwrite(fd: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct.os, "pwrite", refusing_pwrite)
    _assert_all_buffered_and_exact(tmp_path)


def _assert_all_buffered_and_exact(tmp_path: Path) -> None:
    """A save where O_DIRECT is refused: both files (data, .metadata) buffered, bytes exact."""
    src = _tensors()
    _save(src, tmp_path / "plain", None)
    fs = direct.DirectFileSystem(buffer_bytes=SMALL_BUFFER)
    _save(src, tmp_path / "fallback", fs)
    fs.close()
    assert (fs.direct_bytes, fs.buffered_files) == (0, 2)
    assert _files(tmp_path / "fallback") == _files(tmp_path / "plain")


def test_a_failed_background_write_reaches_the_saver(tmp_path: Path) -> None:
    """A real I/O error (EFBIG past RLIMIT_FSIZE) in the I/O thread fails the save."""
    script = f"""
import resource, signal, torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from fsdp_worker.checkpointing import direct
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
writer = FileSystemWriter({str(tmp_path)!r}, sync_files=True, thread_count=1)
writer.fs = direct.DirectFileSystem(buffer_bytes={SMALL_BUFFER})
try:
    dcp.save({{"w": torch.zeros(1 << 20)}}, storage_writer=writer, no_dist=True)
except BaseException as exc:  # DCP raises CheckpointException, a BaseException
    print("FAILED:", exc)
else:
    print("SAVED")
"""
    env = {**os.environ, "PYTHONPATH": str(Path(direct.__file__).parents[1])}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert "FAILED:" in out.stdout and "File too large" in out.stdout, out.stdout + out.stderr
