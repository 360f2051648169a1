"""Images served to the nodes from a registry on loopback: go-containerregistry's own
(``crane registry serve``, built from its Go module), its blobs the image layout's own files.

The other way images reach a node (``FSDPLC_IMAGE_DELIVERY=registry``; the default is
``imagestore.send``, an import of only the layers a node lacks). Each node's containerd pulls by
manifest digest, as a real node pulls from a cluster's registry, and the image is then named
as the kubelet asks for it. Not the default, measured (bench/results/image_delivery.json,
``bench/image_delivery.py``): a node keeps snapshots, not layer blobs (``nodes.discard_layers``,
what CRI's ``discard_unpacked_layers`` does), and containerd 1.6 fetches every blob of an image
again to pull it under a new digest, so a code change costs all 6 GB of the worker per node
instead of its project layer (operator image, median of 3: again, pull 1.75 s and 6 layers vs
import 0.13 s and none; first delivery about the same, 14.5 s vs 13.3 s).

Stdlib only; it knows nothing about Kubernetes and pulls into no containerd but the one whose
socket it is given.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from types import TracebackType

from localcluster import imagestore, poll

CRANE_MODULE = "github.com/google/go-containerregistry/cmd/crane"
CRANE_VERSION = "v0.22.1"
HOST = "localhost"
"""The registry host the project's image names carry (``localhost/fsdp-worker:0.1.0``)."""


def crane(cache: Path) -> Path:
    """crane, built from its Go module into ``cache`` on first use (about a minute)."""
    gobin = cache / f"ggcr-{CRANE_VERSION}" / "bin"
    if not (gobin / "crane").exists():
        env = {**os.environ, "GOBIN": str(gobin), "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
        argv = [
            "go",
            "install",
            "-trimpath",
            "-ldflags",
            "-s -w",
            f"{CRANE_MODULE}@{CRANE_VERSION}",
        ]
        done = subprocess.run(argv, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise imagestore.failed(argv, returncode=done.returncode, output=done.stderr)
    return gobin / "crane"


class Registry:
    """A registry on 127.0.0.1 serving ``layout``'s blobs in place; ``publish`` adds a manifest.

    Use as a context manager: the server stops at the end.
    """

    def __init__(self, layout: Path, *, cache: Path) -> None:
        self.layout = layout
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self._dir = Path(tempfile.mkdtemp(prefix="fsdplc-registry-"))
        self.log = self._dir / "registry.log"
        argv = [
            str(crane(cache)),
            "registry",
            "serve",
            "--address",
            f"127.0.0.1:{self.port}",
            "--disk",
            str(layout / "blobs"),
        ]
        with self.log.open("w") as log:
            self._proc = subprocess.Popen(argv, stdout=log, stderr=log)
        hosts = self._dir / "hosts" / HOST
        hosts.mkdir(parents=True)
        server = f"http://127.0.0.1:{self.port}"
        (hosts / "hosts.toml").write_text(
            f'server = "{server}"\n[host."{server}"]\n  capabilities = ["pull", "resolve"]\n'
        )

    def __enter__(self) -> Registry:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()

    def publish(self, ref: str, *, timeout: float = 30.0) -> str:
        """Serve ``ref``'s manifest from the layout; returns ``<host>/<repo>@<digest>``."""
        descriptor = imagestore.entry(self.layout, ref)
        if descriptor is None:
            raise imagestore.ImageError(f"the image layout {self.layout} holds no {ref}")
        repo = ref.split("/", 1)[1].rsplit(":", 1)[0]
        digest = descriptor["digest"]
        body = imagestore.blob(self.layout, digest).read_bytes()
        url = f"http://127.0.0.1:{self.port}/v2/{repo}/manifests/{digest}"
        headers = {"Content-Type": descriptor["mediaType"]}
        put = urllib.request.Request(url, data=body, method="PUT", headers=headers)  # noqa: S310
        last: OSError | None = None

        def taken() -> bool:  # the server binds a moment after it starts
            nonlocal last
            try:
                urllib.request.urlopen(put, timeout=5).close()  # noqa: S310 (http, loopback)
                return True
            except OSError as err:
                last = err
                if self._proc.poll() is not None:
                    raise self._refused(ref, err) from err
                return False

        try:
            poll.until(f"the registry to take {ref}", taken, timeout=timeout, every=0.2)
        except poll.TimedOut as exc:
            raise self._refused(ref, last) from exc
        return f"{HOST}/{repo}@{digest}"

    def _refused(self, ref: str, err: OSError | None) -> imagestore.ImageError:
        return imagestore.ImageError(
            f"registry on 127.0.0.1:{self.port} took no manifest for {ref}: {err};"
            f" its log: {self.log.read_text()[-2000:]}"
        )

    def pull(self, node: imagestore.Containerd, ref: str) -> None:
        """``node`` pulls ``ref`` by its manifest digest and names it ``ref``."""
        pinned = self.publish(ref)
        hosts = str(self._dir / "hosts")
        node.run("images", "pull", "--hosts-dir", hosts, "--snapshotter", node.snapshotter, pinned)
        node.run("images", "tag", "--force", pinned, ref)

    def blob_gets(self) -> int:
        """Blobs the registry has served (layers and configs), from its log."""
        lines = self.log.read_text().splitlines()
        return sum("GET /v2/" in line and "/blobs/" in line for line in lines)
