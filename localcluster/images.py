"""The project's container images: built here with podman, loaded into a node's containerd.

``build`` makes the base image from Debian's packages (debootstrap, then ``podman import``) and
the ``pause``, ``operator`` and ``worker`` targets of the repository's ``Dockerfile`` from it,
reusing podman's layer cache and a wheelhouse under ``$FSDPOP_CACHE/wheels``. ``ensure_loaded``
imports an image into a containerd only when that containerd lacks it at the same config digest
(podman's image ID), unpacked for the snapshotter. ``export`` keeps one OCI layout under
``$FSDPOP_CACHE/images/oci`` that every node is fed from (``imagestore``): layers uncompressed,
since nothing should be gzipped only to be gunzipped again, and each blob written once.

CLI: ``python -m localcluster.images build [--target base|pause|operator|worker|all]`` and
``python -m localcluster.images load --address <containerd.sock> [--ref REF ...]``.

This module must not pull from or push to any registry, edit anything under /etc (podman reads
the ``containers.conf`` written here through ``CONTAINERS_CONF``), or touch a containerd other
than the one whose socket it is given. It knows nothing about Kubernetes; stdlib only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from localcluster import imagestore, registry

VERSION = "0.1.0"
"""The project's version (pyproject.toml's, which ``build`` checks): the images' tag."""
BASE = "localhost/fsdp-base:bookworm"
"""Debian bookworm minbase with python3.11, venv and catatonit: the Dockerfile's ``BASE`` here."""
PAUSE = "localhost/fsdp-pause:3.10"
"""The pod sandbox image (the role of registry.k8s.io/pause:3.10): catatonit -P, ~0.7 MB."""
OPERATOR = f"localhost/fsdp-operator:{VERSION}"
"""``python -m fsdp_operator run``: kopf and the Kubernetes client, no torch."""
WORKER = f"localhost/fsdp-worker:{VERSION}"
"""torchrun with torch 2.15.0 and its CUDA 13.2 wheels (~5.9 GB)."""

REPO = Path(__file__).resolve().parent.parent
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "catatonit")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# crun 1.8 refuses this machine's hybrid cgroups and raising an rlimit is not permitted here.
_CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = "runc"\n'
# Where the build sees the host's wheelhouse: /mnt exists in both bases, so no mount point
# is left behind in a layer.
_BUILD_WHEELS = "/mnt"


class Target(StrEnum):
    BASE = "base"
    PAUSE = "pause"
    OPERATOR = "operator"
    WORKER = "worker"


REFS = {Target.BASE: BASE, Target.PAUSE: PAUSE, Target.OPERATOR: OPERATOR, Target.WORKER: WORKER}
TEST_TARGETS = (Target.PAUSE, Target.OPERATOR, Target.WORKER)
"""What the local cluster's nodes, the tests, the demo and the benchmarks run."""
TEST_IMAGES = (PAUSE, OPERATOR, WORKER)
"""The references of ``TEST_TARGETS``: what every node's containerd is loaded with."""


ImageError = imagestore.ImageError  # one error type for building and loading


@dataclass(frozen=True)
class Built:
    ref: str
    image_id: str
    size: int
    """Bytes, uncompressed (podman's size)."""
    seconds: float
    changed: bool
    """False when the image ID is the one podman already held (all layers cached)."""


def cache_dir() -> Path:
    return Path(os.environ.get("FSDPOP_CACHE", Path.home() / ".cache" / "fsdp-operator"))


def _images_dir() -> Path:
    path = cache_dir() / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _run(
    argv: Sequence[str], *, log: Path | None = None, stdin: int | None = None, check: bool = True
) -> str:
    """Run ``argv`` with podman's config; stdout (or, with ``log``, all output goes there)."""
    env = {**os.environ, "CONTAINERS_CONF": str(_containers_conf())}
    if shutil.which(argv[0]) is None:
        raise ImageError(
            f"`{argv[0]}` is not installed (docs/images.md lists what the build needs)"
        )
    if log is None:
        proc = subprocess.run(argv, env=env, stdin=stdin, capture_output=True, text=True)
        output, stderr = proc.stdout, proc.stderr or proc.stdout
    else:
        with log.open("w") as out:
            proc = subprocess.run(
                argv, env=env, stdin=stdin, stdout=out, stderr=subprocess.STDOUT, text=True
            )
        output = stderr = log.read_text(errors="replace")
    if proc.returncode != 0 and check:
        where = f" (log: {log})" if log else ""
        raise imagestore.failed(argv, returncode=proc.returncode, output=stderr, where=where)
    return output


def _containers_conf() -> Path:
    path = cache_dir() / "podman" / "containers.conf"
    if not path.exists() or path.read_text() != _CONTAINERS_CONF:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_CONTAINERS_CONF)
    return path


def image_id(ref: str) -> str | None:
    """podman's ID of ``ref`` (the sha256 of its config: its digest in containerd), or None."""
    env = {**os.environ, "CONTAINERS_CONF": str(_containers_conf())}
    if subprocess.run(["podman", "image", "exists", ref], env=env).returncode != 0:
        return None
    return _run(["podman", "image", "inspect", "--format", "{{.Id}}", ref]).strip()


def python_in(ref: str, code: str) -> str:
    """What ``python -c code`` prints in a container of ``ref`` (no network): what the image
    really ships, for tests."""
    argv = ["podman", "run", "--rm", "--network", "none", "--entrypoint", "python", ref, "-c"]
    return _run([*argv, code])


def run_in(ref: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None) -> str:
    """What ``argv`` prints in a container of ``ref`` run the way a pod runs it: the image's own
    user (uid 1000), a read-only root, no network, and a ``/tmp`` that, like a pod's emptyDir
    and unlike podman's default tmpfs, may hold libraries that load (compiled kernels, a
    plugin); for tests."""
    options = ["--rm", "--network", "none", "--read-only", "--tmpfs", "/tmp:rw,exec,nosuid,nodev"]
    options += [f"--env={name}={value}" for name, value in (env or {}).items()]
    return _run(["podman", "run", *options, "--entrypoint", argv[0], ref, *argv[1:]])


def _size(ref: str) -> int:
    return int(_run(["podman", "image", "inspect", "--format", "{{.Size}}", ref]))


def _check_version() -> None:
    with (REPO / "pyproject.toml").open("rb") as f:
        version = tomllib.load(f)["project"]["version"]
    if version != VERSION:
        raise ImageError(f"pyproject.toml's version is {version}, images.VERSION is {VERSION}")


def _build_base(log: Path) -> None:
    """debootstrap Debian's minbase with ``BASE_PACKAGES`` and import it as ``BASE``."""
    packages = ",".join(BASE_PACKAGES)
    with tempfile.TemporaryDirectory(dir=_images_dir(), prefix="rootfs-") as tmp:
        root = Path(tmp) / "rootfs"
        try:
            debootstrap = ["debootstrap", "--variant=minbase", f"--include={packages}"]
            _run([*debootstrap, DEBIAN_SUITE, str(root), DEBIAN_MIRROR], log=log)
        finally:
            _unmount_under(root)
        skip = ["dev/*", "proc/*", "sys/*", "var/cache/apt/archives/*.deb", "var/lib/apt/lists/*"]
        tar_argv = ["tar", "--numeric-owner", "-C", str(root), *(f"--exclude=./{p}" for p in skip)]
        tar = subprocess.Popen([*tar_argv, "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        changes = ["--change", f"ENV PATH={_PATH}", "--change", "ENV LANG=C.UTF-8"]
        message = ["--message", f"debootstrap --variant=minbase {DEBIAN_SUITE}"]
        _run(["podman", "import", *changes, *message, "-", BASE], stdin=tar.stdout.fileno())
        tar.stdout.close()
        if tar.wait() != 0:
            raise ImageError(f"`{shlex.join(tar_argv)} -c .` exited {tar.returncode}")


def _unmount_under(root: Path) -> None:
    """Unmount what a failed debootstrap left mounted (proc, sys) before the rootfs is removed."""
    mounts = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((m for m in mounts if Path(m).is_relative_to(root)), reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)


def _host_ca_bundle() -> str:
    """The CA bundle the host's pip trusts (this machine's proxy signs PyPI's certificates)."""
    return (
        os.environ.get("PIP_CERT")
        or os.environ.get("SSL_CERT_FILE")
        or ssl.get_default_verify_paths().cafile
        or "/etc/ssl/certs/ca-certificates.crt"
    )


def _wheelhouse() -> Path:
    """Every wheel the images installed, kept on the host: a rebuild downloads none again."""
    path = cache_dir() / "wheels"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _build_target(target: Target, log: Path) -> None:
    """``podman build --target`` from the Dockerfile on ``BASE``, with PyPI through the host."""
    mounts = [
        f"--volume={_wheelhouse()}:{_BUILD_WHEELS}",
        f"--volume={_host_ca_bundle()}:/etc/ssl/certs/ca-certificates.crt:ro",
    ]
    args = [f"--build-arg=BASE={BASE}", f"--build-arg=WHEELS={_BUILD_WHEELS}"]
    # OCI, not docker: `podman save --format=oci-dir` then keeps the config byte for byte, so
    # podman's image ID is the config digest that containerd reports.
    options = ["--format=oci", "--pull=never", "--layers", "--network=host", *mounts, *args]
    selection = [f"--target={target}", f"--tag={REFS[target]}", f"--file={REPO / 'Dockerfile'}"]
    _run(["podman", "build", *options, *selection, str(REPO)], log=log)


def build(targets: Sequence[Target]) -> list[Built]:
    """Build ``targets`` and the base they need: idempotent, seconds when nothing changed."""
    _check_version()
    wanted = [Target.BASE, *(t for t in targets if t is not Target.BASE)]
    logs = cache_dir() / "images" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    built = []
    for target in wanted:
        ref, before, start = REFS[target], image_id(REFS[target]), time.monotonic()
        if target is not Target.BASE:
            _build_target(target, logs / f"{target}.log")
        elif before is None:
            _build_base(logs / "base.log")
        after = image_id(ref)
        assert after is not None
        if before is not None and before != after:  # superseded and untagged: free its layers
            _run(["podman", "image", "rm", before], check=False)
        built.append(Built(ref, after, _size(ref), time.monotonic() - start, after != before))
        print(_describe(built[-1]), file=sys.stderr, flush=True)
    return built


def _describe(image: Built) -> str:
    state = "built" if image.changed else "unchanged"
    return (
        f"{image.ref:32} {state:9} {image.image_id[:12]}  "
        f"{image.size / 1e6:9.1f} MB  {image.seconds:7.1f} s"
    )


def _layout() -> Path:
    return _images_dir() / "oci"


def export(ref: str) -> Path:
    """The OCI layout ``$FSDPOP_CACHE/images/oci``, holding ``ref`` as podman has it now.

    One layout holds every image, layers uncompressed: ``podman save`` writes no blob that is
    already there, so after a code change it writes only the small project layer. Superseded
    entries, names podman no longer holds, and the blobs only they used are removed.
    """
    want = f"sha256:{_require(ref)}"
    # Readers first: nodes loading side by side hold the lock shared while they import, and a
    # writer's lock would wait for all of them although the layout already holds `ref`.
    with imagestore.locked(_layout(), exclusive=False) as layout:
        found = imagestore.entry(layout, ref)
        if found is not None and imagestore.config_digest(layout, found) == want:
            return layout
    with imagestore.locked(_layout(), exclusive=True) as layout:
        found = imagestore.entry(layout, ref)
        if found is None or imagestore.config_digest(layout, found) != want:
            save = ["podman", "save", "--format=oci-dir", "--uncompressed", f"--output={layout}"]
            _run([*save, ref])
            imagestore.prune(layout, names=_held(layout))
            found = imagestore.entry(layout, ref)
        if found is None or imagestore.config_digest(layout, found) != want:
            raise ImageError(f"podman save left no {ref} with config {want} in {layout}")
    return layout


def _held(layout: Path) -> set[str]:
    """The names in the layout's index that podman still holds an image under."""
    names = {imagestore.name(m) for m in imagestore.read(layout / "index.json")["manifests"]}
    return {name for name in names if name and image_id(name)}


def _require(ref: str) -> str:
    ident = image_id(ref)
    if ident is None:
        raise ImageError(f"podman holds no image {ref}: run `python -m localcluster.images build`")
    return ident


DELIVERY_ENV = "FSDPLC_IMAGE_DELIVERY"
"""How images reach the nodes: ``import`` (default: only the layers a node lacks) or
``registry`` (each node pulls by digest from a registry on loopback; localcluster/registry.py
says why it is not the default)."""


def delivery() -> str:
    way = os.environ.get(DELIVERY_ENV, "import")
    if way not in ("import", "registry"):
        raise ImageError(f"{DELIVERY_ENV}={way!r}: must be import or registry")
    return way


def disk_needed(
    *, address: Path, refs: Sequence[str], namespace: str = "k8s.io", snapshotter: str = "overlayfs"
) -> int:
    """Bytes an import of ``refs`` into the containerd at ``address`` writes at its peak (0
    when it holds them all): what a cluster's start weighs against the free disk."""
    node = imagestore.Containerd(address=address, namespace=namespace, snapshotter=snapshotter)
    return sum(
        imagestore.disk_needed(node, layout=export(ref), ref=ref)
        for ref in refs
        if node.config_digest(ref) != f"sha256:{_require(ref)}"
    )


def ensure_loaded(
    *,
    address: Path,
    refs: Sequence[str],
    namespace: str = "k8s.io",
    snapshotter: str = "overlayfs",
    way: str | None = None,
) -> list[str]:
    """Make the containerd at ``address`` hold each of ``refs`` as podman builds it now.

    A ref already there at the same config digest (podman's image ID) and unpacked for
    ``snapshotter`` is left alone (four ``ctr`` calls); any other is exported (``export``) and
    delivered ``way`` (default ``delivery()``): imported, sending only the layers that
    containerd lacks, or pulled by digest from a registry on loopback. Returns the refs
    delivered. ``namespace`` ``k8s.io`` is the one the kubelet's CRI reads.
    """
    node = imagestore.Containerd(address=address, namespace=namespace, snapshotter=snapshotter)
    way = way or delivery()
    delivered = []
    served: registry.Registry | None = None
    with contextlib.ExitStack() as stack:
        for ref in refs:
            want = f"sha256:{_require(ref)}"
            if node.config_digest(ref) == want:
                continue
            start = time.monotonic()
            layout = export(ref)  # one layout holds every image
            if way == "registry":
                if served is None:
                    served = stack.enter_context(registry.Registry(layout, cache=cache_dir()))
                served.pull(node, ref)
                how = "pulled by digest from the loopback registry"
            else:
                imagestore.send(node, layout=layout, ref=ref)
                how = "imported"
            if node.config_digest(ref) != want:
                raise ImageError(f"{ref} was delivered to {address} but is not there as {want}")
            print(
                f"{ref}: {how} into {address} in {time.monotonic() - start:.1f} s",
                file=sys.stderr,
                flush=True,
            )
            delivered.append(ref)
    return delivered


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.images",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build_cmd = sub.add_parser("build", help="build images with podman (cached)")
    choices = [*(str(t) for t in Target), "all"]
    build_cmd.add_argument("--target", choices=choices, default="all")
    load = sub.add_parser("load", help="import images into a containerd unless already there")
    load.add_argument("--address", type=Path, required=True, help="containerd's socket")
    load.add_argument("--ref", action="append", help=f"default: {PAUSE} {OPERATOR} {WORKER}")
    load.add_argument("--namespace", default="k8s.io")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "build":
            build(list(Target) if args.target == "all" else [Target(args.target)])
        else:
            refs = args.ref or [PAUSE, OPERATOR, WORKER]
            ensure_loaded(address=args.address, refs=refs, namespace=args.namespace)
    except ImageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
