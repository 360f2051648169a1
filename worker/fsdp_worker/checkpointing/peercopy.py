"""Peer copies of the memory tier: each node's memory step is also held by the next node.

A memory step lives on its node's memory volume only, so a lost node (a spare's pod taking its
place, or any new pod) took its ranks' state with it and the whole gang loaded the claim. With
`checkpoint.memory.peerCopy` (on by default; it needs a gang of two nodes or more), every rank,
once a memory save is sealed, sends its files in the background to the same local rank of the
next node in a ring (node n's to node n+1 mod N) over a gloo process group of their own,
which keeps them as `copy-<rank>/step-<N>` with a seal of their own (memtier.py). When a restart
in place finds a rank without the gang's step, the rank holding its copy sends the files back
and the rank loads its own bytes: as exact as a resume from its own memory. A lost node is
covered, or several when no two are neighbours in the ring; otherwise the claim is loaded.

Wire: an 8-byte length, a JSON header (file names and sizes), then the files' bytes, in one
uint8 tensor read straight from the files and written straight from the buffer received.
Nothing is unpickled; a name must be a plain file name.
"""

from __future__ import annotations

import json
import os
import shutil
import struct

import torch
import torch.distributed as dist

COPY_PREFIX = "copy-"
SHARES_HELD = 5
"""A rank's shares of state on its node's volume at most, with copies: its two newest sealed
steps and the one being written, the newest copy it keeps and the one arriving."""
_LENGTH = struct.Struct(">Q")
_MAX_HEADER = 1 << 20


def ring(rank: int, world_size: int, local_world_size: int) -> tuple[int, int]:
    """(the rank this one's copy goes to, the rank whose copy this one holds): the same local
    rank of the next node and of the previous one."""
    return (rank + local_world_size) % world_size, (rank - local_world_size) % world_size


def holder(rank: int, world_size: int, local_world_size: int) -> int:
    """The rank that holds `rank`'s copy."""
    return ring(rank, world_size, local_world_size)[0]


def pack(directory: str) -> torch.Tensor:
    """Every file of `directory` (no subdirectories) as one uint8 tensor, each file read once
    straight into it (no intermediate copies: a rank's share is often GiBs)."""
    names = sorted(e.name for e in os.scandir(directory) if e.is_file())
    sizes = [os.path.getsize(os.path.join(directory, n)) for n in names]
    header = json.dumps({"files": [[n, s] for n, s in zip(names, sizes, strict=True)]}).encode()
    body = _LENGTH.size + len(header)
    blob = torch.empty(body + sum(sizes), dtype=torch.uint8)
    view = blob.numpy().data  # writable, over the tensor's memory
    view[:body] = _LENGTH.pack(len(header)) + header
    for name, size in zip(names, sizes, strict=True):
        with open(os.path.join(directory, name), "rb", buffering=0) as fh:
            done = 0
            while done < size:
                got = fh.readinto(view[body + done : body + size])
                if not got:
                    raise OSError(f"{name} shrank while it was copied ({done} of {size} bytes)")
                done += got
        body += size
    return blob


def unpack(blob: torch.Tensor | bytes, directory: str) -> dict[str, int]:
    """Write `pack`'s blob into `directory` (replaced); its files and sizes. ValueError says
    what did not match (a truncated blob, a name that is not a plain file name)."""
    view = (blob.numpy().data if isinstance(blob, torch.Tensor) else memoryview(blob)).cast("B")
    if len(view) < _LENGTH.size:
        raise ValueError(f"a peer copy of {len(view)} bytes has no header")
    (length,) = _LENGTH.unpack_from(view)
    if length > min(_MAX_HEADER, len(view) - _LENGTH.size):
        raise ValueError(f"a peer copy's header says {length} bytes; the blob has {len(view)}")
    doc = json.loads(bytes(view[_LENGTH.size : _LENGTH.size + length]))
    files: dict[str, int] = {}
    for entry in doc.get("files", []):
        name, size = entry
        if not isinstance(name, str) or not isinstance(size, int) or size < 0:
            raise ValueError(f"a peer copy's file entry {entry!r} is not [name, size]")
        if os.path.basename(name) != name or name in ("", ".", ".."):
            raise ValueError(f"a peer copy's file name {name!r} is not a plain file name")
        files[name] = size
    body = _LENGTH.size + length
    if body + sum(files.values()) != len(view):
        raise ValueError(
            f"a peer copy's files add up to {sum(files.values())} bytes; it carries "
            f"{len(view) - body}"
        )
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    for name, size in files.items():
        with open(os.path.join(directory, name), "wb") as fh:
            fh.write(view[body : body + size])
        body += size
    return files


def swap(
    outgoing: dict[int, torch.Tensor], incoming: list[int], group: dist.ProcessGroup
) -> dict[int, torch.Tensor]:
    """Send each blob of `outgoing` to its rank and receive one from each rank of `incoming`,
    all at once (a ring, where every rank sends and receives, cannot deadlock); collective
    among the ranks named on both sides."""
    sizes = {src: torch.zeros(1, dtype=torch.int64) for src in incoming}
    lengths = {dst: torch.tensor([b.numel()], dtype=torch.int64) for dst, b in outgoing.items()}
    _wait(
        [dist.isend(t, dst, group) for dst, t in lengths.items()]
        + [dist.irecv(t, src, group) for src, t in sizes.items()]
    )
    received = {src: torch.empty(int(t[0]), dtype=torch.uint8) for src, t in sizes.items()}
    _wait(
        [dist.isend(b, dst, group) for dst, b in outgoing.items() if b.numel()]
        + [dist.irecv(t, src, group) for src, t in received.items() if t.numel()]
    )
    return received


def _wait(works: list[dist.Work | None]) -> None:
    for work in works:
        if work is not None:
            work.wait()


def fits(
    own_bytes: int, *, local_world_size: int, limit: int | None, group: dist.ProcessGroup
) -> bool:
    """Collective: whether a node's volume holds, for the largest rank, SHARES_HELD shares
    per local rank; the same answer on every rank."""
    largest = torch.tensor([own_bytes], dtype=torch.int64)
    dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=group)
    return limit is None or SHARES_HELD * local_world_size * int(largest[0]) <= limit
