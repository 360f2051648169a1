"""Kubelet nodes on this machine: per node a containerd, a kubelet and a cgroup root.

``start`` brings up N nodes against a running control plane: it writes each node's files
(``nodeconf``) and its kubeadm-issued client certificate for the Node authorizer (the kubelet
signs its serving certificate itself), creates its cgroup root in every v1 hierarchy, starts its
containerd, loads the images it is asked to hold (by digest, through ``images``), starts its
kubelet, and, once the node is Ready, advertises GPU capacity the documented way (an extended
resource patched onto the node's status). One kube-proxy serves the machine. ``stop`` takes it
all down, including containers the kubelets leave running. Image stores live under the cache
(``$FSDPOP_CACHE/nodes/<name>``) so a later run finds its images already imported.

Processes are recorded in the cluster's registry (``procs``); this module never talks to the
operator and holds no fault logic.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import yaml

from localcluster import kubeadm, network, nodeconf, poll

V1_HIERARCHIES = (
    "cpu",
    "cpuacct",
    "cpuset",
    "memory",
    "devices",
    "freezer",
    "blkio",
    "pids",
    "systemd",
    "unified",
)
CGROUP_FS = Path("/sys/fs/cgroup")
GPU_RESOURCE = "nvidia.com/gpu"
# The kubelet's device-plugin registry: a constant in the kubelet, not under its --root-dir.
DEVICE_PLUGIN_SOCKET = Path("/var/lib/kubelet/device-plugins/kubelet.sock")


class NodeError(RuntimeError):
    """A node could not be started or stopped."""


def cache_root() -> Path:
    return Path(os.environ.get("FSDPOP_CACHE", Path.home() / ".cache" / "fsdp-operator"))


def layout(state_dir: Path, index: int) -> nodeconf.NodeLayout:
    name = f"node-{index}"
    return nodeconf.NodeLayout(
        name=name,
        index=index,
        state=state_dir / "nodes" / name,
        store=cache_root() / "nodes" / name,
    )


def prepare(*, node: nodeconf.NodeLayout, pki: kubeadm.Kubeadm, sandbox_image: str) -> None:
    """Every file one node needs, and its cgroup root.

    The kubelet's client certificate is kubeadm's; it signs its serving one itself (``pki/``).
    """
    for path in (node.state, node.store, node.cni_dir, node.kubelet_root, node.state / "pki"):
        path.mkdir(parents=True, exist_ok=True)
    client = f"system:node:{node.name}"
    pki.user(node.kubeconfig, client=client, groups=("system:nodes",))
    node.containerd_config.write_text(nodeconf.containerd_config(node, sandbox_image=sandbox_image))
    (node.cni_dir / "10-fsdplc.conflist").write_text(json.dumps(nodeconf.cni_config(node)))
    (node.state / "resolv.conf").write_text("")
    node.kubelet_config.write_text(
        yaml.safe_dump(nodeconf.kubelet_config(node, ca=pki.ca, dns=network.GATEWAY))
    )
    make_cgroup_root(node.cgroup_root)


def make_cgroup_root(path: str) -> None:
    """Create ``path`` in every hierarchy; cpuset children must copy their parent's sets."""
    for hierarchy in V1_HIERARCHIES:
        base = CGROUP_FS / hierarchy
        if not base.is_dir():
            continue
        current = base
        for part in path.strip("/").split("/"):
            parent, current = current, current / part
            current.mkdir(exist_ok=True)
            if hierarchy == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    if not (current / key).read_text().strip():
                        (current / key).write_text((parent / key).read_text())


def wait_socket(path: Path, alive: Callable[[], bool], *, timeout: float = 30.0) -> None:
    """Wait for containerd's socket; its exit ends the wait at once."""

    def opened() -> bool:
        if path.exists():
            return True
        if not alive():
            raise NodeError(f"containerd did not open {path}")
        return False

    try:
        poll.until(f"containerd to open {path}", opened, timeout=timeout, every=0.1)
    except poll.TimedOut as exc:
        raise NodeError(f"containerd did not open {path}") from exc


def advertise_gpus(kubectl: Callable[..., object], name: str, count: int) -> None:
    """Extended resources are patched onto node status; the kubelet then adds allocatable."""
    patch = [
        {
            "op": "add",
            "path": f"/status/capacity/{GPU_RESOURCE.replace('/', '~1')}",
            "value": str(count),
        }
    ]
    kubectl("patch", "node", name, "--subresource=status", "--type=json", "-p", json.dumps(patch))


# --- teardown --------------------------------------------------------------------------------
def cgroup_files(root: Path, name: str) -> Iterator[Path]:
    """Every `name` file under a cgroup directory. Containers' cgroups vanish while they die:
    os.walk skips a directory gone under it, where Path.rglob raised FileNotFoundError (seen
    in a teardown)."""
    for directory, _, files in os.walk(root):
        if name in files:
            yield Path(directory) / name


def _cgroup_pids(path: str) -> set[int]:
    found: set[int] = set()
    for hierarchy in ("pids", "memory", "freezer"):
        for procs in cgroup_files(CGROUP_FS / hierarchy / path.strip("/"), "cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in procs.read_text().split())
    return found


def _thaw(path: str) -> None:
    for state in cgroup_files(CGROUP_FS / "freezer" / path.strip("/"), "freezer.state"):
        with contextlib.suppress(OSError):
            state.write_text("THAWED")


def kill_containers(cgroup_root: str) -> None:
    """SIGKILL every process under a node's cgroup root (thawed first, or the kill waits)."""
    _thaw(cgroup_root)
    for _ in range(50):
        pids = _cgroup_pids(cgroup_root)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def kill_shims(socket: Path) -> None:
    """containerd's shims outlive it; find them by the address they were given."""
    needle = str(socket).encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if b"containerd-shim" in argv[0] and needle in argv:
                os.kill(int(entry.name), signal.SIGKILL)


def unmount_under(prefix: Path) -> None:
    """Lazily unmount whatever is mounted below ``prefix`` (rootfs, shm, token volumes)."""
    text = str(prefix.resolve()) + "/"
    points = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        point = line.split()[1].replace("\\040", " ")
        if point.startswith(text):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def remove_cgroup_root(path: str) -> None:
    for hierarchy in V1_HIERARCHIES:
        root = CGROUP_FS / hierarchy / path.strip("/")
        if not root.is_dir():
            continue
        for directory, _, _ in os.walk(root, topdown=False):  # the deepest first
            if directory != str(root):
                with contextlib.suppress(OSError):
                    os.rmdir(directory)
        with contextlib.suppress(OSError):
            root.rmdir()
            root.parent.rmdir()  # the shared parent, once the last node is gone


def ctr_command(socket: Path) -> list[str]:
    return ["ctr", "--address", str(socket), "--namespace", "k8s.io"]


def discard_layers(ctr: Sequence[str], ref: str) -> int:
    """Delete an unpacked image's layer blobs, keeping its manifest, config and snapshots.

    What containerd's CRI ``discard_unpacked_layers`` does for pulled images: containers start
    from the snapshots, so each node holds the 7 GB worker image once, not twice. Returns the
    bytes freed.
    """
    listed = subprocess.run(
        [*ctr, "images", "ls", f"name=={ref}"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    if len(listed) < 2:
        return 0
    manifest = json.loads(
        subprocess.run(
            [*ctr, "content", "get", listed[1].split()[2]], capture_output=True, check=True
        ).stdout
    )
    layers = [layer["digest"] for layer in manifest.get("layers", [])]
    present = subprocess.run(
        [*ctr, "content", "ls", "-q"], capture_output=True, text=True, check=True
    ).stdout.split()
    doomed = [d for d in layers if d in present]
    if doomed:
        subprocess.run([*ctr, "content", "rm", *doomed], capture_output=True, check=True)
    return sum(int(layer["size"]) for layer in manifest["layers"] if layer["digest"] in doomed)


def forget_containers(ctr: Sequence[str]) -> None:
    """Drop the dead containers from the cached store so the next run starts clean."""
    listed = subprocess.run([*ctr, "containers", "ls", "-q"], capture_output=True, text=True)
    ids = listed.stdout.split()
    if ids:
        subprocess.run([*ctr, "tasks", "rm", "-f", *ids], capture_output=True, check=False)
        subprocess.run([*ctr, "containers", "rm", *ids], capture_output=True, check=False)


def remove_state(node: nodeconf.NodeLayout) -> None:
    unmount_under(node.state)
    shutil.rmtree(node.state / "kubelet", ignore_errors=True)


@contextlib.contextmanager
def scratch_containerd(root: Path) -> Iterator[Path]:
    """A containerd of the nodes' version under ``root``, without CRI (benchmarks and image
    tests: nothing of a cluster's); yields its socket."""
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
        wait_socket(sock, lambda: proc.poll() is None)
        yield sock
    finally:
        proc.terminate()
        proc.wait(30)
        unmount_under(root)
