"""A containerd's image store, seen through ``ctr``, and the OCI layout that feeds it.

The layout (one directory, uncompressed layers, one ``index.json`` entry per image name) is
what ``images.export`` fills with ``podman save``. ``Containerd.config_digest`` tells which
config digest a containerd holds an image name at, if unpacked; ``send`` imports one image from
the layout as a tar stream that carries only the layers that containerd lacks, so a code
change moves the small project layer, not the 7 GB torch one.

This module must not run podman, pull from a registry, or talk to any containerd but the one
whose socket it is given. Stdlib only; it knows nothing about Kubernetes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

REF_NAME = "org.opencontainers.image.ref.name"
"""The index annotation podman writes: the image's full name."""
IMAGE_NAME = "io.containerd.image.name"
"""The index annotation ``ctr images import`` takes as the image's exact name."""


STAGING_SUFFIX = "-incoming"
"""What ``send`` appends to an image's name while it unpacks (the old image keeps the name)."""


class ImageError(RuntimeError):
    """A build or load step failed; the message names the command and its output's tail."""


def tail(text: str, lines: int = 20) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def failed(argv: Sequence[str], *, returncode: int, output: str, where: str = "") -> ImageError:
    return ImageError(f"`{shlex.join(argv)}` exited {returncode}{where}:\n{tail(output)}")


@contextlib.contextmanager
def locked(layout: Path, *, exclusive: bool) -> Iterator[Path]:
    """Hold ``layout``'s lock: writers (podman save, pruning) alone, readers together."""
    layout.parent.mkdir(parents=True, exist_ok=True)
    with layout.with_name(layout.name + ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield layout


def blob(layout: Path, digest: str) -> Path:
    return layout / "blobs" / digest.replace(":", "/", 1)


def read(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(path.read_bytes())
    return document


def name(descriptor: dict[str, Any]) -> str | None:
    value: str | None = descriptor.get("annotations", {}).get(REF_NAME)
    return value


def entry(layout: Path, ref: str) -> dict[str, Any] | None:
    """``ref``'s manifest descriptor in the layout's index, the newest if several."""
    if not (layout / "index.json").exists():
        return None
    named = [m for m in read(layout / "index.json")["manifests"] if name(m) == ref]
    return named[-1] if named else None


def config_digest(layout: Path, descriptor: dict[str, Any]) -> str:
    digest: str = read(blob(layout, descriptor["digest"]))["config"]["digest"]
    return digest


def prune(layout: Path, *, names: Collection[str]) -> None:
    """Keep the newest index entry of each of ``names``, and the blobs the kept ones use.

    An older entry of a name goes once a newer one is saved, not before: until the worker is
    saved again, its old entry keeps the torch layer that the new one will share.
    """
    entries = {}
    for descriptor in read(layout / "index.json")["manifests"]:
        ref = name(descriptor)
        if ref in names:
            entries[ref] = descriptor
    partial = layout / "index.json.partial"
    partial.write_text(json.dumps({"schemaVersion": 2, "manifests": list(entries.values())}))
    partial.replace(layout / "index.json")
    keep = set()
    for descriptor in entries.values():
        manifest = read(blob(layout, descriptor["digest"]))
        layers = [layer["digest"] for layer in manifest["layers"]]
        keep |= {descriptor["digest"], manifest["config"]["digest"], *layers}
    for path in (layout / "blobs" / "sha256").iterdir():
        if f"sha256:{path.name}" not in keep:
            path.unlink()


def chain_id(diff_ids: Sequence[str]) -> str:
    """The snapshot key of an image's top layer: the OCI image spec's ChainID of its layers."""
    chain = diff_ids[0]
    for diff in diff_ids[1:]:
        chain = "sha256:" + hashlib.sha256(f"{chain} {diff}".encode()).hexdigest()
    return chain


class Containerd:
    """``ctr`` against one containerd socket, namespace and snapshotter."""

    def __init__(self, *, address: Path, namespace: str, snapshotter: str) -> None:
        self.address = address
        self.base = ["ctr", f"--address={address}", f"--namespace={namespace}"]
        self.snapshotter = snapshotter

    def _ctr(self, *args: str, check: bool = True) -> str | None:
        argv = [*self.base, *args]
        if shutil.which("ctr") is None:
            raise ImageError("`ctr` is not installed (Debian: apt-get install containerd)")
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            if not check:
                return None
            raise failed(argv, returncode=proc.returncode, output=proc.stderr or proc.stdout)
        return proc.stdout

    def run(self, *args: str) -> str:
        """``ctr <args>`` here; ImageError naming the command when it fails."""
        return self._ctr(*args) or ""

    def _json(self, digest: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self._ctr("content", "get", digest) or "{}")
        return document

    def config_digest(self, ref: str) -> str | None:
        """The config digest of ``ref`` here if it is held and unpacked, else None."""
        for line in (self._ctr("images", "ls", f"name=={ref}") or "").splitlines()[1:]:
            fields = line.split()
            if fields and fields[0] == ref:
                return self._unpacked_config(fields[2])
        return None

    def _unpacked_config(self, manifest_digest: str) -> str | None:
        manifest = self._json(manifest_digest)
        if "manifests" in manifest:  # an index (a docker-archive import): one platform, ours
            manifest = self._json(manifest["manifests"][0]["digest"])
        config = manifest["config"]["digest"]
        top = chain_id(self._json(config)["rootfs"]["diff_ids"])
        return str(config) if self.has_snapshot(top) else None

    def has_snapshot(self, key: str) -> bool:
        info = ("snapshots", f"--snapshotter={self.snapshotter}", "info", key)
        return self._ctr(*info, check=False) is not None

    def rename(self, source: str, target: str) -> None:
        """Move the name `target` to the image `source` names, then drop `source`."""
        self._ctr("images", "tag", "--force", source, target)
        self._ctr("images", "rm", source)

    def remove(self, ref: str) -> None:
        """Drop ``ref`` (and a staging copy of it) and wait for the garbage collector to
        remove the snapshots and blobs only they used."""
        for name in (ref, f"{ref}{STAGING_SUFFIX}"):
            self._ctr("images", "rm", "--sync", name, check=False)

    def held(self) -> set[str]:
        """The digests of every blob in this namespace's content store."""
        return set((self._ctr("content", "ls", "--quiet") or "").split())

    def import_tar(self, layout: Path, *, index: bytes, digests: Sequence[str]) -> None:
        """``ctr images import`` of a tar of ``index`` and ``digests``' blobs from ``layout``."""
        argv = [*self.base, "images", "import", f"--snapshotter={self.snapshotter}", "-"]
        with tempfile.TemporaryFile() as out:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out, stderr=out)
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):  # ctr exited early: its output says why
                _write_tar(proc.stdin, layout=layout, index=index, digests=digests)
                proc.stdin.close()
            if proc.wait() != 0:
                out.seek(0)
                raise failed(
                    argv, returncode=proc.returncode, output=out.read().decode(errors="replace")
                )


def _write_tar(sink: IO[bytes], *, layout: Path, index: bytes, digests: Sequence[str]) -> None:
    """A tar of ``oci-layout``, ``index`` and the blobs, the blobs copied by the kernel.

    tarfile's own copy costs ~27 s of CPU per 7 GB here; ``os.sendfile`` costs almost none.
    """
    for member, data in (
        ("oci-layout", (layout / "oci-layout").read_bytes()),
        ("index.json", index),
    ):
        sink.write(_header(member, len(data)) + data + _padding(len(data)))
    for digest in digests:
        path = blob(layout, digest)
        size = path.stat().st_size
        sink.write(_header("blobs/" + digest.replace(":", "/", 1), size))
        sink.flush()
        with path.open("rb") as source:
            offset = 0
            while offset < size:
                offset += os.sendfile(sink.fileno(), source.fileno(), offset, size - offset)
        sink.write(_padding(size))
    sink.write(b"\0" * 2 * tarfile.BLOCKSIZE)
    sink.flush()


def _header(member: str, size: int) -> bytes:
    info = tarfile.TarInfo(member)
    info.size, info.mode = size, 0o644
    return info.tobuf(format=tarfile.PAX_FORMAT)


def _padding(size: int) -> bytes:
    return b"\0" * (-size % tarfile.BLOCKSIZE)


def _layers(layout: Path, descriptor: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    manifest = read(blob(layout, descriptor["digest"]))
    diff_ids = read(blob(layout, manifest["config"]["digest"]))["rootfs"]["diff_ids"]
    return manifest["layers"], diff_ids


def lacking(node: Containerd, *, layout: Path, ref: str) -> list[dict[str, Any]]:
    """The layer descriptors of ``ref`` that ``node`` holds neither as a blob nor unpacked."""
    descriptor = entry(layout, ref)
    if descriptor is None:
        raise ImageError(f"{layout} holds no image named {ref}")
    layers, diff_ids = _layers(layout, descriptor)
    held = node.held()
    return [
        layer
        for i, layer in enumerate(layers)
        # A node keeps a layer's snapshot and may drop its blob (nodes.discard_layers).
        if layer["digest"] not in held and not node.has_snapshot(chain_id(diff_ids[: i + 1]))
    ]


def disk_needed(node: Containerd, *, layout: Path, ref: str) -> int:
    """Bytes ``send`` will write at its peak on ``node``'s disk: each lacking layer's blob and
    its unpacked snapshot (the layout's layers are uncompressed, so about its size again)."""
    missing = lacking(node, layout=layout, ref=ref)
    descriptor = entry(layout, ref)
    assert descriptor is not None  # lacking() raised otherwise
    layers, _ = _layers(layout, descriptor)
    if _rebuilt(missing, layers):
        missing = [layer for layer in layers if layer["digest"] not in node.held()]
    return 2 * sum(int(layer["size"]) for layer in missing)


def _rebuilt(missing: Sequence[dict[str, Any]], layers: Sequence[dict[str, Any]]) -> bool:
    """Whether most of an image's bytes are new to a node (its base or torch layer rebuilt),
    not just its project layer."""
    return 2 * sum(int(m["size"]) for m in missing) > sum(int(layer["size"]) for layer in layers)


def send(node: Containerd, *, layout: Path, ref: str, name: str | None = None) -> int:
    """Import ``ref`` from ``layout`` (as ``name``, ``ref`` by default): its manifest, its
    config and the layers ``node`` lacks. Returns how many layers were sent.

    A layer left out is one the containerd already holds; unpacking finds it there, or finds
    its snapshot and needs no blob at all. When most of the image is new (a rebuilt torch
    layer), the old image under that name is removed first and every layer sent: kept until
    the new one is unpacked, its snapshots would hold the worker's 6 GB twice on each node.
    """
    with locked(layout, exclusive=False):
        descriptor = entry(layout, ref)
        if descriptor is None:
            raise ImageError(f"{layout} holds no image named {ref}")
        manifest = read(blob(layout, descriptor["digest"]))
        target = name or ref
        missing = lacking(node, layout=layout, ref=ref)
        if _rebuilt(missing, manifest["layers"]):
            node.remove(target)
            held = node.held()
            missing = [layer for layer in manifest["layers"] if layer["digest"] not in held]
        digests = [descriptor["digest"], manifest["config"]["digest"]]
        digests += [layer["digest"] for layer in missing]
        # Unpacked under a staging name first: imported under `target` straight away, the old
        # image under that name would lose it before the new one is unpacked, and containerd's
        # garbage collector could remove a shared layer's snapshot whose blob was left out
        # (seen: "failed to extract layer ...: content digest ... not found"). The old image
        # pins those snapshots until the name moves.
        staging = f"{target}{STAGING_SUFFIX}"
        named = {**descriptor, "annotations": {IMAGE_NAME: staging, REF_NAME: staging}}
        index = json.dumps({"schemaVersion": 2, "manifests": [named]}).encode()
        node.import_tar(layout, index=index, digests=digests)
        node.rename(staging, target)
        return len(digests) - 2
