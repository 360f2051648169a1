"""Fault injection on the local cluster's kubelet nodes: a Python API and a command line.

Every verb acts on the real thing, so what Kubernetes and the operator see is what they would
see on a cluster:

- ``crash``: the container's processes get a signal (SIGKILL by default), after ``message`` is
  written to its termination-message file; the kubelet reports exitCode 128+signal, Error.
- ``oom``: the container's processes are made the memory cgroup's first victims and a helper
  process inside that cgroup allocates until the kernel's OOM killer fires against the
  container's real limit; containerd reports OOMKilled. A container without a limit refuses.
- ``kill-rank``: signal (default SIGKILL) the worker whose environment has ``RANK=<n>``.
- ``throttle`` / ``unthrottle``: the container's CFS quota (cgroup v1 ``cpu.cfs_quota_us``) set
  to a fraction of the CPUs it uses at full speed (given, or measured over 2 s) / back to its
  own limit: a straggler's node, slow but alive (throttle.py).
- ``freeze`` / ``thaw``: SIGSTOP / SIGCONT to every process of the pod (a hang: state T,
  deaf to SIGTERM, still killable). Not the freezer cgroup: a frozen task cannot even take
  SIGKILL, so the kubelet could never stop such a pod and it stayed Terminating for good.
- ``lose-node`` / ``restore-node``: the node's kubelet is stopped (SIGSTOP) / continued: no
  heartbeats; with a label key, the processes of its pods carrying it stop too (a power or
  network loss: frozen zombies, thawed on restore), else they keep running unreported (a
  kubelet paused: ``pause-kubelet``); on restore the kubelet reconciles with whatever the API
  server says now.
- ``cut-link`` / ``restore-link``: ``eth0`` down / up inside the pod's network namespace.
- ``evict``: the Eviction API (policy/v1), so PodDisruptionBudgets apply.

Pods are found through the API server (uid, node, container ids) and then in the nodes'
cgroup trees (``/sys/fs/cgroup/<hierarchy>/fsdplc/<node>/...``). No node logic lives here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from signal import SIGCONT, SIGSTOP
from typing import Any

from localcluster import kubeclient, nodeconf, nodes, procs, throttle

CGROUP_FS = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/var/run/netns")
# The kernel kills the task with the highest badness: rss + oom_score_adj x (limit / 1000), the
# division an integer one. A single helper holding nearly the whole limit outscored a victim at
# adj 1000 (seen in dmesg: helper 26160 pages, victim 26064, for a 96Mi limit), so the memory
# is held by eight small processes instead: none of them can outscore the victim.
OOM_HELPER = """
import os, sys, time
sys.stdin.readline()  # moved into the victim's cgroup before it allocates
kids = []
for _ in range(8):
    pid = os.fork()
    if pid == 0:
        chunks, deadline = [], time.monotonic() + 60
        while time.monotonic() < deadline and os.path.exists(f"/proc/{sys.argv[1]}"):
            chunks.append(bytearray(1 << 20))
        os._exit(0)
    kids.append(pid)
for pid in kids:
    os.waitpid(pid, 0)
"""


class FaultError(RuntimeError):
    """A fault could not be carried out (no such pod, not running, no limit, ...)."""


class Faults:
    """Faults for one cluster, found through its state directory."""

    def __init__(self, state_dir: Path | str) -> None:
        self.state_dir = Path(state_dir)
        self._kube: kubeclient.Kube | None = None

    @classmethod
    def for_cluster(cls, cluster_state_dir: Path | str) -> Faults:
        return cls(cluster_state_dir)

    @property
    def kube(self) -> kubeclient.Kube:
        if self._kube is None:
            self._kube = kubeclient.Kube(self.state_dir / "kubeconfig")
        return self._kube

    # --- finding things ------------------------------------------------------------------
    def _pod(self, namespace: str, pod: str) -> dict[str, Any]:
        found = self.kube.get_or_none(f"/api/v1/namespaces/{namespace}/pods/{pod}")
        if found is None:
            raise FaultError(f"pod {namespace}/{pod} does not exist")
        return found

    def _container_dirs(
        self, namespace: str, pod: str, *, hierarchy: str = "pids", container: str | None = None
    ) -> list[Path]:
        obj = self._pod(namespace, pod)
        pod_dir = self._pod_dir(obj, hierarchy)
        dirs = []
        for status in obj["status"].get("containerStatuses") or []:
            if container not in (None, status["name"]) or "running" not in status["state"]:
                continue
            cid = status.get("containerID", "").partition("://")[2]
            if (pod_dir / cid).is_dir():
                dirs.append(pod_dir / cid)
        if not dirs:
            raise FaultError(f"pod {namespace}/{pod} has no running container on its node")
        return dirs

    def _pod_dir(self, obj: dict[str, Any], hierarchy: str) -> Path:
        node = obj["spec"].get("nodeName")
        uid = obj["metadata"]["uid"]
        if not node:
            raise FaultError(f"pod {obj['metadata']['name']} is not bound to a node")
        base = CGROUP_FS / hierarchy / nodeconf.CGROUP_PARENT / node / "kubepods"
        for candidate in (
            base / f"pod{uid}",
            *(base / q / f"pod{uid}" for q in ("burstable", "besteffort")),
        ):
            if candidate.is_dir():
                return Path(candidate)
        raise FaultError(f"pod {obj['metadata']['name']} is not running on {node}")

    def pids(self, namespace: str, pod: str) -> list[int]:
        """Every live process of the pod's containers (for checks; not a fault)."""
        found: set[int] = set()
        for directory in self._container_dirs(namespace, pod):
            for procs_file in nodes.cgroup_files(directory, "cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(p) for p in procs_file.read_text().split())
        return sorted(found)

    def netns(self, namespace: str, pod: str) -> str | None:
        """The pod's network namespace name under /var/run/netns (for ``ip netns exec``)."""
        target = os.stat(f"/proc/{self.pids(namespace, pod)[0]}/ns/net").st_ino
        for entry in NETNS_DIR.iterdir() if NETNS_DIR.is_dir() else ():
            with contextlib.suppress(OSError):
                if entry.stat().st_ino == target:
                    return entry.name
        return None

    # --- faults --------------------------------------------------------------------------
    def crash(
        self,
        namespace: str,
        pod: str,
        *,
        signal: int = 9,
        message: str = "",
        container: str | None = None,
    ) -> None:
        """Signal every process of the container; ``message`` becomes its termination message."""
        if message:
            self._write_termination_message(namespace, pod, message, container)
        self._signal(self._container_pids(namespace, pod, container), signal)

    def _container_pids(self, namespace: str, pod: str, container: str | None) -> list[int]:
        found: set[int] = set()
        for directory in self._container_dirs(namespace, pod, container=container):
            for procs_file in nodes.cgroup_files(directory, "cgroup.procs"):
                with contextlib.suppress(OSError, ValueError):
                    found.update(int(p) for p in procs_file.read_text().split())
        return sorted(found)

    def _write_termination_message(
        self, namespace: str, pod: str, message: str, container: str | None
    ) -> None:
        pid = self._container_pids(namespace, pod, container)[0]
        obj = self._pod(namespace, pod)
        spec = next(c for c in obj["spec"]["containers"] if container in (None, c["name"]))
        path = spec.get("terminationMessagePath", "/dev/termination-log")
        # The file is the kubelet's, bind-mounted into the container: write it from inside.
        with open(f"/proc/{pid}/root{path}", "w", encoding="utf-8") as out:
            out.write(message)

    def oom(self, namespace: str, pod: str, *, container: str | None = None) -> None:
        """A real OOM kill against the container's memory limit (the container must have one).

        The victims' oom_score_adj goes to 1000 (this sandbox may raise it, not lower the
        helper's), so the kernel picks them over the helper's eight small processes; should it
        take a helper all the same, another helper goes in, up to five.
        """
        directory = self._container_dirs(namespace, pod, hierarchy="memory", container=container)[0]
        limit = int((directory / "memory.limit_in_bytes").read_text())
        if limit >= 1 << 60:
            raise FaultError(f"pod {namespace}/{pod} has no memory limit: nothing to run out of")
        victims = self._container_pids(namespace, pod, container)
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                Path(f"/proc/{pid}/oom_score_adj").write_text("1000")
        for _ in range(5):
            _allocate_in(directory, watch=victims[0])
            deadline = time.monotonic() + 3  # a killed PID 1 is a zombie until its shim reaps it
            while all(_running(pid) for pid in victims) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not all(_running(pid) for pid in victims) or not directory.is_dir():
                return
        raise FaultError(f"pod {namespace}/{pod} survived its memory limit of {limit} B")

    def kill_rank(self, namespace: str, pod: str, *, rank: int, signal: int = 9) -> list[int]:
        """Signal the worker with ``RANK=<rank>`` (torchrun's), or named ``rank-<rank>`` (the
        warm launcher's fork, whose environ is its parent's); its launcher sees a real death."""
        wanted, name = f"RANK={rank}".encode(), f"rank-{rank}"
        hits = []
        for pid in self.pids(namespace, pod):
            with contextlib.suppress(OSError):
                if wanted in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") or (
                    Path(f"/proc/{pid}/comm").read_text().strip() == name
                ):
                    hits.append(pid)
        if not hits:
            raise FaultError(f"no process with RANK={rank} in pod {namespace}/{pod}")
        self._signal(hits, signal)
        return hits

    def freeze(self, namespace: str, pod: str) -> None:
        pids = self.pids(namespace, pod)
        self._signal(pids, SIGSTOP)
        _await_state(pids, stopped=True)

    def thaw(self, namespace: str, pod: str) -> None:
        pids = self.pids(namespace, pod)
        self._signal(pids, SIGCONT)
        _await_state(pids, stopped=False)

    def throttle(
        self, namespace: str, pod: str, *, fraction: float = 0.5, cores: float | None = None
    ) -> list[dict[str, Any]]:
        """Each running container of the pod limited to `fraction` of the CPUs it uses at full
        speed (`cores`; unset: measured over 2 s): what was set, by cgroup."""
        done = []
        for cpu_dir in self._container_dirs(namespace, pod, hierarchy="cpu"):
            usage = CGROUP_FS / "cpuacct" / cpu_dir.relative_to(CGROUP_FS / "cpu")
            full = cores if cores is not None else throttle.cores_used(usage)
            try:
                limit = throttle.quota_for(fraction=fraction, cores=full)
            except ValueError as exc:
                raise FaultError(f"pod {namespace}/{pod}: {exc}") from exc
            throttle.write_limit(cpu_dir, limit)
            done.append(
                {"cgroup": str(cpu_dir), "cores": round(full, 3), "quotaUs": limit.quota_us}
            )
        return done

    def unthrottle(self, namespace: str, pod: str) -> None:
        """Each container back to the quota its own `resources.limits.cpu` gave it (or none)."""
        for container in self._pod(namespace, pod)["spec"]["containers"]:
            cpu = ((container.get("resources") or {}).get("limits") or {}).get("cpu")
            with contextlib.suppress(FaultError):  # a container not running has no quota
                for cpu_dir in self._container_dirs(
                    namespace, pod, hierarchy="cpu", container=container["name"]
                ):
                    throttle.write_limit(cpu_dir, throttle.kube_limit(cpu))

    def lose_node(self, node: str, *, freeze: str = "") -> None:
        """The node goes: its kubelet stops (no heartbeats) and, with `freeze` (a label key),
        every process of its pods carrying that label stops too, as in a power or network
        loss: their peers elsewhere then stop stepping. Without it the containers keep running
        unreported, which is a kubelet paused or restarted, not a lost node (pause_kubelet)."""
        self._kubelet_signal(node, SIGSTOP)
        if not freeze:
            return
        found = self.kube.get(
            "/api/v1/pods", labelSelector=freeze, fieldSelector=f"spec.nodeName={node}"
        )
        for pod in found.get("items") or []:
            meta = pod["metadata"]
            with contextlib.suppress(FaultError):
                self._signal(self.pids(meta["namespace"], meta["name"]), SIGSTOP)

    def restore_node(self, node: str) -> None:
        """The node is back: every stopped process of its pods continues (whether or not the
        API still has their pods), then its kubelet, which reconciles with the API server."""
        stopped = [pid for pid in self._node_pids(node) if _state(pid) == "T"]
        self._signal(stopped, SIGCONT)
        self._kubelet_signal(node, SIGCONT)

    def thaw_pods(self, node: str) -> None:
        """The lost node's frozen pods continue while its kubelet stays stopped: a node cut off
        from the cluster whose containers still reach their storage (a zombie writer). The
        API no longer has their pods, and nothing on the node stops them until restore_node."""
        self._signal([pid for pid in self._node_pids(node) if _state(pid) == "T"], SIGCONT)

    def pod_log(self, node: str, namespace: str, pod: str) -> str:
        """A pod's container logs as its node wrote them (the kubelet's podLogsDir): readable
        when the API cannot serve them (the pod deleted, the kubelet stopped)."""
        logs = self.state_dir / "nodes" / node / "pod-logs"
        found = sorted(logs.glob(f"{namespace}_{pod}_*/*/*.log")) if logs.is_dir() else []
        return "".join(path.read_text(errors="replace") for path in found)

    def pause_kubelet(self, node: str) -> None:
        """The kubelet alone stops (a restart or an upgrade that takes a while): no heartbeats,
        no Lease renewals, while the node's pods run on as ever."""
        self._kubelet_signal(node, SIGSTOP)

    def resume_kubelet(self, node: str) -> None:
        self._kubelet_signal(node, SIGCONT)

    def _node_pids(self, node: str) -> list[int]:
        base = CGROUP_FS / "pids" / nodeconf.CGROUP_PARENT / node / "kubepods"
        found: set[int] = set()
        for procs_file in nodes.cgroup_files(base, "cgroup.procs") if base.is_dir() else ():
            with contextlib.suppress(OSError, ValueError):
                found.update(int(p) for p in procs_file.read_text().split())
        return sorted(found)

    def stall_apiserver(self, seconds: float) -> None:
        """The API server answers nothing for `seconds` (SIGSTOP, then SIGCONT): every
        connection stays open and silent, as in a stall; nodes and pods run on."""
        pid = self._component("apiserver")
        os.kill(pid, SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, SIGCONT)

    def _kubelet_signal(self, node: str, signum: int) -> None:
        os.kill(self._component(f"kubelet-{node}"), signum)

    def _component(self, name: str) -> int:
        pid = procs.Registry(self.state_dir / "cluster.json").pid(name)
        if pid is None:
            raise FaultError(f"no running {name}")
        return pid

    def cut_link(self, namespace: str, pod: str) -> None:
        self._link(namespace, pod, "down")

    def restore_link(self, namespace: str, pod: str) -> None:
        self._link(namespace, pod, "up")

    def _link(self, namespace: str, pod: str, state: str) -> None:
        pid = self.pids(namespace, pod)[0]
        done = subprocess.run(
            ["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "link", "set", "eth0", state],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise FaultError(f"eth0 {state} in pod {namespace}/{pod}: {done.stderr.strip()}")

    def evict(self, namespace: str, pod: str) -> None:
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace},
        }
        try:
            self.kube.request(
                "POST", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", body=body
            )
        except kubeclient.KubeError as err:
            raise FaultError(f"evict {namespace}/{pod}: {err}") from err

    @staticmethod
    def _signal(pids: list[int], signum: int) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)


def _allocate_in(cgroup: Path, *, watch: int) -> None:
    """Run a helper in ``cgroup`` that allocates until the kernel kills something there."""
    helper = subprocess.Popen([sys.executable, "-c", OOM_HELPER, str(watch)], stdin=subprocess.PIPE)
    (cgroup / "cgroup.procs").write_text(str(helper.pid))
    assert helper.stdin is not None
    helper.stdin.write(b"go\n")
    helper.stdin.close()
    try:
        helper.wait(timeout=90)
    except subprocess.TimeoutExpired:
        helper.kill()
        helper.wait()


def _await_state(pids: list[int], *, stopped: bool, timeout: float = 5.0) -> None:
    """Return once every live process of ``pids`` is (or is no longer) stopped: a signal is
    delivered when its target next runs, not when kill() returns."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [_state(pid) for pid in pids]
        if all((s == "T") == stopped for s in states if s):
            return
        time.sleep(0.02)
    raise FaultError(f"processes {pids} did not {'stop' if stopped else 'continue'} in {timeout}s")


def _state(pid: int) -> str:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("State:"):
                return line.split()[1]
    except OSError:
        pass
    return ""


def _running(pid: int) -> bool:
    return _state(pid) not in ("", "Z", "X")


def _pod_ref(text: str) -> tuple[str, str]:
    namespace, _, name = text.rpartition("/")
    return namespace or "default", name


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m localcluster.faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=Path(".cluster"),
        help="the cluster's state dir (default ./.cluster)",
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    pod_verbs = ("crash", "oom", "freeze", "thaw", "cut-link", "restore-link", "evict", "pids")
    for verb in (*pod_verbs, "throttle", "unthrottle"):
        sub = verbs.add_parser(verb)
        sub.add_argument("pod", help="[namespace/]name")
        if verb == "crash":
            sub.add_argument("--signal", type=int, default=9)
            sub.add_argument("--message", default="")
        if verb == "throttle":
            sub.add_argument("--fraction", type=float, default=0.5, help="of the CPU it uses")
            sub.add_argument("--cores", type=float, help="CPUs at full speed (unset: measured)")
    rank = verbs.add_parser("kill-rank")
    rank.add_argument("pod", help="[namespace/]name")
    rank.add_argument("rank", type=int)
    rank.add_argument("--signal", type=int, default=9)
    lose = verbs.add_parser("lose-node")
    lose.add_argument("node")
    lose.add_argument("--freeze", default="", help="label key of the pods that go with it")
    for verb in ("restore-node", "pause-kubelet", "resume-kubelet"):
        verbs.add_parser(verb).add_argument("node")
    verbs.add_parser("stall-apiserver").add_argument("seconds", type=float)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = vars(_parser().parse_args(argv))
    faults = Faults(args.pop("state_dir"))
    verb = args.pop("verb").replace("-", "_")
    if "pod" in args:
        args["namespace"], args["pod"] = _pod_ref(args["pod"])
    try:
        positional = [args.pop(k) for k in ("namespace", "pod", "node") if k in args]
        result = getattr(faults, verb)(*positional, **args)
    except (FaultError, kubeclient.KubeError) as exc:
        print(exc, file=sys.stderr)
        return 1
    if result is not None:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
