"""What the images ship, read from inside them: the product, its own dependencies, nothing of
the test cluster."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from localcluster import images, imagestore, nodes

pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None, reason="needs podman (a container engine) to run the images"
)

_PROBE = (
    "import importlib.util, json; "
    "print(json.dumps(sorted(m for m in ('fsdp_operator', 'fsdp_worker', 'localcluster', "
    "'harness', 'kopf', 'kubernetes', 'torch') if importlib.util.find_spec(m))))"
)


def _modules(ref: str) -> set[str]:
    return set(json.loads(images.python_in(ref, _PROBE).strip().splitlines()[-1]))


def test_the_operator_image_has_the_operator_and_neither_torch_nor_the_test_cluster() -> None:
    assert _modules(images.OPERATOR) == {"fsdp_operator", "fsdp_worker", "kopf", "kubernetes"}


def test_the_worker_image_has_torch_and_no_kubernetes_client_nor_the_test_cluster() -> None:
    """Workers hold no credentials: no Kubernetes client in their image."""
    assert _modules(images.WORKER) == {"fsdp_operator", "fsdp_worker", "torch"}


def test_a_node_pulls_an_image_by_digest_from_the_loopback_registry(tmp_path: Path) -> None:
    """FSDPLC_IMAGE_DELIVERY=registry: go-containerregistry's registry serves the image layout,
    and a node's containerd (the nodes' version) pulls by manifest digest, then holds the
    image under the name the kubelet asks for, at podman's config digest; a second load moves
    nothing."""
    ref = images.PAUSE
    with nodes.scratch_containerd(tmp_path) as sock:
        assert images.ensure_loaded(address=sock, refs=[ref], way="registry") == [ref]
        node = imagestore.Containerd(address=sock, namespace="k8s.io", snapshotter="overlayfs")
        assert node.config_digest(ref) == f"sha256:{images.image_id(ref)}"
        listed = node.run("images", "ls", "-q").split()
        assert ref in listed and any(
            name.startswith("localhost/fsdp-pause@sha256:") for name in listed
        )
        assert images.ensure_loaded(address=sock, refs=[ref], way="registry") == []


def test_an_image_rebuilt_underneath_a_name_replaces_the_old_one_before_it_unpacks(
    tmp_path: Path,
) -> None:
    """A rebuilt torch layer is most of the worker's bytes: the old image under the name goes
    before the new one is imported, or each node would hold both (12 GB) at the peak."""
    old, new = images.OPERATOR, images.PAUSE  # they share no layer
    layout = images.export(old)
    images.export(new)
    entry = imagestore.entry(layout, old)
    assert entry is not None
    config = imagestore.read(imagestore.blob(layout, entry["digest"]))["config"]["digest"]
    top = imagestore.chain_id(
        imagestore.read(imagestore.blob(layout, config))["rootfs"]["diff_ids"]
    )

    class Watched(imagestore.Containerd):
        old_unpacked_at_import: list[bool] = []

        def import_tar(self, layout: Path, *, index: bytes, digests: Sequence[str]) -> None:
            self.old_unpacked_at_import.append(self.has_snapshot(top))
            super().import_tar(layout, index=index, digests=digests)

    with nodes.scratch_containerd(tmp_path) as sock:
        node = Watched(address=sock, namespace="k8s.io", snapshotter="overlayfs")
        assert imagestore.disk_needed(node, layout=layout, ref=old) > 0
        imagestore.send(node, layout=layout, ref=old, name="localhost/app:1")
        nodes.discard_layers(nodes.ctr_command(sock), "localhost/app:1")
        assert imagestore.lacking(node, layout=layout, ref=old) == []  # unpacked: nothing to send
        assert imagestore.disk_needed(node, layout=layout, ref=old) == 0

        imagestore.send(node, layout=layout, ref=new, name="localhost/app:1")
        assert node.old_unpacked_at_import == [False, False]
        assert node.config_digest("localhost/app:1") == f"sha256:{images.image_id(new)}"
        assert "localhost/app:1" + imagestore.STAGING_SUFFIX not in node.run("images", "ls", "-q")
