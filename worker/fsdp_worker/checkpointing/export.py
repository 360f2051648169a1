"""The trained model in Hugging Face safetensors form, written once on success (`checkpoint.
export`), so that the result is usable without this project (`safetensors.torch.load_file`,
`transformers`' `from_pretrained` given a config, or any safetensors reader).

All ranks gather the full model state dict to rank 0's CPU memory (DCP's
`get_model_state_dict`, full_state_dict and cpu_offload: FSDP2's shards are all-gathered one
tensor at a time); rank 0 streams it as one file, `<root>/export/model.safetensors`, straight
from the tensors (no serialised copy in memory: a multipart upload on an object store), then
creates `<root>/export/COMPLETE.json` only if absent (O_EXCL on a claim, `If-None-Match: *` on
S3). The marker's presence says the file is whole; it names the file, its size, sha256, the
step and the tensor count. An export whose marker exists is not written again (a retried pod
after success). The format is written here (an 8-byte little-endian header length, a JSON
header of name -> dtype, shape, byte range, then the bytes): DCP's HuggingFaceStorageWriter
needs the `safetensors` package, which the worker does not depend on.

This module must not choose, seal or delete checkpoints; `export/` is outside every step-<N>.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import posixpath
from collections.abc import Iterator
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from fsdp_worker.checkpointing import s3
from fsdp_worker.contract import errors, objstore

log = logging.getLogger(__name__)

EXPORT_DIR = "export"
MODEL_FILE = "model.safetensors"
MARKER_FILE = "COMPLETE.json"
FORMAT = "safetensors"
# safetensors' dtype names (https://huggingface.co/docs/safetensors, "Format").
DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def header(tensors: dict[str, torch.Tensor], *, step: int) -> bytes:
    """The length-prefixed JSON header; tensors follow in name order, back to back. Padded
    with spaces to 8 bytes so that every tensor starts aligned (as safetensors' writer does)."""
    entries: dict[str, Any] = {"__metadata__": {"format": "pt", "step": str(step)}}
    at = 0
    for name in sorted(tensors):
        t = tensors[name]
        if t.dtype not in DTYPES:
            raise errors.CheckpointError(f"export: {name} has dtype {t.dtype}, not in safetensors")
        nbytes = t.numel() * t.element_size()
        entries[name] = {
            "dtype": DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [at, at + nbytes],
        }
        at += nbytes
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def pieces(tensors: dict[str, torch.Tensor], *, step: int) -> Iterator[memoryview]:
    """The file's bytes, header first, each tensor's own memory after (no copy when it is a
    contiguous CPU tensor, which the gathered state dict's are)."""
    yield memoryview(header(tensors, step=step))
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.numel():
            yield memoryview(cast(bytearray, t.reshape(-1).view(torch.uint8).numpy()))


class Stream(io.RawIOBase):
    """`pieces` as a readable file (for boto3's multipart upload), hashing what it hands out."""

    def __init__(self, parts: Iterator[memoryview]) -> None:
        super().__init__()
        self._parts, self._current = parts, memoryview(b"")
        self.sha256, self.size = hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        while not len(self._current):
            nxt = next(self._parts, None)
            if nxt is None:
                return 0
            self._current = nxt
        n = min(len(buf), len(self._current))
        buf[:n] = self._current[:n]
        self.sha256.update(self._current[:n])
        self._current, self.size = self._current[n:], self.size + n
        return n


def gather(model: nn.Module) -> dict[str, torch.Tensor]:
    """The full model state dict on rank 0's CPU (empty elsewhere); collective."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = get_model_state_dict(model, options=options)
    return {k: v for k, v in full.items() if isinstance(v, torch.Tensor)}


def export(model: nn.Module, *, root: str, step: int) -> None:
    """Write the export of `model` at `step` under `root` (rank 0), unless it exists already;
    collective. Raises errors.CheckpointError when it cannot be written."""
    tensors = gather(model)
    if not dist.is_initialized() or dist.get_rank() == 0:
        target = Remote(root) if objstore.is_uri(root) else Local(root)
        try:
            target.write(tensors, step=step)
        except Exception as exc:  # OSError, botocore's errors, a dtype safetensors lacks
            raise errors.CheckpointError(f"export to {target.where}: {exc}") from exc
    if dist.is_initialized():
        dist.barrier()  # every rank exits after the export is whole (or failed on rank 0)


def marker_doc(stream: Stream, *, step: int, count: int) -> bytes:
    doc = {
        "format": FORMAT,
        "file": MODEL_FILE,
        "bytes": stream.size,
        "sha256": stream.sha256.hexdigest(),
        "step": step,
        "tensors": count,
    }
    return json.dumps(doc, indent=1).encode() + b"\n"


class Local:
    """An export on a claim: the file written and fsynced, then the marker created O_EXCL."""

    def __init__(self, root: str) -> None:
        self.where = os.path.join(root, EXPORT_DIR)

    def write(self, tensors: dict[str, torch.Tensor], *, step: int) -> None:
        marker = os.path.join(self.where, MARKER_FILE)
        if os.path.exists(marker):
            log.info("export %s exists already: not written again", marker)
            return
        os.makedirs(self.where, exist_ok=True)
        stream = Stream(pieces(tensors, step=step))
        with open(os.path.join(self.where, MODEL_FILE), "wb") as out:
            for piece in iter(lambda: stream.read(8 * 1024 * 1024), b""):
                out.write(piece)
            out.flush()
            os.fsync(out.fileno())
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "wb") as out:
            out.write(marker_doc(stream, step=step, count=len(tensors)))
            out.flush()
            os.fsync(out.fileno())
        log.info("exported step %d: %s (%d bytes)", step, self.where, stream.size)


class Remote:
    """An export in an object store: a multipart upload, then the marker create-only."""

    def __init__(self, root: str, *, client: Any | None = None) -> None:
        self.loc = objstore.parse_root(root)
        self.where = self.loc.uri(EXPORT_DIR)
        self.s3 = client if client is not None else objstore.client()

    def key(self, name: str) -> str:
        return self.loc.key(posixpath.join(EXPORT_DIR, name))

    def write(self, tensors: dict[str, torch.Tensor], *, step: int) -> None:
        bucket, marker = self.loc.bucket, self.key(MARKER_FILE)
        if s3.S3FileSystem(self.s3).exists(f"{objstore.SCHEME}{bucket}/{marker}"):
            log.info("export %s exists already: not written again", self.where)
            return
        stream = Stream(pieces(tensors, step=step))
        self.s3.upload_fileobj(stream, bucket, self.key(MODEL_FILE), Config=s3.MULTIPART)
        body = marker_doc(stream, step=step, count=len(tensors))
        self.s3.put_object(Bucket=bucket, Key=marker, Body=body, IfNoneMatch="*")
        log.info("exported step %d: %s (%d bytes)", step, self.where, stream.size)
