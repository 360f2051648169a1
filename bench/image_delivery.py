"""How an image reaches a node's containerd: ``ctr import`` from the OCI layout, or a pull from
a registry on loopback. Decides whether the local cluster should serve images from a registry.

Per repetition, a fresh containerd (Debian's, the nodes' version) in a temporary root:

- ``first``: the image arrives at a node that holds nothing (import: ``imagestore.send``; pull:
  ``ctr images pull`` from go-containerregistry's ``crane registry serve``, whose blobs are the
  layout's own files, so nothing is copied to publish them);
- ``again``: after ``nodes.discard_layers`` (each node keeps snapshots, not layer blobs: the
  disk holds the 7 GB worker once per node), the same layers arrive under a new name: what a
  code change costs for every layer it did not touch.

Both are timed, with the layers each moved. Results in bench/results/image_delivery.json.

    PYTHONPATH=. .venv/bin/python bench/image_delivery.py [--ref localhost/fsdp-operator:0.1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from localcluster import images, imagestore, nodes

RESULTS = Path(__file__).parent / "results" / "image_delivery.json"
CRANE = "github.com/google/go-containerregistry/cmd/crane@v0.22.1"


def _crane() -> Path:
    gobin = images.cache_dir() / "ggcr-v0.22.1" / "bin"
    if not (gobin / "crane").exists():
        env = {**os.environ, "GOBIN": str(gobin), "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
        subprocess.run(["go", "install", "-trimpath", CRANE], env=env, check=True)
    return gobin / "crane"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _containerd(root: Path) -> Iterator[Path]:
    sock = root / "containerd.sock"
    config = root / "config.toml"
    config.write_text(
        f'version = 2\nroot = "{root}/root"\nstate = "{root}/state"\n'
        'disabled_plugins = ["io.containerd.grpc.v1.cri"]\n'
        f'[grpc]\n  address = "{sock}"\n'
    )
    with (root / "containerd.log").open("w") as log:
        proc = subprocess.Popen(
            ["/usr/bin/containerd", "--config", str(config)], stdout=log, stderr=log
        )
    try:
        nodes.wait_socket(sock, lambda: proc.poll() is None)
        yield sock
    finally:
        proc.terminate()
        proc.wait(30)


@contextmanager
def _registry(layout: Path, ref: str, tags: tuple[str, ...]) -> Iterator[tuple[int, Path]]:
    """crane's registry serving ``layout``'s blobs, with ``ref``'s manifest under ``tags``."""
    port, log_path = _free_port(), layout.parent / "registry-bench.log"
    argv = [str(_crane()), "registry", "serve", "--address", f"127.0.0.1:{port}"]
    with log_path.open("w") as log:
        proc = subprocess.Popen([*argv, "--disk", str(layout / "blobs")], stdout=log, stderr=log)
    try:
        descriptor = imagestore.entry(layout, ref)
        assert descriptor is not None, f"{layout} holds no {ref}"
        body = imagestore.blob(layout, descriptor["digest"]).read_bytes()
        repo = ref.split("/", 1)[1].split(":")[0]
        deadline = time.monotonic() + 30
        for tag in tags:
            while True:
                url = f"http://127.0.0.1:{port}/v2/{repo}/manifests/{tag}"
                headers = {"Content-Type": descriptor["mediaType"]}
                request = urllib.request.Request(url, data=body, method="PUT", headers=headers)
                try:
                    urllib.request.urlopen(request, timeout=5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
        yield port, log_path
    finally:
        proc.terminate()
        proc.wait(30)


def _blob_gets(log: Path) -> int:
    return sum("GET /v2/" in line and "/blobs/" in line for line in log.read_text().splitlines())


def _import(layout: Path, ref: str, root: Path) -> dict[str, Any]:
    with _containerd(root) as sock:
        node = imagestore.Containerd(address=sock, namespace="k8s.io", snapshotter="overlayfs")
        start = time.monotonic()
        first_layers = imagestore.send(node, layout=layout, ref=ref)
        first = time.monotonic() - start
        nodes.discard_layers(nodes.ctr_command(sock), ref)
        start = time.monotonic()
        again_layers = imagestore.send(node, layout=layout, ref=ref, name=f"{ref}-again")
        again = time.monotonic() - start
    return {
        "first_s": first,
        "first_layers": first_layers,
        "again_s": again,
        "again_layers": again_layers,
    }


def _pull(layout: Path, ref: str, root: Path) -> dict[str, Any]:
    tag = ref.rsplit(":", 1)[1]
    hosts = root / "hosts"
    with _registry(layout, ref, (tag, "again")) as (port, log), _containerd(root) as sock:
        (hosts / "localhost").mkdir(parents=True)
        (hosts / "localhost" / "hosts.toml").write_text(
            f'server = "http://127.0.0.1:{port}"\n[host."http://127.0.0.1:{port}"]\n'
            '  capabilities = ["pull", "resolve"]\n'
        )
        ctr = nodes.ctr_command(sock)
        pull = [*ctr, "images", "pull", "--hosts-dir", str(hosts), "--snapshotter", "overlayfs"]
        start = time.monotonic()
        subprocess.run([*pull, ref], check=True, capture_output=True)
        first, fetched = time.monotonic() - start, _blob_gets(log)
        first_layers = fetched - 1  # less the config blob
        nodes.discard_layers(ctr, ref)
        start = time.monotonic()
        subprocess.run([*pull, ref.rsplit(":", 1)[0] + ":again"], check=True, capture_output=True)
        again, again_layers = time.monotonic() - start, _blob_gets(log) - fetched
    return {
        "first_s": first,
        "first_layers": first_layers,
        "again_s": again,
        "again_layers": again_layers,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ref", default=images.OPERATOR)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    layout = images.export(args.ref)
    runs: dict[str, list[dict[str, Any]]] = {"import": [], "pull": []}
    for _ in range(args.reps):
        for way, deliver in (("import", _import), ("pull", _pull)):
            with tempfile.TemporaryDirectory(prefix="delivery-") as tmp:
                runs[way].append(deliver(layout, args.ref, Path(tmp)))
                print(way, runs[way][-1], flush=True)
                nodes.unmount_under(Path(tmp))
    descriptor = imagestore.entry(layout, args.ref)
    assert descriptor is not None
    manifest = imagestore.read(imagestore.blob(layout, descriptor["digest"]))
    summary = {
        way: {key: statistics.median(r[key] for r in rows) for key in rows[0]}
        for way, rows in runs.items()
    }
    result = {
        "ref": args.ref,
        "bytes": sum(int(layer["size"]) for layer in manifest["layers"]),
        "layers": len(manifest["layers"]),
        "containerd": subprocess.run(
            ["containerd", "--version"], capture_output=True, text=True
        ).stdout.split()[-1],
        "median": summary,
        "runs": runs,
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"ref": args.ref, "bytes": result["bytes"], "median": summary}, indent=2))


if __name__ == "__main__":
    main()
