"""What the images ship, read from inside them: the product, its own dependencies, nothing of
the test cluster."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


RDMA_LIBRARIES = ("libibverbs.so.1", "libmlx5.so.1", "librdmacm.so.1")
"""rdma-core's user-space half: what NCCL's InfiniBand/RoCE transport dlopens (libibverbs, and
libmlx5 for ConnectX's direct verbs) and RoCE's address resolution (librdmacm)."""

_VERBS_PROBE = f"""
import ctypes, json, os
libc = ctypes.CDLL(None)
libc.dlvsym.restype = ctypes.c_void_p
handles = {{name: ctypes.CDLL(name)._handle for name in {RDMA_LIBRARIES!r}}}
verbs = ctypes.c_void_p(handles["libibverbs.so.1"])
wanted = [("ibv_get_device_list", "IBVERBS_1.1"), ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
          ("ibv_reg_dmabuf_mr", "IBVERBS_1.12")]
found = {{f"{{s}}@{{v}}": bool(libc.dlvsym(verbs, s.encode(), v.encode())) for s, v in wanted}}
print(json.dumps({{"uid": os.getuid(), "symbols": found}}))
"""


def test_the_worker_image_has_rdma_core_for_nccl_over_infiniband() -> None:
    """Without libibverbs NCCL runs over sockets even on an InfiniBand fabric (`Using network
    Socket` at NCCL_DEBUG=INFO): the libraries are in the loader's cache, load as uid 1000 on
    a read-only root as in a pod, and have the versioned symbols NCCL looks up (dma-buf memory
    registration, for GPUDirect RDMA, needs IBVERBS_1.12)."""
    cache = images.run_in(images.WORKER, ["ldconfig", "-p"])
    resolved = {line.split()[0] for line in cache.splitlines() if "=>" in line}
    assert set(RDMA_LIBRARIES) <= resolved, sorted(resolved)
    loaded = json.loads(images.run_in(images.WORKER, ["python", "-c", _VERBS_PROBE]))
    assert loaded["uid"] == 1000
    assert all(loaded["symbols"].values()), loaded["symbols"]


_PLUGIN_SEARCH = """
import ctypes, json, os
found = {}
for name in ("libnccl-net.so", "libnccl-net-ofi.so"):
    try:
        found[name] = bool(ctypes.CDLL(name))
    except OSError:
        found[name] = False
env = {name: os.environ.get(name) for name in ("NCCL_NET_PLUGIN", "LD_LIBRARY_PATH")}
maps = open("/proc/self/maps").read()
print(json.dumps({"found": found, "env": env, "from_layer": "/tmp/ofi/lib/" in maps}))
"""
_PLUGIN_PROBE = f"""
import os, shutil, subprocess, sys
# A layer's lib directory, made before the process that searches it starts (the loader reads
# LD_LIBRARY_PATH once); any loadable library stands in for aws-ofi-nccl's.
os.makedirs("/tmp/ofi/lib")
shutil.copy("/lib/x86_64-linux-gnu/libz.so.1", "/tmp/ofi/lib/libnccl-net-ofi.so")
subprocess.run([sys.executable, "-c", {_PLUGIN_SEARCH!r}], check=True)
"""


def _plugin_search(env: dict[str, str]) -> dict[str, Any]:
    printed = images.run_in(images.WORKER, ["python", "-c", _PLUGIN_PROBE], env=env)
    result: dict[str, Any] = json.loads(printed)
    return result


def test_nccl_finds_a_net_plugin_only_where_an_image_layer_puts_one() -> None:
    """NCCL dlopens `libnccl-net.so`, or `libnccl-net-<NCCL_NET_PLUGIN>.so`, through the
    loader's own search (libnccl.so.2 has no RPATH): LD_LIBRARY_PATH, then the ldconfig cache.
    The image ships no plugin and sets neither variable, so NCCL uses its own IB transport; an
    EFA layer's aws-ofi-nccl (docs/install.md) is found once its directory is on that search."""
    bare = _plugin_search({})
    assert bare["env"] == {"NCCL_NET_PLUGIN": None, "LD_LIBRARY_PATH": None}
    assert bare["found"] == {"libnccl-net.so": False, "libnccl-net-ofi.so": False}
    layered = _plugin_search({"LD_LIBRARY_PATH": "/tmp/ofi/lib", "NCCL_NET_PLUGIN": "ofi"})
    assert layered["found"] == {"libnccl-net.so": False, "libnccl-net-ofi.so": True}
    assert layered["from_layer"]
