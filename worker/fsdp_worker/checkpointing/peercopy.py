"""Peer copies of the memory tier: each node's memory step is also held by the next node.

A memory step lives on its node's memory volume only, so a lost node (a spare's pod taking its
place, or any new pod) took its ranks' state with it and the whole gang loaded the claim. With
`checkpoint.memory.peerCopy` (on by default; it needs a gang of two nodes or more), every rank,
once its own files of a memory save are written, sends them to the same local rank of the next
node in a ring (node n's to node n+1 mod N) over the checkpoint process group (gloo, on CPU),
which keeps them in the step's `copy-<rank>` directory, sealed with the step. When a restart
in place finds a rank without the gang's step, the rank holding its copy sends the files back
and the rank loads its own bytes: as exact as a resume from its own memory. A lost node is
covered, or several when no two are neighbours in the ring; otherwise the claim is loaded.

Wire: an 8-byte length, a JSON header (file names and sizes), then the files' bytes, moved as
uint8 tensors. Nothing is unpickled; a name must be a plain file name.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import torch
import torch.distributed as dist

COPY_PREFIX = "copy-"
_LENGTH = struct.Struct(">Q")
_MAX_HEADER = 1 << 20


def ring(rank: int, world_size: int, local_world_size: int) -> tuple[int, int]:
    """(the rank this one's copy goes to, the rank whose copy this one holds): the same local
    rank of the next node and of the previous one."""
    return (rank + local_world_size) % world_size, (rank - local_world_size) % world_size


def holder(rank: int, world_size: int, local_world_size: int) -> int:
    """The rank that holds `rank`'s copy."""
    return ring(rank, world_size, local_world_size)[0]


def copy_dir(step_dir: str, rank: int) -> str:
    return os.path.join(step_dir, f"{COPY_PREFIX}{rank}")


def pack(directory: str) -> bytearray:
    """Every file of `directory` (no subdirectories) as one blob."""
    names = sorted(e.name for e in os.scandir(directory) if e.is_file())
    sizes = [os.path.getsize(os.path.join(directory, n)) for n in names]
    header = json.dumps({"files": [[n, s] for n, s in zip(names, sizes, strict=True)]}).encode()
    blob = bytearray(_LENGTH.pack(len(header)) + header)
    for name in names:
        with open(os.path.join(directory, name), "rb") as fh:
            blob += fh.read()
    return blob


def unpack(blob: bytes, directory: str) -> dict[str, int]:
    """Write `pack`'s blob into `directory` (replaced); its files and sizes. ValueError says
    what did not match (a truncated blob, a name that is not a plain file name)."""
    if len(blob) < _LENGTH.size:
        raise ValueError(f"a peer copy of {len(blob)} bytes has no header")
    (length,) = _LENGTH.unpack_from(blob)
    if length > min(_MAX_HEADER, len(blob) - _LENGTH.size):
        raise ValueError(f"a peer copy's header says {length} bytes; the blob has {len(blob)}")
    doc = json.loads(bytes(blob[_LENGTH.size : _LENGTH.size + length]))
    files: dict[str, int] = {}
    for entry in doc.get("files", []):
        name, size = entry
        if not isinstance(name, str) or not isinstance(size, int) or size < 0:
            raise ValueError(f"a peer copy's file entry {entry!r} is not [name, size]")
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"a peer copy's file name {name!r} is not a plain file name")
        files[name] = size
    body = _LENGTH.size + length
    if body + sum(files.values()) != len(blob):
        raise ValueError(
            f"a peer copy's files add up to {sum(files.values())} bytes; it carries "
            f"{len(blob) - body}"
        )
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    view = memoryview(blob)
    for name, size in files.items():
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(view[body : body + size])
        body += size
    return files


def swap(
    outgoing: dict[int, bytearray], incoming: list[int], group: dist.ProcessGroup
) -> dict[int, bytes]:
    """Send each blob of `outgoing` to its rank and receive one from each rank of `incoming`,
    all at once (a ring, where every rank sends and receives, cannot deadlock); collective
    among the ranks named on both sides."""
    sizes = {src: torch.zeros(1, dtype=torch.int64) for src in incoming}
    _wait(
        [
            dist.isend(torch.tensor([len(b)], dtype=torch.int64), dst, group)
            for dst, b in outgoing.items()
        ]
        + [dist.irecv(t, src, group) for src, t in sizes.items()]
    )
    received = {src: torch.empty(int(t[0]), dtype=torch.uint8) for src, t in sizes.items()}
    _wait(
        [
            dist.isend(torch.frombuffer(b, dtype=torch.uint8), dst, group)
            for dst, b in outgoing.items()
            if b
        ]
        + [dist.irecv(t, src, group) for src, t in received.items() if t.numel()]
    )
    return {src: t.numpy().tobytes() for src, t in received.items()}


def _wait(works: list[dist.Work | None]) -> None:
    for work in works:
        if work is not None:
            work.wait()


def fits(
    own_bytes: int, *, local_world_size: int, limit: int | None, group: dist.ProcessGroup
) -> bool:
    """Collective: whether a node's volume holds its ranks' own files and their copies of the
    previous node's, twice (the sealed step and the one being written), for the largest rank;
    the same answer on every rank."""
    largest = torch.tensor([own_bytes], dtype=torch.int64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return limit is None or 4 * local_world_size * int(largest[0]) <= limit
