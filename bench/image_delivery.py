"""How an image reaches a node's containerd: ``ctr import`` from the OCI layout, or a pull from
a registry on loopback. Decides whether the local cluster should serve images from a registry.

Per repetition, a fresh containerd (Debian's, the nodes' version) in a temporary root:

- ``first``: the image arrives at a node that holds nothing (import: ``imagestore.send``; pull:
  ``localcluster.registry``, by digest from go-containerregistry's ``crane registry serve``,
  whose blobs are the layout's own files, so nothing is copied to publish them);
- ``again``: after ``nodes.discard_layers`` (each node keeps snapshots, not layer blobs: the
  disk holds the 7 GB worker once per node), the same layers arrive under a new name: what a
  code change costs for every layer it did not touch.

Both are timed, with the layers each moved. Results in bench/results/image_delivery.json.

    PYTHONPATH=. .venv/bin/python bench/image_delivery.py [--ref localhost/fsdp-operator:0.1.0]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from localcluster import images, imagestore, nodes, registry

RESULTS = Path(__file__).parent / "results" / "image_delivery.json"


def _import(layout: Path, ref: str, root: Path) -> dict[str, Any]:
    with nodes.scratch_containerd(root) as sock:
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
    """localcluster.registry's way: a pull by digest; again after a rebuild, as a new image."""
    with (
        registry.Registry(layout, cache=images.cache_dir()) as served,
        nodes.scratch_containerd(root) as sock,
    ):
        node = imagestore.Containerd(address=sock, namespace="k8s.io", snapshotter="overlayfs")
        start = time.monotonic()
        served.pull(node, ref)
        first, fetched = time.monotonic() - start, served.blob_gets()
        first_layers = fetched - 1  # less the config blob
        nodes.discard_layers(nodes.ctr_command(sock), ref)
        node.run("images", "rm", ref)
        for line in node.run("images", "ls", "-q").splitlines():
            node.run("images", "rm", line)  # the pinned name too: the next pull is a new image
        start = time.monotonic()
        served.pull(node, ref)
        again, again_layers = time.monotonic() - start, served.blob_gets() - fetched
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
