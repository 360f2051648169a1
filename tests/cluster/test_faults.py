"""Each fault verb does what the real failure would do, as the operator would observe it."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from localcluster import poll
from localcluster.controlplane import Cluster
from localcluster.faults import FaultError, Faults
from tests.cluster._podkit import (
    alive,
    apply,
    get_pod,
    process_state,
    python_pod,
    running,
    terminated,
    wait_phase,
)

pytestmark = pytest.mark.cluster

SLEEPER = "import time\nwhile True: time.sleep(0.2)"
SERVER = (
    "import socket\ns = socket.create_server(('0.0.0.0', 9000))\n"
    "while True:\n    c, _ = s.accept(); c.sendall(b'up'); c.close()\n"
)


@pytest.fixture
def faults(cluster: Cluster) -> Faults:
    return Faults.for_cluster(cluster.state_dir)


def _started(
    cluster: Cluster, namespace: str, name: str, code: str = SLEEPER, *, memory: str | None = None
) -> None:
    pod = python_pod(name, code)
    if memory:
        pod["spec"]["containers"][0]["resources"] = {"limits": {"memory": memory}}
    apply(cluster, namespace, pod)
    running(cluster, namespace, name)


def test_crash_signals_the_container_and_keeps_the_message(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    _started(cluster, kube_namespace, "crashy")
    faults.crash(kube_namespace, "crashy", signal=9, message="rank 3 exploded")
    pod = wait_phase(cluster, kube_namespace, "crashy", ("Failed",))
    assert terminated(pod)["exitCode"] == 137, "the kubelet reports 128 + SIGKILL"
    assert terminated(pod)["reason"] == "Error"
    assert terminated(pod)["message"] == "rank 3 exploded"


def test_oom_is_the_kernel_enforcing_the_real_limit(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    _started(cluster, kube_namespace, "hungry", memory="96Mi")
    pids = faults.pids(kube_namespace, "hungry")
    faults.oom(kube_namespace, "hungry")
    pod = wait_phase(cluster, kube_namespace, "hungry", ("Failed",))
    assert terminated(pod)["exitCode"] == 137
    assert terminated(pod)["reason"] == "OOMKilled"
    assert not any(alive(p) for p in pids)


def test_oom_needs_a_limit(cluster: Cluster, kube_namespace: str, faults: Faults) -> None:
    _started(cluster, kube_namespace, "unbounded")
    with pytest.raises(FaultError, match="has no memory limit"):
        faults.oom(kube_namespace, "unbounded")


def test_freeze_stops_every_process_and_thaw_resumes(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    forking = (
        "import subprocess, sys\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
    )
    _started(cluster, kube_namespace, "stuck", forking + SLEEPER)
    pids = poll.until(
        "parent and child",
        lambda: len(found := faults.pids(kube_namespace, "stuck")) == 2 and found,
    )
    faults.freeze(kube_namespace, "stuck")
    assert [process_state(p) for p in pids] == ["T", "T"], "every process of the pod stopped"
    pod = get_pod(cluster, kube_namespace, "stuck")
    assert pod is not None and pod["status"]["phase"] == "Running", "a hang looks healthy"
    faults.thaw(kube_namespace, "stuck")
    assert all(process_state(p) in ("S", "R") for p in pids)


def test_evict_goes_through_the_eviction_api(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    _started(cluster, kube_namespace, "evictee")
    faults.evict(kube_namespace, "evictee")

    def evicted() -> bool:
        pod = get_pod(cluster, kube_namespace, "evictee")
        if pod is None:
            return True
        kinds = {c["type"] for c in pod["status"].get("conditions", [])}
        return "DisruptionTarget" in kinds

    poll.until("pod evicted", evicted, timeout=60)
    poll.until("pod gone", lambda: get_pod(cluster, kube_namespace, "evictee") is None)


def test_cut_link_makes_the_pod_unreachable_until_restored(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    _started(cluster, kube_namespace, "island", SERVER)
    pod = get_pod(cluster, kube_namespace, "island")
    assert pod is not None
    ip = pod["status"]["podIP"]

    def reachable() -> bool:
        try:
            with socket.create_connection((ip, 9000), timeout=1) as conn:
                return conn.recv(4) == b"up"
        except OSError:
            return False

    poll.until("reachable before the cut", reachable, timeout=20)
    faults.cut_link(kube_namespace, "island")
    assert not reachable()
    faults.restore_link(kube_namespace, "island")
    poll.until("reachable after restore", reachable, timeout=20)


def test_unknown_pod_is_a_clear_error(kube_namespace: str, faults: Faults) -> None:
    with pytest.raises(FaultError, match="does not exist"):
        faults.freeze(kube_namespace, "nobody")


def test_kill_rank_signals_only_that_worker(
    cluster: Cluster, kube_namespace: str, faults: Faults
) -> None:
    launcher = (
        "import os, subprocess, sys\n"
        "sleep = [sys.executable, '-c', 'import time; time.sleep(600)']\n"
        "kids = [subprocess.Popen(sleep, env={**os.environ, 'RANK': str(r)}) for r in (0, 1)]\n"
        "code = kids[1].wait()\n"
        "open('/dev/termination-log', 'w').write(f'rank 1 exited {code}')\n"
        "sys.exit(1)\n"
    )
    _started(cluster, kube_namespace, "gang", launcher)
    poll.until("launcher + 2 ranks", lambda: len(faults.pids(kube_namespace, "gang")) == 3)
    killed = faults.kill_rank(kube_namespace, "gang", rank=1)
    assert len(killed) == 1
    pod = wait_phase(cluster, kube_namespace, "gang", ("Failed",))
    assert terminated(pod)["exitCode"] == 1
    assert terminated(pod)["message"] == "rank 1 exited -9"


def test_command_line(cluster: Cluster, kube_namespace: str) -> None:
    _started(cluster, kube_namespace, "cli")
    base = [sys.executable, "-m", "localcluster.faults", "--state-dir", str(cluster.state_dir)]
    subprocess.run([*base, "crash", f"{kube_namespace}/cli", "--signal", "9"], check=True)
    pod = wait_phase(cluster, kube_namespace, "cli", ("Failed",))
    assert terminated(pod)["exitCode"] == 137
    missing = subprocess.run(
        [*base, "oom", f"{kube_namespace}/nobody"], capture_output=True, text=True
    )
    assert missing.returncode == 1
    assert "does not exist" in missing.stderr
